"""The real BPF session logic, loaded into the host kernel and driven through uprobes.

Kernel functions cannot be traced on the development host (see VM.md), but uprobes run the same
kprobe-type programs; attaching them to tests/native/simkern.c checks sessions, error chains,
per-call records and in-kernel aggregates natively and fast. Kernel attach modes run in tests/vm.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from retsnoop_otel.capture.model import RetKind, TracedFunc, format_result
from retsnoop_otel.capture.sessions import SessionAssembler
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.kernel.tracer import Tracer
from retsnoop_otel.symbols.user_funcs import in_binary
from tests.native.simkern_funcs import simkern_funcs, walk
from tests.procs import remove_cgroups

HERE = Path(__file__).parent


def _capture(simkern: tuple[str, ctypes.CDLL], calls: list[tuple[str, int]],
             drive: Callable[[], None] | None = None, pids: list[int] | None = None, **cfg: object):
    """Sessions of `calls` made here, or of what `drive` makes another process (`pids`) do."""
    path, lib = simkern
    funcs = simkern_funcs()
    config = CaptureConfig(mode="", user_mode="uprobe", pids=pids or [os.getpid()], exclude_self=False,
                           **cfg)  # type: ignore[arg-type]
    tracer = Tracer(in_binary(funcs, path), config)
    sessions = []
    assembler = SessionAssembler()
    try:
        tracer.load()
        tracer.attach(strict=True)
        tracer.open_ring_buffer(lambda rec: (s := assembler.feed(rec)) and sessions.append(s))
        for fn, arg in calls:
            getattr(lib, fn)(arg)
        if drive is not None:
            drive()
        while tracer.poll(50):
            pass
        stats = {f.func_id: f for f in tracer.func_stats()}
        cstats = tracer.capture_stats()
    finally:
        tracer.close()
    return funcs, sessions, stats, cstats


def _chain(funcs: list[TracedFunc], session) -> list[tuple[str, str]]:
    return [(funcs[e.func_id].name, format_result(e.result if e.latency_ns is not None else None,
                                                  funcs[e.func_id].ret)) for e in session.chain]


def test_error_chain_passes_over_void_call(simkern):
    funcs, sessions, stats, cstats = _capture(simkern, [("sk_syscall", 0)])
    assert len(sessions) == 1
    s = sessions[0]
    assert s.is_err and s.pid == os.getpid()
    # the main thread: its comm is the process's, read once (tid == tgid)
    assert s.comm == s.proc_comm == Path("/proc/self/comm").read_text().strip()
    assert s.exe_name == Path(os.readlink("/proc/self/exe")).name[:63]
    # sk_log (void) ran between sk_check's error and sk_create's return: the chain survives it
    assert _chain(funcs, s) == [("sk_syscall", "-EINVAL"), ("sk_create", "-EINVAL"), ("sk_check", "-EINVAL")]
    assert all(e.latency_ns and e.latency_ns > 0 for e in s.chain)
    assert s.chain[0].latency_ns >= s.chain[1].latency_ns >= s.chain[2].latency_ns
    assert stats[2].calls == 1 and stats[2].errors == {"EINVAL": 1}
    assert stats[4].calls == 2 and not stats[4].errors  # void never fails
    assert cstats.sessions_started == 1 and cstats.sessions_reported == 1


def test_without_a_metrics_reader_nothing_is_counted_and_the_sessions_are_the_same(simkern):
    """func_counts off (trace without /metrics or an OTLP push): no per-function or per-session counts in
    the kernel, the same error chain."""
    from retsnoop_otel.kernel import stats_maps
    path, lib = simkern
    funcs = simkern_funcs()
    with _attached(path, func_counts=False) as tracer:
        got: list = []
        assembler = SessionAssembler()
        tracer.open_ring_buffer(lambda rec: (s := assembler.feed(rec)) and got.append(s))
        lib.sk_syscall(0)
        while tracer.poll(50):
            pass
        assert tracer.func_stats() == [] and tracer.session_stats() == []
        raw = stats_maps.func_stats(tracer._map("func_stats"), tracer._map("err_stats"), funcs[:1], tracer._ncpus)
        assert [st.calls for st in raw] == [0]  # sk_syscall (id 0, the one slot left) ran but was not counted
    assert _chain(funcs, got[0]) == [("sk_syscall", "-EINVAL"), ("sk_create", "-EINVAL"), ("sk_check", "-EINVAL")]


def test_null_pointer_becomes_enomem(simkern):
    funcs, sessions, stats, _ = _capture(simkern, [("sk_syscall", 500)])
    assert [_chain(funcs, s) for s in sessions] == [
        [("sk_syscall", "-ENOMEM"), ("sk_create", "-ENOMEM"), ("sk_alloc", "NULL")]]
    assert stats[3].errors == {"NULL": 1}


def test_success_sessions_only_with_S(simkern):
    _, sessions, stats, cstats = _capture(simkern, [("sk_syscall", 5)])
    assert sessions == []
    assert cstats.sessions_started == 1 and cstats.sessions_reported == 0
    assert stats[0].calls == 1 and stats[0].errors == {}
    funcs, sessions, _, _ = _capture(simkern, [("sk_syscall", 5)], capture_success=True)
    assert len(sessions) == 1 and not sessions[0].is_err
    # the deepest chain seen in a successful session
    assert _chain(funcs, sessions[0])[0] == ("sk_syscall", "3")
    assert len(sessions[0].chain) == 3


def test_a_threads_next_session_reuses_its_entry_without_leftovers(simkern):
    # one thread, three sessions: the kernel keeps the thread's entry and resets it at each start, so
    # an error, a deeper success and a shallower success must each carry only their own chain and flags
    funcs, sessions, _, cstats = _capture(simkern, [("sk_syscall", 0), ("sk_syscall", 5), ("sk_many", 2)],
                                          capture_success=True)
    assert [s.is_err for s in sessions] == [True, False, False]
    assert _chain(funcs, sessions[0]) == [("sk_syscall", "-EINVAL"), ("sk_create", "-EINVAL"),
                                          ("sk_check", "-EINVAL")]
    assert _chain(funcs, sessions[1])[0] == ("sk_syscall", "3") and len(sessions[1].chain) == 3
    assert [funcs[e.func_id].name for e in sessions[2].chain] == ["sk_many", "sk_flag"]
    assert sessions[0].start_ns < sessions[1].start_ns < sessions[2].start_ns
    assert cstats.sessions_started == 3 and cstats.sessions_reported == 3 and cstats.dropped_sessions == 0


def test_call_records_build_the_call_tree(simkern):
    funcs, sessions, _, _ = _capture(simkern, [("sk_syscall", 5)], emit_calls=True, capture_success=True)
    (s,) = sessions
    (root,) = s.calls
    assert funcs[root.func_id].name == "sk_syscall" and root.result == 3
    names = [funcs[c.func_id].name for c in root.children]
    assert names == ["sk_create", "sk_log"]
    create = root.children[0]
    assert [funcs[c.func_id].name for c in create.children] == ["sk_check", "sk_alloc", "sk_flag"]
    for call in (root, *root.children, *create.children):
        assert call.end_ns is not None and call.end_ns >= call.start_ns
        assert sum(c.duration_ns for c in call.children) <= call.duration_ns
    assert s.dropped_records == 0


def test_calls_outside_sessions_are_ignored(simkern):
    _, sessions, stats, cstats = _capture(simkern, [("sk_check", 0), ("sk_alloc", 500)], emit_calls=True)
    assert sessions == [] and cstats.sessions_started == 0
    assert 2 not in stats or stats[2].calls == 0


def test_depth_beyond_limit_does_not_corrupt(simkern):
    # uretprobes stop at 64 nested returns, so the session depth limit is lowered to show the logic
    funcs, sessions, _, cstats = _capture(simkern, [("sk_recurse", 40), ("sk_syscall", 0)], max_depth=16)
    names = [[funcs[e.func_id].name for e in s.chain] for s in sessions]
    assert names == [["sk_recurse"] * 16, ["sk_syscall", "sk_create", "sk_check"]]
    deep = sessions[0]
    # levels past the limit are not recorded; the recorded levels still get their results and latencies
    assert all(e.latency_ns is not None for e in deep.chain)
    assert format_result(deep.chain[0].result, RetKind.INT32) == "-E2BIG"
    assert cstats.incomplete_sessions == 0


def test_ring_buffer_overflow_is_counted(simkern):
    funcs, sessions, _, cstats = _capture(simkern, [("sk_syscall", 5)] * 400, emit_calls=True,
                                          capture_success=True, ringbuf_size=4096)
    assert cstats.dropped_records > 0 or cstats.dropped_sessions > 0
    assert len(sessions) < 400


def test_pid_filter_excludes_other_processes(simkern):
    path, lib = simkern
    funcs = simkern_funcs()
    tracer = Tracer(in_binary(funcs, path), CaptureConfig(mode="", user_mode="uprobe", pids=[os.getpid() + 100000],
                                         exclude_self=False))
    try:
        tracer.load()
        tracer.attach(strict=True)
        lib.sk_syscall(0)
        assert tracer.capture_stats().sessions_started == 0
    finally:
        tracer.close()


def test_exe_name_follows_an_exec_of_the_same_thread(simkern, tmp_path):
    """The exe name is the one of the program that ran the session: an exec between two sessions of one
    thread (same tid, so the same entry in the kernel's sessions map) gives the later ones the new name.
    Any reuse of the name across a thread's sessions must keep this."""
    path, _ = simkern
    first, second = tmp_path / "exec-first", tmp_path / "exec-second-program"
    subprocess.run(["gcc", "-O1", "-o", str(first), str(HERE / "exec_twice.c"), "-ldl"], check=True)
    second.write_bytes(first.read_bytes())
    second.chmod(0o755)
    child = subprocess.Popen([str(first), path, str(second)], stdin=subprocess.PIPE)

    def drive() -> None:
        child.communicate(b"go\n", timeout=30)  # the child waits for the tracer to be attached
        assert child.returncode == 0

    try:
        _, sessions, _, _ = _capture(simkern, [], drive, pids=[child.pid])
    finally:
        child.kill()
    assert [(s.tid, s.exe_name) for s in sessions] == [(child.pid, first.name)] * 2 + [(child.pid, second.name)] * 2


def test_attach_failure_leaves_nothing_attached(simkern):
    path, _ = simkern
    funcs = [*in_binary([TracedFunc(0, "sk_syscall", 0, RetKind.SIGNED, True)], path),  # attached, then undone
             TracedFunc(1, "past_the_file", 0, RetKind.INT32, False, binary=path, offset=1 << 30)]  # refused
    tracer = Tracer(funcs, CaptureConfig(mode="", user_mode="uprobe"))
    tracer.load()
    with pytest.raises(lb.LibbpfError):
        tracer.attach(strict=True)
    assert tracer._links == []
    tracer.close()


@contextlib.contextmanager
def _attached(path: str, **cfg: object) -> Iterator[Tracer]:
    """This process's sessions of _funcs() captured (no reader unless the test opens one)."""
    tracer = Tracer(in_binary(simkern_funcs(), path), CaptureConfig(mode="", user_mode="uprobe", pids=[os.getpid()],
                                            exclude_self=False, **cfg))  # type: ignore[arg-type]
    try:
        tracer.load()
        tracer.attach(strict=True)
        yield tracer
    finally:
        tracer.close()


def test_a_sleeping_reader_is_woken_once_a_batch_waits_not_per_record(simkern):
    """rb_wakeup() in retsnoop.bpf.c: no wakeup below 1/16 of the ring buffer (4 KiB of 64 KiB here),
    one when a record crosses it. Session end records take about 1.9 KiB: the third crosses."""
    import threading
    import time
    path, lib = simkern
    got: list = []
    with _attached(path, ringbuf_size=64 << 10) as tracer:
        tracer.open_ring_buffer(got.append)
        polled: dict = {}
        reader = threading.Thread(target=lambda: polled.setdefault("n", tracer.poll(60_000)), daemon=True)
        reader.start()
        time.sleep(0.5)  # asleep in epoll_wait on an empty ring buffer
        lib.sk_syscall(0)
        reader.join(2.0)
        assert reader.is_alive() and got == []  # one record waits: no wakeup, read at the timeout
        lib.sk_syscall(0)
        lib.sk_syscall(0)
        reader.join(30.0)  # far below the 60 s timeout: only a wakeup ends the wait this early
        assert not reader.is_alive() and polled["n"] == len(got) == 3


def _irq_work_interrupts() -> int | None:
    for line in Path("/proc/interrupts").read_text().splitlines():
        if line.strip().startswith("IWI:"):
            return sum(int(x) for x in line.split()[1:] if x.isdigit())
    return None


def test_a_lagging_reader_costs_the_traced_thread_no_wakeup_per_record(simkern):
    """Past the mark, with the reader not yet run, the records must not force a wakeup (an irq_work and
    its interrupt) each: 2,000 sessions (3.8 MB) cross the 512 KiB marks 7 times. The build that forced
    one per record past the mark raised 1,716 IRQ work interrupts here."""
    if _irq_work_interrupts() is None:
        pytest.skip("this kernel's /proc/interrupts has no IRQ work (IWI) counter")
    path, lib = simkern
    with _attached(path) as tracer:
        tracer.open_ring_buffer(lambda _rec: None)
        before = _irq_work_interrupts()
        for _ in range(2000):
            lib.sk_syscall(0)
        after = _irq_work_interrupts()
        assert tracer.capture_stats().sessions_reported == 2000
    assert after - before < 200, after - before  # 7 wakeups, plus whatever else the machine queued


def test_own_process_is_excluded_by_default(simkern):
    path, lib = simkern
    tracer = Tracer(in_binary(simkern_funcs(), path), CaptureConfig(mode="", user_mode="uprobe"))
    try:
        tracer.load()
        tracer.attach(strict=True)
        lib.sk_syscall(0)
        assert tracer.capture_stats().sessions_started == 0
    finally:
        tracer.close()


def test_session_aggregates_per_entry_function(simkern):
    path, lib = simkern
    with _attached(path) as tracer:
        for v in (0, 5, 500, 7):
            lib.sk_syscall(v)
        stats = {s.entry_func_id: s for s in tracer.session_stats()}
    s = stats[0]  # sk_syscall
    assert (s.sessions, s.error_sessions) == (4, 2)
    assert sum(s.duration_buckets) == 4 and s.duration_sum_ns > 0


def test_a_single_call_lands_in_the_log2_bucket_of_its_duration(simkern):
    """The kernel side's branch-free log2: with one call, the duration sum is that call's duration."""
    funcs, _, stats, _ = _capture(simkern, [("sk_syscall", 0)])
    once = [st for st in stats.values() if st.calls == 1]
    assert len(once) >= 3, stats
    for st in once:
        expected = min(st.duration_sum_ns.bit_length() - 1, len(st.duration_buckets) - 1)
        nonzero = [i for i, n in enumerate(st.duration_buckets) if n]
        assert nonzero == [expected], (funcs[st.func_id].name, st.duration_sum_ns, nonzero)


def test_call_records_leave_room_for_the_session_end_record(simkern):
    """A 4 KiB ring buffer and one session of 40 nested calls (80 call records, ~3.8 KiB): the call records
    overflow, but the headroom they leave lets the session's end record through, gaps counted and shown."""
    from retsnoop_otel.render.calls import render_calls

    funcs, sessions, _, cstats = _capture(simkern, [("sk_recurse", 40)], emit_calls=True, capture_success=True,
                                          ringbuf_size=4096)
    assert len(sessions) == 1, cstats
    (s,) = sessions
    assert cstats.dropped_records > 0 and cstats.dropped_sessions == 0
    assert s.dropped_records == cstats.dropped_records
    table = render_calls(s, {f.id: f for f in funcs})
    assert f"missing {s.dropped_records} records" in table or "‼ ... missing" in table, table
    kept = sum(1 for _ in walk(s.calls))
    assert 0 < kept < 40


def test_lbr_snapshot_travels_with_the_session(simkern):
    """--lbr's kernel side: every exit snapshots the branch stack first, the deepest failing return keeps
    it, and it arrives right before the session end. This host has no LBR, so the helper's own answer
    (an error, or no records) is what travels; the layout and the choice of exit are what is checked."""
    from retsnoop_otel.kernel import bpfsys
    types = bpfsys.PERF_SAMPLE_BRANCH_KERNEL | bpfsys.PERF_SAMPLE_BRANCH_ANY_RETURN
    funcs, sessions, _, _ = _capture(simkern, [("sk_syscall", 0), ("sk_syscall", 5)], emit_calls=True,
                                     lbr_branch_types=types, lbr_perf_events=False)
    (s,) = sessions  # the successful call is not reported, nor is its snapshot
    assert s.lbr is not None
    # taken at sk_check's exit: the deepest failing return (depth 2), not at its failing parents'
    assert funcs[s.lbr.func_id].name == "sk_check" and s.lbr.depth == 2
    check = s.calls[0].children[0].children[0]
    assert funcs[check.func_id].name == "sk_check" and s.lbr.exit_ns == check.end_ns
    assert s.lbr.error > 0 or s.lbr.branches == ()


def test_no_lbr_record_without_lbr(simkern):
    _, sessions, _, _ = _capture(simkern, [("sk_syscall", 0)])
    assert len(sessions) == 1 and sessions[0].lbr is None


def test_cgroup_filter_keeps_tasks_in_the_cgroup_and_below(simkern, tmp_path):
    """--cgroup CG matches tasks in CG and in any cgroup under it (containers nest), and nothing else."""
    import sys

    from retsnoop_otel.runtime.environment import cgroup2_mount, cgroup_target
    path, _lib = simkern
    parent = Path(cgroup2_mount()) / f"rsotel-native-{os.getpid()}"
    child = parent / "child"
    child.mkdir(parents=True)
    script = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); sys.stdin.readline(); "
              "lib.sk_syscall(0); print('done', flush=True)")
    procs = []
    try:
        for where in (child, None):  # one task below the filter's cgroup, one outside it
            p = subprocess.Popen([sys.executable, "-c", script, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
            procs.append(p)
            if where is not None:
                (where / "cgroup.procs").write_text(f"{p.pid}\n")
        cg_id, level = cgroup_target(str(parent))
        assert level >= 1
        tracer = Tracer(in_binary(simkern_funcs(), path), CaptureConfig(mode="", user_mode="uprobe", cgroup_id=cg_id,
                                                cgroup_level=level))
        sessions, assembler = [], SessionAssembler()
        try:
            tracer.load()
            tracer.attach(strict=True)
            tracer.open_ring_buffer(lambda rec: (s := assembler.feed(rec)) and sessions.append(s))
            for p in procs:
                p.communicate("go\n", timeout=60)
            while tracer.poll(50):
                pass
        finally:
            tracer.close()
        assert [s.pid for s in sessions] == [procs[0].pid], [(s.pid, s.comm) for s in sessions]
    finally:
        for p in procs:
            p.kill()
        remove_cgroups((child, parent), tries=50, wait_s=0.1)


def test_concurrent_sessions_on_many_threads_do_not_mix(simkern):
    """Sessions are per thread: eight threads failing and succeeding at once each get their own chain."""
    import threading
    path, lib = simkern
    funcs = simkern_funcs()
    tracer = Tracer(in_binary(funcs, path), CaptureConfig(mode="", user_mode="uprobe", pids=[os.getpid()],
                                                          exclude_self=False, capture_success=True, emit_calls=True))
    sessions, assembler = [], SessionAssembler()
    arg_of: dict[int, int] = {}
    barrier = threading.Barrier(8)

    def worker(arg: int) -> None:
        arg_of[threading.get_native_id()] = arg
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(f"sk-worker-{arg}")
        barrier.wait()
        for _ in range(25):
            lib.sk_syscall(arg)

    try:
        tracer.load()
        tracer.attach(strict=True)
        tracer.open_ring_buffer(lambda rec: (s := assembler.feed(rec)) and sessions.append(s))
        threads = [threading.Thread(target=worker, args=(arg,)) for arg in (0, 5, 500, 0, 5, 500, 0, 5)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            tracer.poll(20)
        while tracer.poll(50):
            pass
        cstats = tracer.capture_stats()
    finally:
        tracer.close()
    main_comm = Path("/proc/self/comm").read_text().strip()
    exe = Path(os.readlink("/proc/self/exe")).name[:63]
    want = {0: [("sk_syscall", "-EINVAL"), ("sk_create", "-EINVAL"), ("sk_check", "-EINVAL")],
            500: [("sk_syscall", "-ENOMEM"), ("sk_create", "-ENOMEM"), ("sk_alloc", "NULL")],
            5: [("sk_syscall", "3"), ("sk_create", "3"), ("sk_check", "0")]}
    assert len(sessions) == 8 * 25 and cstats.incomplete_sessions == 0 and cstats.dropped_sessions == 0
    for s in sessions:
        arg = arg_of[s.tid]
        assert _chain(funcs, s)[0] == want[arg][0] and len(s.chain) == 3, (arg, _chain(funcs, s))
        if arg != 5:
            assert _chain(funcs, s) == want[arg]
        # a thread's own name, its process's (the main thread's), and the executable's file name
        assert (s.comm, s.proc_comm, s.exe_name) == (f"sk-worker-{arg}", main_comm, exe), (s.comm, s.proc_comm)
        (root,) = s.calls  # the call tree holds this thread's calls only
        assert [funcs[c.func_id].name for c in root.children] == ["sk_create", "sk_log"]
        assert all(c.start_ns >= s.start_ns and c.end_ns <= s.end_ns for c in walk(s.calls))


def test_workload_counts_per_cgroup_and_forgetting_a_gone_cgroup(simkern):
    """workload_stats: calls by outcome and sessions are counted per cgroup v2 of the session's thread."""
    import sys

    from retsnoop_otel.runtime.environment import cgroup2_mount
    path, _lib = simkern
    parent = Path(cgroup2_mount()) / f"rsotel-wl-{os.getpid()}"
    groups = [parent / "a", parent / "b"]
    for g in groups:
        g.mkdir(parents=True)
    ids = [g.stat().st_ino for g in groups]  # a cgroup v2 id is its directory's inode number
    script = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); sys.stdin.readline(); "
              "[lib.sk_syscall(int(a)) for a in sys.argv[2:]]; print('done', flush=True)")
    funcs = simkern_funcs()
    tracer = Tracer(in_binary(funcs, path), CaptureConfig(mode="", user_mode="uprobe", workload_stats=True))
    procs = []
    try:
        tracer.load()
        tracer.attach(strict=True)
        for where, args in ((groups[0], ["0", "0", "5"]), (groups[1], ["500"])):
            p = subprocess.Popen([sys.executable, "-c", script, path, *args], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            procs.append(p)
            (where / "cgroup.procs").write_text(f"{p.pid}\n")
        for p in procs:
            p.communicate("go\n", timeout=60)
        got = {(c.cgroup_id, funcs[c.func_id].name, c.session, c.error): c.count for c in tracer.workload_counts()}
        a, b = ids
        assert {k: n for k, n in got.items() if k[0] == a and k[1] in ("sk_syscall", "sk_check")} == {
            (a, "sk_syscall", False, "EINVAL"): 2, (a, "sk_syscall", False, None): 1,
            (a, "sk_check", False, "EINVAL"): 2, (a, "sk_check", False, None): 1,
            (a, "sk_syscall", True, "error"): 2, (a, "sk_syscall", True, None): 1}
        assert got[(b, "sk_alloc", False, "NULL")] == 1 and got[(b, "sk_syscall", True, "error")] == 1
        assert {k[0] for k in got} == {a, b}
        assert tracer.capture_stats().workload_dropped == 0
        tracer.forget_cgroups({b})
        assert {c.cgroup_id for c in tracer.workload_counts()} == {a}
    finally:
        tracer.close()
        for p in procs:
            p.kill()
        remove_cgroups((*groups, parent), tries=50, wait_s=0.1)
