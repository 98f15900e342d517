"""fentry mode (-F): a fentry and a fexit program per function, each a clone of a template retargeted at the
function's BTF id (kernel/clones.py) and linked with the function's id as its cookie. Linux 5.19+ (cookies)."""

from __future__ import annotations

import errno as _errno
import os
from types import MappingProxyType

from retsnoop_otel.kernel import bpfsys
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.mode_probes import (
    ENOTSUPP,
    Feature,
    FuncIdLookup,
    close_fds,
    ename,
    fexit_as_traced,
    refused,
    target_func,
)
from retsnoop_otel.kernel.modes.cloned import ClonedMode


def probe_fentry(btf: Btf | FuncIdLookup | None) -> Feature:
    """Load and attach a fentry program (BPF trampoline) on a harmless function, then a fexit program that reads
    the return value and its link's cookie (fentry mode needs both: Linux 5.19+); detach."""
    name = "fentry"
    func, tid = target_func(btf)
    if not tid:
        return Feature(name, False, "needs kernel BTF to name the attach target", _errno.ENOENT,
                       "has no BTF for fentry/fexit programs")
    prog = link = -1
    cookies = False
    try:
        prog = bpfsys.prog_load(bpfsys.PROG_TRACING, bpfsys.RETURN_ZERO,
                                expected_attach_type=bpfsys.ATTACH_TRACE_FENTRY, attach_btf_id=tid,
                                name=b"rs_probe_fentry")
        link = bpfsys.link_create(prog, bpfsys.ATTACH_TRACE_FENTRY)
        close_fds(link, prog)
        prog = link = -1
        cookies = True
        prog = bpfsys.prog_load(bpfsys.PROG_TRACING, fexit_as_traced(),
                                expected_attach_type=bpfsys.ATTACH_TRACE_FEXIT, attach_btf_id=tid,
                                name=b"rs_probe_fexit")
        link = bpfsys.link_create(prog, bpfsys.ATTACH_TRACE_FEXIT, cookie=1)
    except OSError as exc:
        err = exc.errno or _errno.EINVAL
        stage = "loading" if prog < 0 else "attaching"
        if err == _errno.EINVAL and (cookies or prog >= 0):  # 5.10 loads fentry but links it only through
            # BPF_RAW_TRACEPOINT_OPEN, without cookies
            return Feature(name, False, f"refused ({ename(err)}): fentry programs load, but {stage} fentry/fexit "
                           "links with BPF cookies and bpf_get_func_ret() fails (Linux 5.19+ needed)", err,
                           "has no BPF cookies for fentry/fexit (Linux 5.19+ needed)")
        if err in (_errno.EPERM, _errno.EACCES):
            meaning = (f"the kernel denies {stage} BPF tracing programs to this process (kernel lockdown, "
                       "an LSM policy, or missing CAP_BPF/CAP_PERFMON)")
        elif err in (ENOTSUPP, _errno.EOPNOTSUPP):
            meaning = f"no BPF trampoline support for {func} on this kernel/architecture ({stage})"
        else:
            meaning = f"{stage} a fentry program on {func} failed: {os.strerror(err)}"
        return refused(name, err, meaning, "refuses fentry/fexit programs")
    finally:
        close_fds(link, prog)
    return Feature(name, True, f"fentry and fexit programs (with cookies) loaded and attached to {func}")


class Fentry(ClonedMode):
    name = "fentry"
    flags = ("-F", "--fentries")
    help = "attach with fentry/fexit"
    shown = "-F (fentry/fexit)"
    feature = "fentry"
    programs = ("fentry_entry", "fexit_exit", "fentry_inner", "fexit_inner")
    position, auto_rank, offer_rank, basic = 0, 3, 4, True
    # is_entry -> the templates cloned for a function, exit first: entry functions run the first pair, the others
    # the smaller "inner" one (bpf/flavours.bpf.h)
    clone_sets = MappingProxyType({True: ("fexit_exit", "fentry_entry"), False: ("fexit_inner", "fentry_inner")})
    verified = "a program pair"

    def probe(self, root: str, btf: Btf | FuncIdLookup | None, config: dict[str, str]) -> Feature:
        return probe_fentry(btf)


MODE = Fentry()
