"""The only code that makes bpf() and perf_event_open() calls or loads libbpf.

bpfsys.py issues the raw system calls; libbpf.py (with libbpf_progs.py, libbpf_btf.py and
libbpf_ringbuf.py) binds libbpf, loaded on first use so that commands which never trace run
without it. tracer.py runs a capture on top of them, features.py probes what the kernel allows and
caps.py names this process's capabilities. Other packages read /proc, /sys and tracefs files, but
reach BPF and perf only through here.
"""
