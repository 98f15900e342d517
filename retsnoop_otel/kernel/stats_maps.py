"""The capture's statistics maps read as plain data: per-CPU values summed, keys decoded, errno named.

Each reader takes the map (anything with keys/lookup/delete) and the traced functions, so unit tests
drive them with dict-backed fakes and recorded bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from retsnoop_otel.capture import records
from retsnoop_otel.capture.model import (
    CaptureStats,
    FuncStats,
    OriginCount,
    ProgramStats,
    SessionStats,
    TracedFunc,
    WorkloadCount,
    error_type,
)
from retsnoop_otel.kernel import libbpf_progs


class StatsMap(Protocol):
    def keys(self) -> Iterable[bytes]: ...
    def lookup(self, key: bytes, value_size: int | None = None) -> bytes | None: ...
    def delete(self, key: bytes) -> object: ...


def _percpu_sum(raw: bytes, ncpus: int) -> int:
    return sum(struct.unpack(f"<{ncpus}Q", raw[:8 * ncpus]))


def error_name(funcs: Sequence[TracedFunc], func_id: int, err: int) -> str | None:
    """error.type of err_key.err (positive errno, 0 = NULL) for one of our functions; None: not ours."""
    if not 0 <= func_id < len(funcs):
        return None
    return "NULL" if err == 0 else error_type((1 << 64) - err, funcs[func_id].ret) or f"E{err}"


def func_stats(stats_map: StatsMap, err_map: StatsMap, funcs: Sequence[TracedFunc], ncpus: int) -> list[FuncStats]:
    vsize = records.FUNC_STATS.size * ncpus
    errors: dict[int, dict[str, int]] = {}
    for key in list(err_map.keys()):
        raw = err_map.lookup(key, 8 * ncpus)
        if raw is None:
            continue
        fid, err = records.ERR_KEY.unpack(key)
        name = error_name(funcs, fid, err)
        if name is None:
            continue
        errors.setdefault(fid, {})[name] = errors.get(fid, {}).get(name, 0) + _percpu_sum(raw, ncpus)
    out = []
    for f in funcs:
        raw = stats_map.lookup(struct.pack("<I", f.id), vsize)
        if raw is None:
            continue
        calls, _errs, dur, buckets = records.decode_func_stats(raw, ncpus)
        out.append(FuncStats(f.id, calls, errors.get(f.id, {}), tuple(buckets), dur))
    return out


def _counters(counter_map: StatsMap, ncpus: int) -> Iterator[tuple[bytes, int]]:
    """(key, total over the CPUs) of a per-CPU map of u64 counters; a key deleted while read is skipped."""
    for key in list(counter_map.keys()):
        raw = counter_map.lookup(key, 8 * ncpus)
        if raw is not None:
            yield key, _percpu_sum(raw, ncpus)


def workload_counts(wl_map: StatsMap, funcs: Sequence[TracedFunc], ncpus: int) -> list[WorkloadCount]:
    out = []
    for key, total in _counters(wl_map, ncpus):
        cgroup_id, fid, outcome = records.WL_KEY.unpack(key)
        session = bool(fid & records.WL_SESSION)
        fid &= ~records.WL_SESSION
        if session:
            error: str | None = "error" if outcome else None
        elif outcome:
            error = error_name(funcs, fid, outcome - 1)
            if error is None:
                continue
        else:
            error = None
        out.append(WorkloadCount(cgroup_id, fid, session, error, total))
    return out


def origin_counts(origin_map: StatsMap, funcs: Sequence[TracedFunc], ncpus: int) -> list[OriginCount]:
    """Failing sessions by (entry, origin, error) from map origin_stats; keys of another table are skipped."""
    out = []
    for key, total in _counters(origin_map, ncpus):
        entry_id, origin_id, err = records.ORIGIN_KEY.unpack(key)
        name = error_name(funcs, origin_id, err)
        if name is None or not 0 <= entry_id < len(funcs):
            continue
        out.append(OriginCount(entry_id, origin_id, name, total))
    return out


def forget_cgroups(wl_map: StatsMap, cgroup_ids: set[int]) -> None:
    for key in list(wl_map.keys()):
        if records.WL_KEY.unpack(key)[0] in cgroup_ids:
            wl_map.delete(key)


def session_stats(entry_map: StatsMap, funcs: Sequence[TracedFunc], ncpus: int) -> list[SessionStats]:
    vsize = records.FUNC_STATS.size * ncpus
    out = []
    for f in funcs:
        if not f.is_entry:
            continue
        raw = entry_map.lookup(struct.pack("<I", f.id), vsize)
        if raw is None:
            continue
        sessions, errors, dur, buckets = records.decode_func_stats(raw, ncpus)
        out.append(SessionStats(f.id, sessions, errors, tuple(buckets), dur))
    return out


def capture_stats(cap_map: StatsMap, ncpus: int) -> CaptureStats:
    raw = cap_map.lookup(struct.pack("<I", 0), records.CAPTURE_STATS.size * ncpus)
    return records.decode_capture_stats(raw, ncpus) if raw else CaptureStats()


def sum_program_stats(programs: Sequence[tuple[str, int]], read_info: Callable[[int], libbpf_progs.ProgInfo]
                      ) -> list[ProgramStats]:
    """One ProgramStats per program name, in first-seen order: fentry's thousand clones make two series."""
    totals: dict[str, tuple[int, int]] = {}
    for name, fd in programs:
        info = read_info(fd)
        cnt, ns = totals.get(name, (0, 0))
        totals[name] = (cnt + info.run_cnt, ns + info.run_time_ns)
    return [ProgramStats(name, cnt, ns) for name, (cnt, ns) in totals.items()]
