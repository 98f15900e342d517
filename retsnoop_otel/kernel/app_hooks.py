"""The kernel side's hooks for the thread-context watcher (bpf/appctx.bpf.h, records for appctx/watch.py): a
process's exec, and its creation of an OTEL_CTX process context. Loaded and attached only for probe sets that
read thread context.

The exec hook is a raw tracepoint (every kernel from 5.10 on, and allowed where tracing programs are not); it
is required. The publish hooks are syscall tracepoints (CONFIG_FTRACE_SYSCALLS, and tracefs to find them):
without them the watcher still finds a process from its exec by its timed checks, later, so a hook that does
not attach is named in the attach report instead of refusing the run.
"""

from __future__ import annotations

from retsnoop_otel.kernel import libbpf as lb

EXEC_PROGRAM = "app_exec"  # on sched_process_exec
PUBLISH_PROGRAMS = {"app_publish": ("syscalls", "sys_enter_memfd_create"),  # memfd_create("OTEL_CTX", ...)
                    "app_publish_vma": ("syscalls", "sys_enter_prctl")}  # prctl(PR_SET_VMA, ..., "OTEL_CTX")
PROGRAMS = (EXEC_PROGRAM, *PUBLISH_PROGRAMS)


def configure(obj: lb.BpfObject, app_context: bool) -> None:
    """Before load: the hooks' programs are loaded only when the probe set reads thread context."""
    for name in PROGRAMS:
        obj.program(name).set_autoload(app_context)


def attach(obj: lb.BpfObject, links: list[lb.Link]) -> list[str]:
    """Attach the hooks, appending their links; returns the publish hooks that did not attach, with why."""
    links.append(obj.program(EXEC_PROGRAM).attach_raw_tracepoint("sched_process_exec"))
    missing = []
    for name, (category, event) in PUBLISH_PROGRAMS.items():
        try:
            links.append(obj.program(name).attach_tracepoint(category, event))
        except lb.LibbpfError as exc:
            missing.append(f"tracepoint {category}:{event} ({str(exc).splitlines()[0]})")
    return missing


def programs(obj: lb.BpfObject, links: list[lb.Link]) -> list[tuple[str, int]]:
    """(name, fd) of the hooks' programs while attached, for their run counts and times."""
    return [(name, obj.program(name).fd) for name in PROGRAMS] if links else []


def detach(links: list[lb.Link]) -> list[lb.Link]:
    """Destroys the links; returns the empty list the caller keeps."""
    for link in reversed(links):
        link.destroy()
    return []
