"""Stack rendering against the retsnoop outputs in the "Tracing Linux kernel with retsnoop" article.

Expected texts are the article's, with two documented differences: source columns (':120:0') are
gone (retsnoop dropped them in v0.10, and our frames carry file:line), and the stitched-frame mark in
column 2 ('*') is not produced (the kernel side keeps a single error chain).
"""

from __future__ import annotations

import calendar
import re
import time
from pathlib import Path

import pytest

from retsnoop_otel.capture.model import RetKind, Session, StackEntry, TracedFunc
from retsnoop_otel.render.console import session_text
from retsnoop_otel.render.formats import StackFormat
from retsnoop_otel.render.stack import StackLayouts, filter_kstack, render_header, render_stack
from retsnoop_otel.symbols.dwarf import SourceFrame
from retsnoop_otel.symbols.kallsyms import Kallsyms
from retsnoop_otel.symbols.symbolize import DwarfSymbolizer, Frame, KallsymsSymbolizer

ROOT = Path(__file__).resolve().parent.parent / "fixtures" / "kernel_root"
NEG = 1 << 64  # raw 64-bit register value of a negative return: NEG - 12 is -ENOMEM


@pytest.fixture(scope="module")
def ksyms() -> Kallsyms:
    return Kallsyms.load(str(ROOT))


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def addr(ksyms: Kallsyms, name: str, off: int = 0, module: str | None = None) -> int:
    return next(s.addr for s in ksyms.by_name(name) if s.module == module) + off


class FakeDwarf:
    """Stands in for llvm-symbolizer: source frames per address, innermost inline first."""

    def __init__(self, table: dict[int, list[SourceFrame]]) -> None:
        self.table = table

    def frames(self, a: int) -> list[SourceFrame]:
        return self.table.get(a, [])


def funcs_for(ksyms: Kallsyms, spec: list[tuple[str, RetKind]]) -> dict[int, TracedFunc]:
    return {i: TracedFunc(i, name, addr(ksyms, name), ret, i == 0) for i, (name, ret) in enumerate(spec)}


# Boot-clock start of 1 s; the offset makes it 2022-10-14 20:19:36.372607 UTC, the article's first header.
BOOT_START = 1_000_000_000
WALL_START = calendar.timegm((2022, 10, 14, 20, 19, 36, 0, 0, 0)) * 10**9 + 372_607_000
OFFSET = WALL_START - BOOT_START

KRETPROBE_FRAMES = [  # what bpf_get_stack can show inside a kretprobe program, innermost first
    ("bpf_prog_e5d01ee9a8b6fa01_rs_kretprobe", 0x4a, "bpf"), ("bpf_get_stack", 0x1c, None),
    ("trace_call_bpf", 0xf6, None), ("kretprobe_perf_func", 0x67, None), ("kretprobe_dispatcher", 0x30, None),
    ("__kretprobe_trampoline_handler", 0x9c, None), ("trampoline_handler", 0x44, None),
    ("__kretprobe_trampoline", 0x2a, None),
]

SEED_1 = """\
20:19:36.372607 -> 20:19:36.372682 TID/PID 8346/8346 (simfail/simfail):

                    entry_SYSCALL_64_after_hwframe+0x63  (arch/x86/entry/entry_64.S:120)
                    do_syscall_64+0x35                   (arch/x86/entry/common.c:80)
                    . do_syscall_x64                     (arch/x86/entry/common.c:50)
    73us [-ENOMEM]  __x64_sys_bpf+0x1a                   (kernel/bpf/syscall.c:5067)
    70us [-ENOMEM]  __sys_bpf+0x38b                      (kernel/bpf/syscall.c:4947)
                    . map_create                         (kernel/bpf/syscall.c:1106)
                    . find_and_alloc_map                 (kernel/bpf/syscall.c:132)
!   50us [-ENOMEM]  array_map_alloc
!    2us [NULL]     bpf_map_alloc_percpu


"""


def seed1_symbolizer(ksyms: Kallsyms) -> DwarfSymbolizer:
    a = lambda name, off: addr(ksyms, name, off)  # noqa: E731
    return DwarfSymbolizer(ksyms, FakeDwarf({
        a("entry_SYSCALL_64_after_hwframe", 0x63): [SourceFrame("entry_SYSCALL_64", "arch/x86/entry/entry_64.S", 120)],
        a("do_syscall_64", 0x35): [SourceFrame("do_syscall_x64", "arch/x86/entry/common.c", 50),
                                   SourceFrame("do_syscall_64", "arch/x86/entry/common.c", 80)],
        a("__x64_sys_bpf", 0x1a): [SourceFrame("__x64_sys_bpf", "kernel/bpf/syscall.c", 5067)],
        a("__sys_bpf", 0x38b): [SourceFrame("find_and_alloc_map", "kernel/bpf/syscall.c", 132),
                                SourceFrame("map_create", "kernel/bpf/syscall.c", 1106),
                                SourceFrame("__sys_bpf", "kernel/bpf/syscall.c", 4947)],
        a("__sys_bpf", 0x11a4): [SourceFrame("__sys_bpf", "kernel/bpf/syscall.c", 4965)],
    }))


def seed1_session(ksyms: Kallsyms, chain: list[StackEntry]) -> Session:
    kstack = [addr(ksyms, n, off, mod) for n, off, mod in KRETPROBE_FRAMES]
    kstack += [addr(ksyms, "__sys_bpf", 0x38b), addr(ksyms, "__x64_sys_bpf", 0x1a),
               addr(ksyms, "do_syscall_64", 0x35), addr(ksyms, "entry_SYSCALL_64_after_hwframe", 0x63)]
    return Session(tid=8346, pid=8346, comm="simfail", proc_comm="simfail", start_ns=BOOT_START,
                   end_ns=BOOT_START + 75_000, is_err=True, chain=chain, kstack=kstack + [0, 0])


def test_seed_percpu_array_example_layout(ksyms: Kallsyms) -> None:
    funcs = funcs_for(ksyms, [("__x64_sys_bpf", RetKind.SIGNED), ("__sys_bpf", RetKind.INT32),
                              ("array_map_alloc", RetKind.POINTER), ("bpf_map_alloc_percpu", RetKind.POINTER)])
    chain = [StackEntry(0, NEG - 12, 73_400), StackEntry(1, NEG - 12, 70_999), StackEntry(2, NEG - 12, 50_000),
             StackEntry(3, 0, 2_100)]
    out = render_stack(seed1_session(ksyms, chain), funcs, seed1_symbolizer(ksyms), OFFSET)
    assert out == SEED_1


SEED_2 = """\
                 entry_SYSCALL_64_after_hwframe+0x63  (arch/x86/entry/entry_64.S:120)
                 do_syscall_64+0x35                   (arch/x86/entry/common.c:80)
                 . do_syscall_x64                     (arch/x86/entry/common.c:50)
                 __x64_sys_bpf+0x1a                   (kernel/bpf/syscall.c:5067)
                 __sys_bpf+0x11a4                     (kernel/bpf/syscall.c:4965)
!  374us [5]     bpf_prog_load
!    6us [void]  bpf_prog_kallsyms_add
!    2us [void]  bpf_ksym_add
!   29us [0]     check_mem_access
!    1us [NULL]  bpf_map_kptr_off_contains
"""


def test_seed_success_stack_chain_below_kernel_stack(ksyms: Kallsyms) -> None:
    """No traced function is on the kernel stack: every kernel frame first, then the '!' chain."""
    funcs = funcs_for(ksyms, [("bpf_prog_load", RetKind.INT32), ("bpf_prog_kallsyms_add", RetKind.VOID),
                              ("bpf_ksym_add", RetKind.VOID), ("check_mem_access", RetKind.INT32),
                              ("bpf_map_kptr_off_contains", RetKind.POINTER)])
    chain = [StackEntry(0, 5, 374_697), StackEntry(1, 0, 6_104), StackEntry(2, 0, 2_046), StackEntry(3, 0, 29_000),
             StackEntry(4, 0, 1_500)]
    kstack = [addr(ksyms, "__sys_bpf", 0x11a4), addr(ksyms, "__x64_sys_bpf", 0x1a), addr(ksyms, "do_syscall_64", 0x35),
              addr(ksyms, "entry_SYSCALL_64_after_hwframe", 0x63)]
    session = Session(8385, 8385, "simfail", "simfail", BOOT_START, BOOT_START + 377_000, False, chain, kstack)
    out = render_stack(session, funcs, seed1_symbolizer(ksyms), OFFSET)
    assert out.split("\n\n", 1)[1] == SEED_2 + "\n\n"


SEED_3 = """\
                    entry_SYSCALL_64_after_hwframe+0x44
                    do_syscall_64+0x2d
    30us [-EINVAL]  __x64_sys_bpf+0x1c
    23us [-EINVAL]  __sys_bpf+0xca0
!    8us [-EINVAL]  array_map_alloc_check
"""


def test_seed_lbr_example_stack_with_kallsyms_only(ksyms: Kallsyms) -> None:
    """Without DWARF: names and offsets only, no source column, same alignment of the other columns."""
    funcs = funcs_for(ksyms, [("__x64_sys_bpf", RetKind.SIGNED), ("__sys_bpf", RetKind.INT32),
                              ("array_map_alloc_check", RetKind.INT32)])
    chain = [StackEntry(0, NEG - 22, 30_900), StackEntry(1, (1 << 32) - 22, 23_000), StackEntry(2, NEG - 22, 8_000)]
    kstack = [addr(ksyms, n, off, mod) for n, off, mod in KRETPROBE_FRAMES] + [
        addr(ksyms, "__sys_bpf", 0xca0), addr(ksyms, "__x64_sys_bpf", 0x1c), addr(ksyms, "do_syscall_64", 0x2d),
        addr(ksyms, "entry_SYSCALL_64_after_hwframe", 0x44)]
    session = Session(2385333, 2385333, "simfail", "simfail", BOOT_START, BOOT_START + 31_000, True, chain, kstack)
    out = render_stack(session, funcs, KallsymsSymbolizer(ksyms), OFFSET)
    assert out.split("\n\n", 1)[1] == SEED_3 + "\n\n"


def test_fexit_trampoline_pattern_and_untraced_middle_frames(ksyms: Kallsyms) -> None:
    """fexit stacks: the BPF program, its trampoline and the probed function's fentry site (f+0x5) go;
    an untraced function between two traced ones stays in place; the deepest one gets '!'."""
    funcs = funcs_for(ksyms, [("__x64_sys_bpf", RetKind.SIGNED), ("array_map_alloc_check", RetKind.INT32)])
    kstack = [addr(ksyms, "bpf_prog_e5d01ee9a8b6fa01_rs_kretprobe", 0x60, "bpf"),
              addr(ksyms, "bpf_trampoline_6442491234", 0x8c, "bpf"),
              addr(ksyms, "array_map_alloc_check", 0x5),
              addr(ksyms, "__sys_bpf", 0xca0), addr(ksyms, "__x64_sys_bpf", 0x1c)]
    chain = [StackEntry(0, NEG - 22, 30_000), StackEntry(1, NEG - 22, 8_000)]
    session = Session(1, 1, "t", "t", BOOT_START, BOOT_START + 31_000, True, chain, kstack)
    body = render_stack(session, funcs, KallsymsSymbolizer(ksyms), OFFSET).split("\n\n", 1)[1]
    assert body == ("    30us [-EINVAL]  __x64_sys_bpf+0x1c\n"
                    "                    __sys_bpf+0xca0\n"
                    "!    8us [-EINVAL]  array_map_alloc_check\n\n\n")


def test_fexit_trampoline_of_a_running_outer_function_is_removed(ksyms: Kallsyms) -> None:
    """An outer fexit-traced function reads 'f+0x5, trampoline, f+0x1c' (innermost last): only f+0x1c stays."""
    funcs = funcs_for(ksyms, [("__x64_sys_bpf", RetKind.SIGNED)])
    kstack = [addr(ksyms, "__sys_bpf", 0xca0), addr(ksyms, "__x64_sys_bpf", 0x1c),
              addr(ksyms, "bpf_trampoline_6442491234", 0x6f, "bpf"), addr(ksyms, "__x64_sys_bpf", 0x5),
              addr(ksyms, "do_syscall_64", 0x2d)]
    frames = filter_kstack(kstack, KallsymsSymbolizer(ksyms))
    assert [f[0].name + f"+0x{f[0].offset:x}" for _, f in frames] == [
        "__sys_bpf+0xca0", "__x64_sys_bpf+0x1c", "do_syscall_64+0x2d"]
    session = Session(1, 1, "t", "t", 0, 1, True, [StackEntry(0, NEG - 22, 5_000)], kstack)
    body = render_stack(session, funcs, KallsymsSymbolizer(ksyms), 0).split("\n\n", 1)[1]
    assert body.splitlines()[1] == "     5us [-EINVAL]  __x64_sys_bpf+0x1c"


def test_unfinished_function_and_unknown_address(ksyms: Kallsyms) -> None:
    funcs = funcs_for(ksyms, [("__x64_sys_bpf", RetKind.SIGNED), ("__sys_bpf", RetKind.INT32)])
    kstack = [addr(ksyms, "__sys_bpf", 0x10), 0x1234]  # 0x1234: below every kernel symbol
    chain = [StackEntry(0, 0, None), StackEntry(1, 0, None)]
    session = Session(7, 7, "a", "b", 0, 1, False, chain, kstack)
    rows = render_stack(session, funcs, KallsymsSymbolizer(ksyms), 0).split("\n\n", 1)[1].rstrip("\n").splitlines()
    assert rows == ["                0x1234", "!    ... [...]  __x64_sys_bpf", "     ... [...]  __sys_bpf+0x10"]


def test_header_uses_local_time_of_boot_plus_offset(ksyms: Kallsyms, monkeypatch: pytest.MonkeyPatch) -> None:
    session = Session(10, 20, "worker", "proc", BOOT_START, BOOT_START + 1_500_000_001, False, [], [])
    assert render_header(session, OFFSET) == \
        "20:19:36.372607 -> 20:19:37.872607 TID/PID 10/20 (worker/proc):"
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # UTC+05:30
    time.tzset()
    assert render_header(session, OFFSET).startswith("01:49:36.372607 -> ")


def test_kallsyms_symbolizer(ksyms: Kallsyms) -> None:
    sym = KallsymsSymbolizer(ksyms)
    a = addr(ksyms, "show_stat", 0x10, "kvm")
    assert sym.frames(a) == [Frame("show_stat", 0x10, "kvm")]
    assert sym.describe(a) == "show_stat+0x10"
    assert sym.frames(0x10) == [] and sym.describe(0x10) == "0x10"


def test_dwarf_symbolizer_orders_outermost_first(ksyms: Kallsyms) -> None:
    sym = seed1_symbolizer(ksyms)
    frames = sym.frames(addr(ksyms, "__sys_bpf", 0x38b))
    assert [(f.name, f.offset, f.line, f.inlined) for f in frames] == [
        ("__sys_bpf", 0x38b, 4947, False), ("map_create", 0, 1106, True), ("find_and_alloc_map", 0, 132, True)]
    # no DWARF for module code or unknown addresses: kallsyms only
    assert sym.frames(addr(ksyms, "kvm_vcpu_ioctl", 4, "kvm")) == [Frame("kvm_vcpu_ioctl", 4, "kvm")]
    assert sym.frames(addr(ksyms, "bpf_ksym_add", 4)) == [Frame("bpf_ksym_add", 4)]


def test_chain_entry_missing_from_function_table(ksyms: Kallsyms) -> None:
    """A stale or corrupt function id still renders (raw result), rather than failing the whole session."""
    session = Session(7, 7, "a", "b", 0, 1, True, [StackEntry(99, 5, 1_999)], [])
    body = render_stack(session, {}, KallsymsSymbolizer(ksyms), 0).split("\n\n", 1)[1]
    assert body == "!    1us [0x5]  <func #99>\n\n\n"


def test_fexit_trampolines_created_after_load_are_merged_from_a_fresh_read() -> None:
    """kallsyms is read before attaching, when no trampoline exists yet: without the [bpf] symbols of a
    later read, trampoline frames are charged to the preceding module function (CI on 6.1 and 6.12 saw
    'handshake_exit+0x1e10c1d4'); merging them restores the retsnoop layout."""
    full = (ROOT / "proc/kallsyms").read_text()
    before = Kallsyms.parse("\n".join(ln for ln in full.splitlines() if not ln.endswith("[bpf]")))
    after = Kallsyms.parse(full)
    funcs = funcs_for(after, [("__x64_sys_bpf", RetKind.SIGNED), ("array_map_alloc_check", RetKind.INT32)])
    kstack = [addr(after, "bpf_prog_e5d01ee9a8b6fa01_rs_kretprobe", 0x60, "bpf"),
              addr(after, "bpf_trampoline_6442491234", 0x8c, "bpf"),
              addr(after, "array_map_alloc_check", 0x9),
              addr(after, "__sys_bpf", 0xca0), addr(after, "__x64_sys_bpf", 0x1c)]
    chain = [StackEntry(0, NEG - 22, 30_000), StackEntry(1, NEG - 22, 8_000)]
    session = Session(1, 1, "t", "t", BOOT_START, BOOT_START + 31_000, True, chain, kstack)
    stale = render_stack(session, funcs, KallsymsSymbolizer(before), OFFSET)
    assert "!    8us [-EINVAL]  array_map_alloc_check" not in stale
    assert before.sync_bpf_symbols(full) == 3
    assert before.sync_bpf_symbols(full) == 0  # idempotent
    assert [s.name for s in before.by_name("bpf_trampoline_6442491234")] == ["bpf_trampoline_6442491234"]
    body = render_stack(session, funcs, KallsymsSymbolizer(before), OFFSET).split("\n\n", 1)[1]
    assert body == ("    30us [-EINVAL]  __x64_sys_bpf+0x1c\n"
                    "                    __sys_bpf+0xca0\n"
                    "!    8us [-EINVAL]  array_map_alloc_check\n\n\n")


def test_fentry_probe_sets_read_the_bpf_symbols_before_the_first_stack_not_at_start() -> None:
    """The fresh kallsyms read took most of a small fentry set's start under emulation (1.9 s of 7.4):
    it now waits for the first session with a kernel stack, ahead of that session's rendering, once."""
    from retsnoop_otel.agent.config_file import parse_config
    from retsnoop_otel.runtime.config import ProbeSetConfig
    from retsnoop_otel.runtime.probe_set import ProbeSet
    from retsnoop_otel.symbols.discovery import discover
    from tests.fakes import World, error_session, make_env

    class CountingKallsyms(Kallsyms):
        reads = 0

        def refresh_bpf_symbols(self, root: str = "/") -> int:
            self.reads += 1
            return 0

    env = make_env()
    ksyms = CountingKallsyms(list(env.ksyms.items()))
    env.ksyms = ksyms
    disc = discover(["__x64_sys_bpf"], ["array_map_alloc_check"], [], ksyms, env.available, env.ret_kind, "fentry")
    world, shown = World(), []
    ps = ProbeSet(ProbeSetConfig(name="x", entry=("__x64_sys_bpf",)), disc,
                  parse_config("probe_sets: {a: {entry: f}}").runtime.limits, env, world.factory,
                  lambda _p, s: shown.append((ksyms.reads, s)))
    ps.start()
    assert ps.mode == "fentry" and ksyms.reads == 0  # not on the way to "Receiving data..."
    (tracer,) = world.tracers
    for tid in (7, 8):
        start, end = error_session(tracer, tid)
        for rec in (start, end._replace(kstack_sz=1, kstack=(0xffffffff81003009,))):
            tracer.on_record(rec)
        assert [reads for reads, _ in shown][:1] == [1]  # read before the first session went out to be rendered
    assert ksyms.reads == 1 and len(shown) == 2  # once


def test_bpf_symbols_of_programs_that_are_gone_are_dropped() -> None:
    """An agent's reload keeps the kernel tables while it replaces its programs: a detached program's
    address must not keep naming whatever is loaded there next."""
    full = (ROOT / "proc/kallsyms").read_text()
    ksyms = Kallsyms.parse(full)
    without = "\n".join(ln for ln in full.splitlines() if "bpf_trampoline_6442491234" not in ln)
    assert ksyms.sync_bpf_symbols(without) == 0
    assert ksyms.by_name("bpf_trampoline_6442491234") == []
    assert ksyms.by_name("__x64_sys_bpf") != []  # the kernel's own symbols stay
    assert ksyms.sync_bpf_symbols(full) == 1


def test_a_symbolizer_forgets_what_it_cached_when_the_symbols_change() -> None:
    full = (ROOT / "proc/kallsyms").read_text()
    ksyms = Kallsyms.parse("\n".join(ln for ln in full.splitlines() if not ln.endswith("[bpf]")))
    sym = KallsymsSymbolizer(ksyms)
    tramp = addr(Kallsyms.parse(full), "bpf_trampoline_6442491234", 0x8c, "bpf")
    assert not sym.describe(tramp).startswith("bpf_trampoline_")  # charged to the function before it
    assert sym.frames(tramp) is sym.frames(tramp)  # cached
    ksyms.sync_bpf_symbols(full)
    assert sym.describe(tramp) == "bpf_trampoline_6442491234+0x8c"


def test_returned_function_rows_show_where_it_is_defined_when_dwarf_knows(ksyms: Kallsyms) -> None:
    """'!' rows have no frame; with DWARF the function's entry address still names its file:line."""
    funcs = funcs_for(ksyms, [("__x64_sys_bpf", RetKind.SIGNED), ("__sys_bpf", RetKind.INT32),
                              ("array_map_alloc", RetKind.POINTER), ("bpf_map_alloc_percpu", RetKind.POINTER)])
    chain = [StackEntry(0, NEG - 12, 73_400), StackEntry(1, NEG - 12, 70_999), StackEntry(2, NEG - 12, 50_000),
             StackEntry(3, 0, 2_100)]
    sym = seed1_symbolizer(ksyms)
    sym._source.table[addr(ksyms, "array_map_alloc")] = [SourceFrame("array_map_alloc", "kernel/bpf/arraymap.c", 87)]
    out = render_stack(seed1_session(ksyms, chain), funcs, sym, OFFSET)
    assert "!   50us [-ENOMEM]  array_map_alloc                      (kernel/bpf/arraymap.c:87)\n" in out
    assert out.replace("                      (kernel/bpf/arraymap.c:87)", "") == SEED_1  # the rest as before


def test_application_ids_in_the_header_and_user_stack_under_the_kernel_stack(ksyms: Kallsyms) -> None:
    from retsnoop_otel.capture.model import AppContext, UserFrame
    from retsnoop_otel.render.console import session_json, session_text
    funcs = funcs_for(ksyms, [("__x64_sys_bpf", RetKind.SIGNED), ("__sys_bpf", RetKind.INT32)])
    frames = (UserFrame(0x7F0000001D, "syscall", 0x1D, "/lib/x86_64-linux-gnu/libc.so.6"),
              UserFrame(0x401136, "load_user", 0x16, "/srv/app", "app.c", 41, inlined=True),
              UserFrame(0x401136, "handle_request", 0x16, "/srv/app", "app.c", 60),
              UserFrame(0x401200, "main", 0x40, "/srv/app", "app.c", 90))
    app = AppContext("ok", 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1,
                     attributes=(("http.route", "/u"),), service_name="shop")
    session = Session(7, 7, "app", "app", 0, 1, True, [StackEntry(0, NEG - 22, 1), StackEntry(1, NEG - 22, 1)],
                      [addr(ksyms, "__sys_bpf", 0x10), addr(ksyms, "__x64_sys_bpf", 0x1a)], app=app,
                      ustack=(1, 2, 3), user_frames=frames)
    text = session_text(session, funcs, KallsymsSymbolizer(ksyms), 0, calls_view=False)
    header, body = text.split("\n\n", 1)
    assert header.endswith("(app/app) trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id=00f067aa0ba902b7:")
    kernel, user = body.rstrip("\n").split("\n\n")
    assert kernel.splitlines()[0].endswith("__x64_sys_bpf+0x1a")
    assert user.splitlines() == [
        "user stack:",
        "   main+0x40            (app.c:90) [app]",
        "   handle_request+0x16  (app.c:60) [app]",
        "   . load_user          (app.c:41) [app]",
        "   syscall+0x1d         [libc.so.6]"]
    calls = session_text(session, funcs, KallsymsSymbolizer(ksyms), 0, calls_view=True)
    assert "user stack:\n   main+0x40" in calls
    js = session_json(session, funcs, 0)
    assert js["app"] == {"status": "ok", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                         "span_id": "00f067aa0ba902b7", "sampled": True, "attributes": {"http.route": "/u"},
                         "service_name": "shop"}
    assert [f["function"] for f in js["user_stack"]] == ["syscall", "load_user", "handle_request", "main"]
    unlinked = Session(7, 7, "app", "app", 0, 1, True, [], [], app=AppContext("invalid"), ustack_error=14)
    assert "trace_id=" not in render_header(unlinked, 0)
    assert session_json(unlinked, funcs, 0)["app"] == {"status": "invalid"}
    assert "user stack: not captured (EFAULT)" in session_text(unlinked, funcs, KallsymsSymbolizer(ksyms), 0,
                                                               calls_view=False)


def test_kept_stack_layouts_render_what_a_fresh_layout_does(ksyms: Kallsyms) -> None:
    """The console keeps one layout per stack shape; durations and results still come from each session."""
    funcs = funcs_for(ksyms, [("__x64_sys_bpf", RetKind.SIGNED), ("__sys_bpf", RetKind.INT32),
                              ("array_map_alloc_check", RetKind.INT32)])
    probe = [addr(ksyms, name, off, mod) for name, off, mod in KRETPROBE_FRAMES]
    shape_a = [*probe, addr(ksyms, "__sys_bpf", 0x38b), addr(ksyms, "__x64_sys_bpf", 0x1a),
               addr(ksyms, "do_syscall_64", 0x35)]
    shape_b = [*probe, addr(ksyms, "__x64_sys_bpf", 0x1a), addr(ksyms, "do_syscall_64", 0x35)]
    sym = KallsymsSymbolizer(ksyms)
    layouts = StackLayouts(funcs, sym, limit=1)

    def session(kstack: list[int], lats: list[int | None], res: list[int]) -> Session:
        chain = [StackEntry(i, r, lat) for i, (lat, r) in enumerate(zip(lats, res, strict=True))]
        return Session(5, 5, "t", "t", BOOT_START, BOOT_START + 80_000, True, chain, kstack)

    sessions = [session(shape_a, [73_000, 70_000, 8_000], [NEG - 12, NEG - 12, NEG - 22]),
                session(shape_a, [1_234_000, 9_000, None], [NEG - 22, NEG - 22, 0]),
                session(shape_b, [5_000, 4_000, 3_000], [NEG - 1, NEG - 1, NEG - 1]),
                session(shape_a, [2_000, 1_000, 500], [0, 0, NEG - 95])]
    texts = [render_stack(s, funcs, sym, OFFSET, layouts) for s in sessions]
    assert texts == [render_stack(s, funcs, sym, OFFSET) for s in sessions]
    assert "1234us [-EINVAL]" in texts[1] and "... [...]" in texts[1] and "[-EPERM]" in texts[2]
    assert "    70us [-ENOMEM]  __sys_bpf+0x38b\n" in texts[0]  # two shapes: __sys_bpf in the stack,
    assert "!    4us [-EPERM]  __sys_bpf\n" in texts[2]  # and returned before it was taken
    assert list(layouts._kept) == [(tuple(shape_a), (0, 1, 2))]  # shape_b came when the one place was taken


# retsnoop's stacks.* -C keys (issue 35 point 4) on the article's kretprobe stack

ADDRS = StackFormat(emit_addrs=True)
ALL = StackFormat(unfiltered=True, emit_addrs=True)


def _seed(ksyms: Kallsyms):
    funcs = funcs_for(ksyms, [("__x64_sys_bpf", RetKind.SIGNED), ("__sys_bpf", RetKind.INT32),
                              ("array_map_alloc", RetKind.POINTER)])
    chain = [StackEntry(0, NEG - 12, 73_000), StackEntry(1, NEG - 12, 70_000), StackEntry(2, NEG - 12, 50_000)]
    return funcs, seed1_session(ksyms, chain)


def _body(text: str) -> list[str]:
    return text.split("\n\n", 1)[1].rstrip("\n").splitlines()


def test_default_stack_is_unchanged_by_the_default_format(ksyms: Kallsyms) -> None:
    funcs, session = _seed(ksyms)
    sym = seed1_symbolizer(ksyms)
    assert render_stack(session, funcs, sym, OFFSET, fmt=StackFormat()) == render_stack(session, funcs, sym, OFFSET)


def test_emit_addrs_puts_each_frames_address_first(ksyms: Kallsyms) -> None:
    funcs, session = _seed(ksyms)
    rows = _body(render_stack(session, funcs, seed1_symbolizer(ksyms), OFFSET, fmt=ADDRS))
    sys_bpf = addr(ksyms, "__sys_bpf", 0x38b)
    assert rows[3] == f"    73us [-ENOMEM]   {addr(ksyms, '__x64_sys_bpf', 0x1a):016x} __x64_sys_bpf+0x1a" \
                      "                   (kernel/bpf/syscall.c:5067)"
    assert rows[4].startswith(f"    70us [-ENOMEM]   {sys_bpf:016x} __sys_bpf+0x38b ")
    # inlined frames and '!' rows (no frame, so no address) line up under the symbols
    assert rows[5].startswith("                    " + " " * 18 + ". map_create ")
    assert rows[7] == "!   50us [-ENOMEM]  " + " " * 18 + "array_map_alloc"
    assert not any("~" in r for r in rows)  # nothing the filter drops is shown without stacks.unfiltered


def test_unfiltered_keeps_the_tracers_frames_marked_with_emit_addrs(ksyms: Kallsyms) -> None:
    funcs, session = _seed(ksyms)
    sym = seed1_symbolizer(ksyms)
    rows = _body(render_stack(session, funcs, sym, OFFSET, fmt=ALL))
    tracer = [r for r in rows if "~" in r]
    assert len(tracer) == len(KRETPROBE_FRAMES)
    # outermost first, so the innermost (the BPF program) is last among them, right above the '!' rows
    assert re.search(r"~[0-9a-f]{16} bpf_prog_e5d01ee9a8b6fa01_rs_kretprobe\+0x4a", tracer[-1]), tracer
    assert "__kretprobe_trampoline+0x2a" in tracer[0]
    # the chain still lands on the real frames
    assert re.search(r"^    70us \[-ENOMEM\]   [0-9a-f]{16} __sys_bpf\+0x38b", rows[4])
    plain = _body(render_stack(session, funcs, sym, OFFSET, fmt=StackFormat(unfiltered=True)))
    assert "bpf_get_stack+0x1c" in "\n".join(plain) and "~" not in "\n".join(plain)


def test_unfiltered_fentry_site_is_not_taken_for_the_traced_function(ksyms: Kallsyms) -> None:
    """fexit's 'f+0x5, trampoline, f+0x1c': with stacks.unfiltered f+0x5 is shown (marked), and the chain's
    duration stays on f+0x1c."""
    funcs = funcs_for(ksyms, [("__x64_sys_bpf", RetKind.SIGNED)])
    kstack = [addr(ksyms, "__sys_bpf", 0xca0), addr(ksyms, "__x64_sys_bpf", 0x1c),
              addr(ksyms, "bpf_trampoline_6442491234", 0x6f, "bpf"), addr(ksyms, "__x64_sys_bpf", 0x5),
              addr(ksyms, "do_syscall_64", 0x2d)]
    session = Session(1, 1, "t", "t", 0, 1, True, [StackEntry(0, NEG - 22, 5_000)], kstack)
    rows = _body(render_stack(session, funcs, KallsymsSymbolizer(ksyms), 0, fmt=ALL))
    assert [r.split()[-1] for r in rows] == ["do_syscall_64+0x2d", "__x64_sys_bpf+0x5",
                                             "bpf_trampoline_6442491234+0x6f", "__x64_sys_bpf+0x1c", "__sys_bpf+0xca0"]
    assert [r[20] for r in rows] == [" ", "~", "~", " ", " "], rows
    assert rows[3].startswith("     5us [-EINVAL]  ") and not rows[1].strip().startswith("5us")


def test_dec_offs(ksyms: Kallsyms) -> None:
    funcs, session = _seed(ksyms)
    rows = _body(render_stack(session, funcs, seed1_symbolizer(ksyms), OFFSET, fmt=StackFormat(dec_offs=True)))
    assert "__x64_sys_bpf+26 " in rows[3] and "__sys_bpf+907 " in rows[4] and "+0x" not in "".join(rows)


def test_layouts_keep_the_console_format(ksyms: Kallsyms) -> None:
    funcs, session = _seed(ksyms)
    sym = seed1_symbolizer(ksyms)
    layouts = StackLayouts(funcs, sym, fmt=ALL)
    assert render_stack(session, funcs, sym, OFFSET, layouts) == render_stack(session, funcs, sym, OFFSET, fmt=ALL)


def test_session_text_carries_the_stack_format(ksyms: Kallsyms) -> None:
    funcs, session = _seed(ksyms)
    sym = seed1_symbolizer(ksyms)
    text = session_text(session, funcs, sym, OFFSET, calls_view=False, stacks=ALL)
    assert text == render_stack(session, funcs, sym, OFFSET, fmt=ALL)
