"""The application side of kernel sessions: which thread context a process publishes, and what its sessions mean.

User space of the thread-context feature (the kernel side is bpf/appctx.bpf.h, its map writes kernel/tracer.py):
thread_ctx finds where a process keeps `otel_thread_ctx_v1` (through elf_dynsym, one `.dynsym` lookup as ld.so
does it), process_context reads its OTEP 4719 process context, and watch.AppWatcher, the one entry point the
runtime calls, answers the kernel side's questions about processes (those just exec'd on exec_watch's schedule)
and annotates their sessions, whose user stacks stacks.py symbolizes off the capture loop while they wait, in
order. It reads processes through process_readers.AppSources, which imports the readers at their first use: a
run that meets no publishing process never loads them.
"""
