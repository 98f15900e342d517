"""The kernel-facing layer: the only code that makes bpf() and perf_event_open() calls or loads libbpf.

bpfsys.py issues the raw system calls; libbpf.py (with libbpf_progs.py, libbpf_btf.py and
libbpf_ringbuf.py, over the C declarations of libbpf_abi.py) binds libbpf, loaded on first use so
that commands which never trace run without it. tracer.py runs a capture on top of them, its BPF object
set up by capture_config.py (what the kernel side records, written into the object before load),
features.py probes what the kernel allows, caps.py names this process's capabilities, tracefs.py
reads which functions ftrace can attach to and lbr.py which branch types perf records. Other
packages read /proc and /sys files, but reach BPF and perf only through here.
"""
