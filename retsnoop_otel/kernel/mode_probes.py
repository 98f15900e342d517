"""What the attach modes' probes share (each mode's own probe is in its module, kernel/modes/): the harmless
functions they attach to, the Feature they return, and the probes of two modes alike (the fprobe-based links, the
fsession kinds). A probe loads a tiny program of its mode, links it to a harmless function and undoes both, so that
a mode is offered only where the kernel really runs it; a refusal says what is missing and since which Linux
release. Part of features.py's report (features.detect() runs them side by side).
"""

import errno as _errno
import os
from collections.abc import Callable
from typing import NamedTuple

from retsnoop_otel.capture.errnos import errno_name
from retsnoop_otel.kernel import bpfsys
from retsnoop_otel.kernel.libbpf_btf import BTF_KIND_FUNC, BTF_KIND_PTR, Btf

# Functions that are safe to attach to for a moment: the first is only ever called by
# BPF_PROG_TEST_RUN, the others are syscall paths common enough to exist on every kernel.
PROBE_TARGETS = ("bpf_fentry_test1", "do_sys_openat2", "__x64_sys_getpid", "__arm64_sys_getpid")

HELPER_GET_ATTACH_COOKIE = 174
HELPER_GET_FUNC_RET = 184
ENOTSUPP = 524  # kernel-internal "operation not supported", leaks out of BPF trampolines


class Feature(NamedTuple):
    """One probed capability; `why` completes "this kernel ..." when it is unavailable."""

    name: str
    available: bool
    detail: str
    errno: int = 0
    why: str = ""


def ename(err: int) -> str:
    return errno_name(err) or f"errno {err}"


def refused(name: str, err: int, meaning: str, what: str) -> Feature:
    """An unavailable feature whose probe the kernel answered with `err`."""
    return Feature(name, False, f"refused ({ename(err)}): {meaning}", err, f"{what} ({ename(err)})")


FuncIdLookup = Callable[[str], "int | None"]


def target_func(btf: Btf | FuncIdLookup | None) -> tuple[str, int]:
    """First PROBE_TARGETS function present in kernel BTF, with its BTF id (0 without BTF).

    `btf` is libbpf's kernel BTF, or a name -> BTF id lookup (symbols.btf_index, faster to search)."""
    if btf is not None:
        for name in PROBE_TARGETS:
            tid = btf.find(name, BTF_KIND_FUNC) if isinstance(btf, Btf) else btf(name)
            if tid:
                return name, tid
    return PROBE_TARGETS[0], 0


SESSION_KFUNC = "bpf_session_is_return"
# bpf/compat.bpf.h declares both prototypes the kernel has had; libbpf binds the one that matches its BTF
SESSION_PROTOTYPES = {(): ("bpf_session_is_return(void)", "Linux 6.10 to 6.19"),
                      (BTF_KIND_PTR,): ("bpf_session_is_return(void *ctx)", "Linux 7.0+")}


def probe_session_kfunc(btf: Btf | None) -> Feature:
    """Which of our two declarations of the session kfunc the kernel's own prototype binds (kprobe.session and
    fsession programs call it); read from the kernel's BTF, the only place that says."""
    name = "session_kfunc"
    if btf is None:
        return Feature(name, False, "needs kernel BTF to read the prototype of " + SESSION_KFUNC, _errno.ENOENT,
                       f"has no BTF to read {SESSION_KFUNC} from")
    fid = btf.find(SESSION_KFUNC, BTF_KIND_FUNC)
    if fid is None:
        return Feature(name, False, f"the kernel has no {SESSION_KFUNC} kfunc (Linux 6.10+ needed)", _errno.ENOENT,
                       f"has no {SESSION_KFUNC} kfunc (Linux 6.10+ needed)")
    params = tuple(btf.type_by_id(t).kind for t in btf.param_types(btf.type_by_id(fid).size_or_type))
    known = SESSION_PROTOTYPES.get(params)
    if known is None:
        return Feature(name, False, f"the kernel's {SESSION_KFUNC} takes {len(params)} parameter(s), a prototype "
                       "this build does not declare: kprobe.session and fsession programs cannot load",
                       _errno.EINVAL, f"has a {SESSION_KFUNC} prototype this build does not know")
    proto, since = known
    return Feature(name, True, f"{proto} bound (the {since} prototype)")


def close_fds(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def fexit_as_traced() -> bytes:
    """A fexit program that does what ours need of the kernel: the return value and the link's cookie."""
    b = bpfsys
    return b''.join((b.mov64_reg(6, 1),
                     b.st_mem_w(10, -8, 0), b.st_mem_w(10, -4, 0),
                     b.mov64_reg(1, 6), b.mov64_reg(2, 10), b.add64_imm(2, -8), b.call(HELPER_GET_FUNC_RET),
                     b.mov64_reg(1, 6), b.call(HELPER_GET_ATTACH_COOKIE),
                     b.RETURN_ZERO))


def probe_fprobe_link(name: str, what: str, attach_type: int, prog_name: bytes, btf: Btf | FuncIdLookup | None,
                       too_old: tuple[str, str], called: str) -> Feature:
    """Load a kprobe program for `attach_type` and link it to one function (both fprobe-based links);
    `called` names the mode in the one-line refusals ("this kernel has no ...")."""
    func, _ = target_func(btf)
    prog = link = -1
    try:
        prog = bpfsys.prog_load(bpfsys.PROG_KPROBE, bpfsys.RETURN_ZERO, expected_attach_type=attach_type,
                                name=prog_name)
        link = bpfsys.link_create_kprobe_multi(prog, [func], attach_type=attach_type)
    except OSError as exc:
        err = exc.errno or _errno.EINVAL
        if err == _errno.EINVAL:
            # older kernels reject the program or the link: the version says it all
            return Feature(name, False, f"refused ({ename(err)}): {too_old[0]}", err, too_old[1])
        if err == _errno.EOPNOTSUPP:
            return Feature(name, False, "not supported (EOPNOTSUPP): the kernel was built without CONFIG_FPROBE",
                           err, f"has no {called} (CONFIG_FPROBE is off)")
        stage = f"loading a {what} program" if prog < 0 else f"attaching {what} to {func}"
        return refused(name, err, f"{stage} failed: {os.strerror(err)}", f"refuses {called} links")
    finally:
        close_fds(link, prog)
    return Feature(name, True, f"{what} link attached to {func}")


def probe_fsession_kind(name: str, called: str, since: str, btf: Btf | FuncIdLookup | None, multi: bool,
                        attach_type: int | None = None) -> Feature:
    """Load a program that does what ours need of the kernel (the return value and the link's cookie) as fsession,
    or as fsession.multi (loaded without a target, then linked to the function by its BTF id in a tracing_multi
    link; `attach_type` another kind of those, fexit.multi), link it with a cookie, and undo both; `called` names the
    mode in the one-line refusals."""
    func, tid = target_func(btf)
    if not tid:
        return Feature(name, False, "needs kernel BTF to name the attach target", _errno.ENOENT,
                       f"has no BTF for {called} programs")
    if attach_type is None:
        attach_type = bpfsys.ATTACH_TRACE_FSESSION_MULTI if multi else bpfsys.ATTACH_TRACE_FSESSION
    prog = link = -1
    try:
        prog = bpfsys.prog_load(bpfsys.PROG_TRACING, fexit_as_traced(), expected_attach_type=attach_type,
                                attach_btf_id=0 if multi else tid,
                                name=b"rs_probe_fsmult" if multi else b"rs_probe_fsess")
        link = bpfsys.link_create_tracing_multi(prog, [tid], [1], attach_type) if multi else \
            bpfsys.link_create(prog, attach_type, cookie=1)
    except OSError as exc:
        err = exc.errno or _errno.EINVAL
        stage = "loading" if prog < 0 else "linking"
        if err == _errno.EINVAL:  # older kernels know neither the attach type nor (multi) a program without target
            return Feature(name, False, f"refused (EINVAL): the kernel does not know {called} programs ({since}+ "
                           "needed)", err, f"has no {called} ({since}+ needed)")
        if err in (ENOTSUPP, _errno.EOPNOTSUPP):
            meaning = f"this kernel's BPF JIT or ftrace cannot run {called} programs ({stage})"
        elif err in (_errno.EPERM, _errno.EACCES):
            meaning = (f"the kernel denies {stage} BPF tracing programs to this process (kernel lockdown, "
                       "an LSM policy, or missing CAP_BPF/CAP_PERFMON)")
        else:
            meaning = f"{stage} a {called} program for {func} failed: {os.strerror(err)}"
        return refused(name, err, meaning, f"refuses {called} programs")
    finally:
        close_fds(link, prog)
    return Feature(name, True, f"{called} program (return value and cookie) loaded and linked to {func}")
