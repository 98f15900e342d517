"""What a probe set counted before a reload replaced it, carried into its successor of the same name.

A reload builds new BPF objects whose counters start at zero. To Prometheus that reads as a restart of
every series, and what was counted after the last scrape before it would be lost; with configs that roll
out by themselves, reloads are routine. So a successor reports its own counts plus its predecessor's, per
function name (ids are each config's own): functions the new config still traces count on from where they
were, functions it dropped leave their series.
"""

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from retsnoop_otel.capture.model import CaptureStats, FuncStats, FuncTable, OriginCount, ProgramStats, SessionStats
from retsnoop_otel.metrics.workload_series import WorkloadTotal

WorkloadKey = tuple[str, str, bool, "str | None"]  # (label value, function name, session, error)
OriginKey = tuple[str, str, str]  # (entry function name, origin function name, error type)


class Totals(NamedTuple):
    """A probe set's counts by function name: its own and everything carried into it (func ids are 0)."""

    funcs: dict[str, FuncStats]
    sessions: dict[str, SessionStats]
    workloads: dict[WorkloadKey, int]
    capture: CaptureStats
    programs: dict[str, ProgramStats]
    sampled_out: int
    filtered_out: int
    evicted: int
    origins: dict[OriginKey, int]


def _name(funcs: FuncTable, func_id: int) -> str | None:
    try:
        return funcs[func_id].name
    except (KeyError, IndexError):
        return None


def _first_ids(funcs: FuncTable) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in (funcs.values() if isinstance(funcs, Mapping) else funcs):
        out.setdefault(f.name, f.id)
    return out


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    return tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n))


def _add_funcs(a: FuncStats, b: FuncStats) -> FuncStats:
    errors = dict(a.errors)
    for err, n in b.errors.items():
        errors[err] = errors.get(err, 0) + n
    return FuncStats(0, a.calls + b.calls, errors, _add(a.duration_buckets, b.duration_buckets),
                     a.duration_sum_ns + b.duration_sum_ns)


def _add_sessions(a: SessionStats, b: SessionStats) -> SessionStats:
    return SessionStats(0, a.sessions + b.sessions, a.error_sessions + b.error_sessions,
                        _add(a.duration_buckets, b.duration_buckets), a.duration_sum_ns + b.duration_sum_ns)


def totals(funcs: FuncTable, func_stats: Iterable[FuncStats], session_stats: Iterable[SessionStats],
           workloads: Iterable[WorkloadTotal], capture: CaptureStats, programs: Iterable[ProgramStats],
           sampled_out: int, filtered_out: int, evicted: int, carried: Totals | None,
           origins: Iterable[OriginCount] = ()) -> Totals:
    """A set's own counts (by its ids) keyed by name, plus what was carried into it."""
    t = carried or Totals({}, {}, {}, CaptureStats(), {}, 0, 0, 0, {})
    by_func = dict(t.funcs)
    for s in func_stats:
        if (name := _name(funcs, s.func_id)) is not None:
            s = s._replace(func_id=0)
            by_func[name] = _add_funcs(by_func[name], s) if name in by_func else s
    by_entry = dict(t.sessions)
    for e in session_stats:
        if (name := _name(funcs, e.entry_func_id)) is not None:
            e = e._replace(entry_func_id=0)
            by_entry[name] = _add_sessions(by_entry[name], e) if name in by_entry else e
    by_workload = dict(t.workloads)
    for w in workloads:
        if (name := _name(funcs, w.func_id)) is not None:
            key = (w.value, name, w.session, w.error)
            by_workload[key] = by_workload.get(key, 0) + w.count
    by_origin = dict(t.origins)
    for o in origins:
        entry, origin = _name(funcs, o.entry_func_id), _name(funcs, o.origin_func_id)
        if entry is not None and origin is not None:
            by_origin[(entry, origin, o.error)] = by_origin.get((entry, origin, o.error), 0) + o.count
    by_prog = dict(t.programs)
    for p in programs:
        old = by_prog.get(p.name)
        by_prog[p.name] = p if old is None else ProgramStats(p.name, old.run_cnt + p.run_cnt,
                                                             old.run_time_ns + p.run_time_ns)
    return Totals(by_func, by_entry, by_workload, CaptureStats(*map(sum, zip(t.capture, capture, strict=True))),
                  by_prog, t.sampled_out + sampled_out, t.filtered_out + filtered_out, t.evicted + evicted, by_origin)


def func_stats(own: list[FuncStats], funcs: FuncTable, carried: Totals | None) -> list[FuncStats]:
    """A successor's function stats: its own, and its predecessor's under the ids of the same names."""
    if carried is None:
        return own
    ids = _first_ids(funcs)
    return own + [s._replace(func_id=ids[name]) for name, s in carried.funcs.items() if name in ids]


def session_stats(own: list[SessionStats], funcs: FuncTable, carried: Totals | None) -> list[SessionStats]:
    if carried is None:
        return own
    ids = _first_ids(funcs)
    return own + [s._replace(entry_func_id=ids[name]) for name, s in carried.sessions.items() if name in ids]


def workload_totals(own: list[WorkloadTotal], funcs: FuncTable, carried: Totals | None) -> list[WorkloadTotal]:
    if carried is None:
        return own
    ids = _first_ids(funcs)
    return own + [WorkloadTotal(value, ids[name], session, error, n)
                  for (value, name, session, error), n in carried.workloads.items() if name in ids]


def origin_counts(own: list[OriginCount], funcs: FuncTable, carried: Totals | None) -> list[OriginCount]:
    """A successor's origin counts: its own, and its predecessor's whose entry and origin it still traces."""
    if carried is None:
        return own
    ids = _first_ids(funcs)
    return own + [OriginCount(ids[entry], ids[origin], err, n) for (entry, origin, err), n in carried.origins.items()
                  if entry in ids and origin in ids]


def program_stats(own: list[ProgramStats], carried: Totals | None) -> list[ProgramStats]:
    if carried is None:
        return own
    return [ProgramStats(p.name, p.run_cnt + c.run_cnt, p.run_time_ns + c.run_time_ns)
            if (c := carried.programs.get(p.name)) else p for p in own]


def capture_stats(own: CaptureStats, carried: Totals | None) -> CaptureStats:
    return own if carried is None else CaptureStats(*map(sum, zip(own, carried.capture, strict=True)))
