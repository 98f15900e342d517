"""Feature report: formatting, mode choice and refusal messages with synthetic results; file-based
probes against fixture trees; capability parsing; and a real detect() that leaves nothing behind."""

from __future__ import annotations

import errno
import gzip
import json
import os
from pathlib import Path

import pytest

from retsnoop_otel.kernel import attach_modes, build_facts, caps, features, kconfig, libbpf_btf, mode_probes
from retsnoop_otel.kernel.features import Feature, FeatureError, Features
from retsnoop_otel.kernel.kcache import KernelCache, KernelIdentity
from retsnoop_otel.kernel.modes import kprobe as kprobe_mode
from retsnoop_otel.kernel.modes import origin_fexits
from retsnoop_otel.runtime.config import ATTACH_MODES


def _feats(**over: Feature) -> Features:
    """A kernel where everything works, with the given entries replaced."""
    modes = ["fentry", "kprobes", "kprobe_multi", "kprobe_session", "fsession", "fsession_multi", "fexit_multi"]
    names = ["btf", "session_kfunc", "user_functions", "ringbuf", "func_ip", "bpf_cookie", "branch_snapshot", "lbr",
             "filter_functions", "kallsyms", "capabilities"]
    entries = {n: over.get(n, Feature(n, True, f"{n} works")) for n in names}
    return Features(kernel_release="6.12.117+deb12-amd64", libbpf_version="1.1",
                    modes={n: over.get(n, Feature(n, True, f"{n} works")) for n in modes}, **entries)


FENTRY_EPERM = Feature("fentry", False, "refused (EPERM): denied", errno.EPERM,
                       "refuses fentry/fexit programs (EPERM)")
NO_KPROBES = Feature("kprobes", False, "kprobes are not configured (CONFIG_KPROBES is off)", errno.ENOENT,
                     "has no kprobes (CONFIG_KPROBES is off)")
NO_KMULTI = Feature("kprobe_multi", False, "not supported (EOPNOTSUPP)", errno.EOPNOTSUPP,
                    "has no kprobe_multi (CONFIG_FPROBE is off)")
NO_KSESSION = Feature("kprobe_session", False, "refused (EINVAL): unknown", errno.EINVAL,
                      "has no kprobe.session (Linux 6.10+ needed)")
NO_FSESSION = Feature("fsession", False, "refused (EINVAL): unknown", errno.EINVAL,
                      "has no fsession (Linux 7.0+ needed)")
NO_FSESSION_MULTI = Feature("fsession_multi", False, "refused (EINVAL): unknown", errno.EINVAL,
                            "has no fsession.multi (Linux 7.2+ needed)")
NO_FEXIT_MULTI = Feature("fexit_multi", False, "refused (EINVAL): unknown", errno.EINVAL,
                         "has no fexit.multi (Linux 7.2+ needed)")
OLDER = {"fsession": NO_FSESSION, "fsession_multi": NO_FSESSION_MULTI,  # every kernel before 7.0
         "fexit_multi": NO_FEXIT_MULTI}
HOST = _feats(fentry=FENTRY_EPERM, kprobes=NO_KPROBES, kprobe_multi=NO_KMULTI, kprobe_session=NO_KSESSION, **OLDER)
KERNEL_61 = _feats(kprobe_multi=NO_KMULTI, kprobe_session=NO_KSESSION, **OLDER)
KERNEL_612 = _feats(**OLDER)


def test_host_like_kernel_gets_one_sentence_naming_what_is_missing() -> None:
    for mode in ("auto", "fentry", "kprobe", "kprobe_multi"):
        with pytest.raises(FeatureError) as info:
            features.require_tracing(HOST, mode)
        msg = str(info.value)
        assert "\n" not in msg and msg.count(": ") == 1
        assert "refuses fentry/fexit programs (EPERM)" in msg and "has no kprobes (CONFIG_KPROBES is off)" in msg
        assert "tests/vm/run -- retsnoop-otel trace" in msg
    with pytest.raises(FeatureError) as info:
        features.require_tracing(HOST, "auto")
    assert str(info.value) == (
        "this kernel refuses fentry/fexit programs (EPERM) and has no kprobes (CONFIG_KPROBES is off), so "
        "kernel functions cannot be traced here: run retsnoop-otel on a kernel that allows them, for example "
        "in a VM (tests/vm/run -- retsnoop-otel trace ...)")
    assert features.choose_mode(HOST) == "auto"


def test_missing_mode_suggests_the_ones_that_work() -> None:
    features.require_tracing(KERNEL_61, "auto")
    features.require_tracing(KERNEL_61, "fentry")
    features.require_tracing(KERNEL_61, "kprobe")
    with pytest.raises(FeatureError) as info:
        features.require_tracing(KERNEL_61, "kprobe_multi")
    assert str(info.value) == (
        "this kernel has no kprobe_multi (CONFIG_FPROBE is off), so -M (kprobe_multi) cannot be used here: use "
        "-F (fentry/fexit) or -K (kprobes) instead, or leave the mode out to pick one automatically")


def test_fsession_modes_refused_before_their_release_with_what_works_instead() -> None:
    for mode, flag, why in (("fsession", "--fsession (fsession)", "has no fsession (Linux 7.0+ needed)"),
                            ("fsession_multi", "--fsession-multi (fsession.multi)",
                             "has no fsession.multi (Linux 7.2+ needed)")):
        with pytest.raises(FeatureError) as info:
            features.require_tracing(KERNEL_612, mode)
        assert str(info.value) == (
            f"this kernel {why}, so {flag} cannot be used here: use --kprobe-session (kprobe.session) or "
            "-M (kprobe_multi) or -F (fentry/fexit) or -K (kprobes) instead, or leave the mode out to pick one "
            "automatically")
    features.require_tracing(_feats(), "fsession")
    features.require_tracing(_feats(), "fsession_multi")
    # 7.0 and 7.1: fsession, no tracing_multi link yet; offered after the one-link kprobe modes
    with pytest.raises(FeatureError, match=r"use --kprobe-session \(kprobe.session\) or -M \(kprobe_multi\) or "
                                           r"--fsession \(fsession\) or -F"):
        features.require_tracing(_feats(fsession_multi=NO_FSESSION_MULTI), "fsession_multi")


def test_origins_only_runs_its_fexit_flavour_where_the_kernel_has_fexit_multi() -> None:
    """--origins-only (origin_exits) is one choice for the user: the runtime runs its inner returns by fexit.multi
    where the kernel has it (7.2+, x86-64), by kretprobe.multi elsewhere; no other mode changes."""
    def cheapest(feats: Features, mode: str) -> str:
        return attach_modes.cheapest(mode, lambda m: feats.mode(m).available)

    assert cheapest(_feats(), "origin_exits") == "origin_fexits"
    assert cheapest(KERNEL_612, "origin_exits") == "origin_exits"
    arm64 = _feats(fexit_multi=origin_fexits.probe_fexit_multi(None, "aarch64"))
    assert cheapest(arm64, "origin_exits") == "origin_exits"
    assert arm64.mode("origin_fexits").why == "is not x86-64 (aarch64)"
    for mode in ("auto", "kprobe_session", "kprobe_multi", "fsession_multi", "fentry", "kprobe"):
        assert cheapest(_feats(), mode) == mode
    assert "origin_fexits" not in ATTACH_MODES and "origin_exits" in ATTACH_MODES  # not asked for by name


def test_choose_mode_prefers_kprobe_session_then_kprobe_multi_then_kprobe_then_fentry() -> None:
    assert features.choose_mode(_feats()) == "kprobe_session"  # also where fsession modes work (7.2)
    assert features.choose_mode(_feats(kprobe_session=NO_KSESSION)) == "kprobe_multi"
    assert features.choose_mode(KERNEL_61) == "kprobe"
    assert features.choose_mode(_feats(kprobe_multi=NO_KMULTI, kprobe_session=NO_KSESSION, fentry=FENTRY_EPERM)) \
        == "kprobe"


def test_prerequisites_btf_and_ringbuf() -> None:
    no_btf = Feature("btf", False, "missing", errno.ENOENT, "has no BTF (CONFIG_DEBUG_INFO_BTF is off)")
    with pytest.raises(FeatureError, match=r"^this kernel has no BTF \(CONFIG_DEBUG_INFO_BTF is off\), which"):
        features.require_tracing(_feats(btf=no_btf), "kprobe")
    no_rb = Feature("ringbuf", False, "old", errno.EINVAL, "has no BPF ring buffer (Linux 5.8+ needed)")
    with pytest.raises(FeatureError, match="ring buffer"):
        features.require_tracing(_feats(ringbuf=no_rb), "auto")
    with pytest.raises(ValueError, match="unknown tracing mode"):
        features.require_tracing(_feats(), "uprobe")


def test_format_features_lists_every_entry_and_the_verdict() -> None:
    text = features.format_features(HOST)
    lines = text.splitlines()
    assert lines[0] == "Kernel 6.12.117+deb12-amd64, libbpf 1.1 (built with the package)"
    assert len(lines) == 3 + 18
    fentry_line = next(x for x in lines if x.split()[0] == "fentry")
    assert fentry_line.split()[1] == "NO" and fentry_line.endswith("refused (EPERM): denied")
    assert next(x for x in lines if x.split()[0] == "btf").split()[1] == "yes"
    assert lines[-1].startswith("Tracing: not possible: this kernel refuses fentry/fexit programs (EPERM)")
    assert features.format_features(KERNEL_61).splitlines()[-1] == "Tracing: possible; default attach mode kprobe"
    assert lines[-2] == "User-space functions (u:BINARY:GLOB): possible; user_functions works"
    no_cookies = Feature("user_functions", False, "needs BPF cookies", errno.ENOTSUP,
                         "has no BPF cookies for user-space functions (Linux 5.15+ needed)")
    assert features.format_features(_feats(user_functions=no_cookies)).splitlines()[-2] == (
        "User-space functions (u:BINARY:GLOB): not possible: this kernel has no BPF cookies for user-space functions "
        "(Linux 5.15+ needed)")


def test_to_dict_is_json_ready() -> None:
    d = json.loads(json.dumps(HOST.to_dict()))
    assert d["kernel_release"] == "6.12.117+deb12-amd64" and d["libbpf_version"] == "1.1"
    assert len(d["features"]) == 18
    assert d["features"]["fentry"] == {"available": False, "detail": "refused (EPERM): denied",
                                       "errno": errno.EPERM, "why": "refuses fentry/fexit programs (EPERM)"}


# ---- file-based probes against fixture trees ----------------------------------------------------


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class _KfuncBtf:
    """Kernel BTF holding one FUNC bpf_session_is_return (id 10 -> FUNC_PROTO 11) with the given parameter kinds."""

    def __init__(self, params: tuple[int, ...] | None) -> None:
        self.params = params

    def find(self, name: str, kind: int) -> int | None:
        return 10 if self.params is not None and name == "bpf_session_is_return" else None

    def type_by_id(self, tid: int) -> libbpf_btf.BtfType:
        kind = {10: libbpf_btf.BTF_KIND_FUNC, 11: 13}.get(tid) or self.params[tid - 100]
        return libbpf_btf.BtfType(tid, kind, "", 11 if tid == 10 else 0)

    def param_types(self, proto_id: int) -> list[int]:
        return [100 + i for i in range(len(self.params))]


def test_session_kfunc_names_the_prototype_the_kernel_binds() -> None:
    void = mode_probes.probe_session_kfunc(_KfuncBtf(()))
    assert void.available and void.detail == "bpf_session_is_return(void) bound (the Linux 6.10 to 6.19 prototype)"
    ctx = mode_probes.probe_session_kfunc(_KfuncBtf((libbpf_btf.BTF_KIND_PTR,)))
    assert ctx.available and ctx.detail == "bpf_session_is_return(void *ctx) bound (the Linux 7.0+ prototype)"
    older = mode_probes.probe_session_kfunc(_KfuncBtf(None))
    assert not older.available and older.why == "has no bpf_session_is_return kfunc (Linux 6.10+ needed)"
    unknown = mode_probes.probe_session_kfunc(_KfuncBtf((libbpf_btf.BTF_KIND_PTR, libbpf_btf.BTF_KIND_INT)))
    assert not unknown.available and "takes 2 parameter(s)" in unknown.detail and unknown.errno == errno.EINVAL
    assert not mode_probes.probe_session_kfunc(None).available


class _EnumBtf:
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def enumerators(self, name: str) -> dict[str, int]:
        assert name == "bpf_attach_type"
        return {n: i for i, n in enumerate(self.names)}


def test_user_functions_name_the_modes_the_tracer_chooses_from() -> None:
    """The same facts as kernel/uprobes.choose_user_mode: the attach types the kernel's BTF names, and cookies."""
    cookies = Feature("bpf_cookie", True, "allowed")
    newest = features.probe_user_functions(_EnumBtf(("BPF_TRACE_UPROBE_MULTI", "BPF_TRACE_UPROBE_SESSION")), cookies)
    assert newest.available and newest.detail == ("uprobe.session, uprobe.multi, single uprobes "
                                                  "(default uprobe.session)")
    k612 = features.probe_user_functions(_EnumBtf(("BPF_TRACE_UPROBE_MULTI",)), cookies)
    assert k612.detail == "uprobe.multi, single uprobes (default uprobe.multi)"
    k61 = features.probe_user_functions(_EnumBtf(("BPF_TRACE_KPROBE_MULTI",)), cookies)
    assert k61.detail == "single uprobes"
    no = Feature("bpf_cookie", False, "not allowed", errno.EINVAL, "has no bpf_get_attach_cookie() helper")
    k510 = features.probe_user_functions(_EnumBtf(()), no)
    assert not k510.available and k510.why == "has no BPF cookies for user-space functions (Linux 5.15+ needed)"
    assert not features.probe_user_functions(None, cookies).available


def test_kernel_config_from_boot_and_proc(tmp_path: Path) -> None:
    _write(tmp_path, "boot/config-6.18.0", "CONFIG_BPF=y\n# CONFIG_KPROBES is not set\nCONFIG_LSM=\"bpf\"\n")
    cfg = kconfig.kernel_config(str(tmp_path), "6.18.0")
    assert cfg == {"CONFIG_BPF": "y", "CONFIG_KPROBES": "n", "CONFIG_LSM": '"bpf"'}
    assert kconfig.kernel_config(str(tmp_path), "6.1.0") == {}
    (tmp_path / "proc").mkdir()
    with gzip.open(tmp_path / "proc/config.gz", "wt") as f:
        f.write("CONFIG_FPROBE=y\n")
    assert kconfig.kernel_config(str(tmp_path), "6.18.0") == {"CONFIG_FPROBE": "y"}


def test_kprobes_without_pmu_explained_from_config(tmp_path: Path) -> None:
    f = kprobe_mode.probe_kprobes(str(tmp_path), None, {"CONFIG_KPROBES": "n"})
    assert not f.available and f.why == "has no kprobes (CONFIG_KPROBES is off)"
    f = kprobe_mode.probe_kprobes(str(tmp_path), None, {})
    assert not f.available and "no kprobe PMU" in f.detail


def test_btf_probe(tmp_path: Path) -> None:
    assert not features.probe_btf(str(tmp_path)).available
    _write(tmp_path, "sys/kernel/btf/vmlinux", "x" * 2_000_000)
    f = features.probe_btf(str(tmp_path))
    assert f.available and f.detail.endswith("(2.0 MB)")


def test_kallsyms_probe(tmp_path: Path) -> None:
    _write(tmp_path, "proc/kallsyms", "0000000000000000 T _stext\n0000000000000000 T do_sys_open\n")
    f = features.probe_kallsyms(str(tmp_path))
    assert not f.available and "kptr_restrict" in f.detail
    _write(tmp_path, "proc/kallsyms", "ffffffff81000000 T _stext\n")
    assert features.probe_kallsyms(str(tmp_path)).available
    assert not features.probe_kallsyms(str(tmp_path / "nowhere")).available


def test_filter_functions_probe(tmp_path: Path) -> None:
    f = features.probe_filter_functions(str(tmp_path))
    assert not f.available and "tracefs is not mounted" in f.detail
    _write(tmp_path, "sys/kernel/tracing/available_filter_functions", "do_sys_open\nbpf_map_create\nfoo [mod]\n")
    f = features.probe_filter_functions(str(tmp_path))
    assert f.available and f.detail == "available_filter_functions lists 3 functions"


STATUS = "Name:\tpython\nCapInh:\t0000000000000000\nCapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\n"


def test_caps_from_status_fixture(tmp_path: Path) -> None:
    _write(tmp_path, "proc/self/status", STATUS)
    held = caps.effective_caps(str(tmp_path))
    assert {"CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_SYSLOG", "CAP_CHOWN"} <= held
    assert "CAP_SYS_RESOURCE" not in held
    assert len(held) == 40
    f = features.probe_capabilities(str(tmp_path))
    assert f.available and f.detail == "holds CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYSLOG; lacks CAP_SYS_RESOURCE"


def test_caps_unprivileged_and_broken(tmp_path: Path) -> None:
    _write(tmp_path, "proc/self/status", "CapEff:\t0000000000000000\n")
    assert caps.effective_caps(str(tmp_path)) == set()
    f = features.probe_capabilities(str(tmp_path))
    assert not f.available and f.errno == errno.EPERM and "CAP_BPF and CAP_PERFMON" in f.why
    assert caps.parse_cap_mask(1 << 39 | 1 << 38) == {"CAP_BPF", "CAP_PERFMON"}
    assert caps.parse_cap_mask(1 << 50) == {"CAP_50"}
    assert caps.can_trace({"CAP_SYS_ADMIN"}) and not caps.can_trace({"CAP_BPF"})
    _write(tmp_path, "proc/self/status", "Name:\tx\n")
    with pytest.raises(caps.CapsError, match="no CapEff"):
        caps.effective_caps(str(tmp_path))
    with pytest.raises(caps.CapsError, match="cannot read"):
        caps.effective_caps(str(tmp_path / "nowhere"))


# ---- the real kernel ----------------------------------------------------------------------------


def test_detect_on_this_kernel_is_consistent_and_leaves_nothing_open() -> None:
    before = set(os.listdir("/proc/self/fd"))
    feats = features.detect()
    assert set(os.listdir("/proc/self/fd")) == before
    assert feats.kernel_release == os.uname().release
    for f in feats.entries():
        assert f.detail, f
        if not f.available:
            assert f.why and f.errno, f
    try:
        features.require_tracing(feats, features.choose_mode(feats))
    except FeatureError as exc:
        assert features.choose_mode(feats) == "auto" and "\n" not in str(exc)


def test_main_json_and_text(capsys) -> None:
    from retsnoop_otel.cli import features_main
    assert features_main(["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d["features"]) >= {"btf", "fentry", "kprobes", "kprobe_multi", "lbr"}
    assert d["default_mode"] in features.MODES
    assert features_main([]) == 0
    assert capsys.readouterr().out.startswith(f"Kernel {os.uname().release} ({os.uname().machine}), libbpf ")


# ---- the build facts, cached per build -----------------------------------------------------------


def _ident(boot: str = "b1", build: str = "abcd") -> KernelIdentity:
    return KernelIdentity(build, boot, "")


def _fake_probes(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Feature],
                 asked: list[list[str]] | None = None) -> list[int]:
    """`answers` stand in for the kernel; `asked` gets each call's facts."""
    calls: list[int] = []

    def probe(root, targets, config, btf, modes=attach_modes.FEATURES, others=True):  # noqa: ANN001, ANN202
        calls.append(1)
        names = [*modes, *(build_facts.OTHER_FACTS if others else ())]
        if asked is not None:
            asked.append(names)
        return {n: answers[n] for n in names}
    monkeypatch.setattr(features, "_probe_build_facts", probe)
    return calls


BUILD_OK = {n: Feature(n, True, f"{n} works") for n in build_facts.BUILD_FACTS}


def test_build_facts_are_probed_once_per_build_and_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    _write(root, "proc/self/status", STATUS)
    _write(root, "sys/kernel/security/lockdown", "[none] integrity confidentiality\n")
    _write(root, "proc/cmdline", "root=/dev/vda console=ttyS0\n")
    _write(root, "proc/sys/net/core/bpf_jit_enable", "1\n")
    cache = KernelCache(tmp_path / "cache")
    answers = dict(BUILD_OK, kprobe_session=NO_KSESSION)
    calls = _fake_probes(monkeypatch, answers)
    first = build_facts.ProbeCache.for_build(cache, _ident(), str(root))
    a = features.detect(str(root), cache=first)
    assert len(calls) == 1 and not first.hit
    # the same build after a reboot: its facts are still those of the build
    again = build_facts.ProbeCache.for_build(cache, _ident("b2"), str(root))
    b = features.detect(str(root), cache=again)
    assert len(calls) == 1 and again.hit and a == b and b.mode("kprobe_session") == NO_KSESSION
    # another build, another command line, the JIT turned off, root raising the lockdown level: probed again
    probes = 1
    for change in (lambda: _ident(build="ef01"),
                   lambda: (_write(root, "proc/cmdline", "root=/dev/vda lockdown=integrity\n"), _ident())[1],
                   lambda: (_write(root, "proc/sys/net/core/bpf_jit_enable", "0\n"), _ident())[1],
                   lambda: (_write(root, "sys/kernel/security/lockdown", "none [integrity] confidentiality\n"),
                            _ident())[1]):
        changed = build_facts.ProbeCache.for_build(cache, change(), str(root))
        features.detect(str(root), cache=changed)
        probes += 1
        assert len(calls) == probes and not changed.hit
    # no build id: nothing to key the facts by, probed every time
    for _ in range(2):
        features.detect(str(root), cache=build_facts.ProbeCache.for_build(cache, _ident(build=""), str(root)))
    assert len(calls) == probes + 2


def test_a_start_probes_the_modes_it_uses_and_the_cache_keeps_each(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A start probes the first mode of AUTO_ORDER with the other build facts, then each mode only when asked (the
    next in AUTO_ORDER where that one is refused, a mode the user names); the cache keeps every answer found, and
    `features` (thorough) probes what no start asked for."""
    root = tmp_path / "root"
    _write(root, "proc/self/status", STATUS)
    _write(root, "sys/kernel/btf/vmlinux", "BTF")
    cache = KernelCache(tmp_path / "cache")
    asked: list[list[str]] = []
    _fake_probes(monkeypatch, dict(BUILD_OK, kprobe_session=NO_KSESSION), asked)  # a 6.1 kernel, say
    feats, hit = features.detect_at_start(cache, _ident(), str(root), func_id=lambda name: 7)
    assert not hit and asked == [[attach_modes.AUTO_ORDER[0], *build_facts.OTHER_FACTS]]
    assert features.choose_mode(feats) == "kprobe_multi" and asked[1:] == [["kprobe_multi"]]
    features.require_tracing(feats, "auto")
    assert len(asked) == 2  # the first usable mode ends the check
    again, hit = features.detect_at_start(cache, _ident("b2"), str(root), func_id=lambda name: 7)  # after a reboot
    assert hit and features.choose_mode(again) == "kprobe_multi" and len(asked) == 2
    assert again.mode("fentry").available and asked[2:] == [["fentry"]]  # `trace -F`
    assert set(again.modes.known()) == {"kprobe_session", "kprobe_multi", "fentry"}  # type: ignore[attr-defined]
    report = features.detect(str(root), cache=build_facts.ProbeCache.for_build(cache, _ident(), str(root)))
    assert sorted(asked[3]) == sorted(set(attach_modes.FEATURES) - {"kprobe_session", "kprobe_multi", "fentry"})
    answers = dict(BUILD_OK, kprobe_session=NO_KSESSION)
    assert dict(report.modes) == {f: answers[f] for f in attach_modes.FEATURES} and len(asked) == 4
    # 6.1: no fprobe at all; kprobes are the automatic choice, and neither fentry nor the fsession kinds are probed
    asked.clear()
    no_fprobe = Feature("kprobe_multi", False, "not supported (EOPNOTSUPP)", errno.EOPNOTSUPP, "has no kprobe.multi")
    _fake_probes(monkeypatch, dict(BUILD_OK, kprobe_session=NO_KSESSION, kprobe_multi=no_fprobe), asked)
    feats, _ = features.detect_at_start(KernelCache(None), _ident(), str(root), func_id=lambda name: 7)
    features.require_tracing(feats, "auto")
    assert features.choose_mode(feats) == "kprobe"
    assert [a for call in asked for a in call if a in attach_modes.FEATURES] == ["kprobe_session", "kprobe_multi",
                                                                                 "kprobes"]


def test_answers_of_policy_and_runs_without_privileges_are_not_cached(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    _write(root, "proc/self/status", STATUS)
    cache = KernelCache(tmp_path / "cache")
    calls = _fake_probes(monkeypatch, dict(BUILD_OK, fentry=FENTRY_EPERM))
    for _ in range(2):  # EPERM may be an LSM policy of the moment, not the kernel build
        features.detect(str(root), cache=build_facts.ProbeCache.for_build(cache, _ident(), str(root)))
    assert len(calls) == 2
    calls = _fake_probes(monkeypatch, BUILD_OK)
    _write(root, "proc/self/status", "CapEff:\t0000000000000000\n")
    for _ in range(2):  # without privileges every answer could be a refusal of this process
        probed = build_facts.ProbeCache.for_build(cache, _ident(), str(root))
        features.detect(str(root), cache=probed)
    assert len(calls) == 2 and not probed.hit
    _write(root, "proc/self/status", STATUS)
    features.detect(str(root), cache=build_facts.ProbeCache.for_build(cache, _ident(), str(root)))
    probed = build_facts.ProbeCache.for_build(cache, _ident(), str(root))
    features.detect(str(root), cache=probed)
    assert len(calls) == 3 and probed.hit


def test_ctrl_c_while_probes_run_side_by_side_waits_for_them_before_unwinding() -> None:
    """Ctrl-C lands in the main thread's join: the caller then frees what the probes use (the kernel's BTF, in
    detect's finally), so the probes must have ended first. Freed under a running probe, the process died of SIGSEGV
    (a Ctrl-C timing sweep of `features`, 2 runs in about 160)."""
    import signal
    import threading
    import time
    done: list[str] = []
    started = threading.Event()

    def interrupting() -> Feature:
        started.wait(60)
        os.kill(os.getpid(), signal.SIGINT)  # handled by the main thread, waiting in join()
        return Feature("a", True, "")

    def slow() -> Feature:
        started.set()
        time.sleep(0.5)  # still running when the main thread gets the KeyboardInterrupt
        done.append("slow")
        return Feature("b", True, "")
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            features._side_by_side({"a": interrupting, "b": slow})  # noqa: SLF001
        assert done == ["slow"]  # ended before the exception left: nothing it used is freed under it
    finally:
        signal.signal(signal.SIGINT, old)
