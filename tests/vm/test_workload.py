"""What real kernels (5.10 to the newest) answer to every simfail case, and what `features` finds there.

Guest side: tests/vm/scenarios/workload.py. The errnos follow the kernels' code: map attribute
checks (array_map_alloc_check, stack_map_alloc, ringbuf_map_alloc) answer EINVAL, the percpu value
size check E2BIG, NULL user pointers EFAULT, a kprobe on a missing symbol ENOENT, and the x86
trampoline of 6.1 refuses a fentry on an 8-argument function with ENOTSUPP (524), which 6.12 accepts.
"""

from __future__ import annotations

import errno

import pytest

from retsnoop_otel import simfail

pytestmark = [pytest.mark.vm, pytest.mark.kernels("all")]

ENOTSUPP = 524
FAILING = {  # case -> (system call that fails, errno), identical on every kernel
    "bpf-bad-map-type": (simfail.S_CREATE, errno.EINVAL),
    "bpf-bad-map-create-flags": (simfail.S_CREATE, errno.EINVAL),
    "bpf-bad-map-key-size-array": (simfail.S_CREATE, errno.EINVAL),
    "bpf-bad-map-key-size-stackmap": (simfail.S_CREATE, errno.EINVAL),
    "bpf-bad-map-key-size-ringbuf": (simfail.S_CREATE, errno.EINVAL),
    "bpf-bad-map-val-size-percpu-array": (simfail.S_CREATE, errno.E2BIG),
    "bpf-bad-map-max-entries-array": (simfail.S_CREATE, errno.EINVAL),
    "bpf-bad-map-max-entries-ringbuf": (simfail.S_CREATE, errno.EINVAL),
    "bpf-bad-map-lookup-key": (simfail.S_LOOKUP, errno.EFAULT),
    "bpf-bad-map-lookup-value": (simfail.S_LOOKUP, errno.EFAULT),
    "bpf-kprobe-bad-kfunc": (simfail.S_KPROBE, errno.ENOENT),
}
SUCCEEDING = ("bpf-simple-obj", "bpf-good-map-array", "syscall-long-sleep")


def _result(batch, name: str) -> dict:
    res = batch["simfail_cases"]
    assert name in res["results"], f"no result for {name}; simfail rc {res['rc']}: {res['stderr']}"
    return res["results"][name]


@pytest.mark.parametrize("name", sorted(FAILING))
def test_failing_case_errno(vm_batch, name: str) -> None:
    result = _result(vm_batch, name)
    step, err = FAILING[name]
    assert (result["step"], result["errno"]) == (step, err), result["message"]
    assert result["as_designed"]
    assert result["message"] == f"{name}: {step} failed as expected: -{errno.errorcode[err]}"


@pytest.mark.parametrize("name", SUCCEEDING)
def test_success_case(vm_batch, name: str) -> None:
    result = _result(vm_batch, name)
    assert result["as_designed"] and result["errno"] == 0 and "succeeded as expected" in result["message"]


def test_fentry_unsupp_func_fails_at_attach_on_61(vm_batch_61) -> None:
    result = _result(vm_batch_61, "bpf-fentry-unsupp-func")
    assert (result["step"], result["errno"], result["as_designed"]) == (simfail.S_LINK, ENOTSUPP, True)
    assert result["message"].endswith("bpf(BPF_LINK_CREATE) failed as expected: -ENOTSUPP")
    alone = vm_batch_61["simfail_cases"]["alone"]["bpf-fentry-unsupp-func"]
    assert alone["rc"] == 0
    # Every case behaved as designed on 6.1, so the run of all cases exits 0 there (and 1 on 6.12).
    assert vm_batch_61["simfail_cases"]["rc"] == 0


def test_fentry_unsupp_func_attaches_on_612(vm_batch_612) -> None:
    """6.12's x86 trampoline takes 12 arguments: retsnoop's case no longer fails, and simfail says so."""
    result = _result(vm_batch_612, "bpf-fentry-unsupp-func")
    assert not result["as_designed"] and "bpf(BPF_LINK_CREATE) unexpectedly succeeded" in result["message"]
    alone = vm_batch_612["simfail_cases"]["alone"]["bpf-fentry-unsupp-func"]
    assert alone["rc"] == 1 and "unexpectedly succeeded" in alone["out"]
    assert vm_batch_612["simfail_cases"]["rc"] == 1


def test_repeat_unknown_and_cleanup(vm_batch) -> None:
    res = vm_batch["simfail_cases"]
    repeat = res["alone"]["bpf-bad-map-max-entries-array"]
    assert repeat["rc"] == 0
    assert repeat["out"].splitlines() == [
        "bpf-bad-map-max-entries-array: bpf(BPF_MAP_CREATE) failed as expected: -EINVAL",
        "bpf-bad-map-max-entries-array: 3/3 runs behaved as designed"]
    unknown = res["alone"]["no-such-case"]
    assert unknown["rc"] == 2 and "unknown case 'no-such-case'" in unknown["err"]
    assert res["progs_left"] == []


def test_features_common(vm_batch) -> None:
    res = vm_batch["features"]
    assert res["rc"] == 0 and res["text_rc"] == 0, res["stderr"] + res["text_stderr"]
    feats = res["json"]["features"]
    assert res["json"]["kernel_release"] == vm_batch.release
    since = {"fentry": (5, 19), "func_ip": (5, 15), "bpf_cookie": (5, 15)}  # the others: every kernel we run
    for name in ("btf", "fentry", "kprobes", "ringbuf", "func_ip", "bpf_cookie", "filter_functions", "kallsyms",
                 "capabilities"):
        assert feats[name]["available"] == vm_batch.at_least(*since.get(name, (0, 0))), (name, feats[name])
    if feats["fentry"]["available"]:
        assert feats["fentry"]["detail"] == ("fentry and fexit programs (with cookies) loaded and attached to "
                                             "bpf_fentry_test1")
    else:
        assert feats["fentry"]["why"] == "has no BPF cookies for fentry/fexit (Linux 5.19+ needed)"
    # the kfunc prototype our weak declarations bind, read from the kernel's BTF (changed in 7.0)
    session = feats["session_kfunc"]
    if vm_batch.at_least(7, 0):
        assert session["detail"] == "bpf_session_is_return(void *ctx) bound (the Linux 7.0+ prototype)", session
    elif vm_batch.at_least(6, 10):
        assert session["detail"] == "bpf_session_is_return(void) bound (the Linux 6.10 to 6.19 prototype)", session
    else:
        assert not session["available"] and session["why"] == ("has no bpf_session_is_return kfunc (Linux 6.10+ "
                                                               "needed)"), session
    assert not feats["lbr"]["available"] and feats["lbr"]["errno"] in (errno.ENOENT, errno.EOPNOTSUPP)
    assert "Tracing: possible" in res["text"]
    # user-space functions: what kernel/uprobes.py chooses from (the kernel's BTF attach types, and cookies)
    user = feats["user_functions"]
    if vm_batch.at_least(6, 13):
        assert user["detail"] == "uprobe.session, uprobe.multi, single uprobes (default uprobe.session)", user
    elif vm_batch.at_least(6, 6):
        assert user["detail"] == "uprobe.multi, single uprobes (default uprobe.multi)", user
    elif vm_batch.at_least(5, 15):
        assert user["detail"] == "single uprobes", user
    else:
        assert not user["available"], user
        assert user["why"] == "has no BPF cookies for user-space functions (Linux 5.15+ needed)", user
    assert ("User-space functions (u:BINARY:GLOB): " + ("possible; " + user["detail"] if user["available"] else
            "not possible: this kernel " + user["why"])) in res["text"].splitlines()
    assert res["progs_left"] == []


def test_features_kprobe_multi_needs_fprobe(vm_batch_61, vm_batch_612) -> None:
    kmulti_61 = vm_batch_61["features"]["json"]["features"]["kprobe_multi"]
    assert not kmulti_61["available"] and kmulti_61["errno"] == errno.EOPNOTSUPP
    assert kmulti_61["why"] == "has no kprobe_multi (CONFIG_FPROBE is off)"
    assert vm_batch_61["features"]["json"]["default_mode"] == "kprobe"
    assert vm_batch_612["features"]["json"]["features"]["kprobe_multi"]["available"]
    # kprobe.session: Linux 6.10+; 6.1 loads the program but knows no such link
    ksess_61 = vm_batch_61["features"]["json"]["features"]["kprobe_session"]
    assert not ksess_61["available"] and ksess_61["errno"] == errno.EINVAL
    assert ksess_61["why"] == "has no kprobe.session (Linux 6.10+ needed)"
    assert vm_batch_612["features"]["json"]["features"]["kprobe_session"]["available"]
    assert vm_batch_612["features"]["json"]["default_mode"] == "kprobe_session"
