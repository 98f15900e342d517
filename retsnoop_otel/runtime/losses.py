"""The periodic loss summary: one log line with what was lost since the last one, so a long-running agent
says when it starts dropping sessions, records or spans without logging each loss."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from retsnoop_otel.runtime.sinks import Sinks


def losses(probe_sets: Iterable[Any], sinks: Sinks | None) -> dict[str, int]:
    """The run's loss counters so far, by name (probe sets' kernel counters, the sinks' dropped spans)."""
    out: dict[str, int] = {}
    for ps in probe_sets:
        try:
            cap = ps.capture_stats()
        except Exception:  # noqa: BLE001 - a summary is not worth failing the loop
            continue
        out[f"{ps.name}.sessions_dropped"] = cap.dropped_sessions
        out[f"{ps.name}.records_lost"] = cap.dropped_records
    if sinks is not None:
        for cause, n in sinks.totals().spans_dropped.items():
            out[f"spans_dropped.{cause}"] = n
    return out


class LossSummary:
    def __init__(self) -> None:
        self._reported: dict[str, int] = {}

    def grown(self, now: dict[str, int], last_errors: list[str]) -> dict[str, Any]:
        """The counters that grew since the last call (empty: nothing to say), with the last export error
        when spans failed to export."""
        grown: dict[str, Any] = {k: v - self._reported.get(k, 0) for k, v in now.items()
                                 if v > self._reported.get(k, 0)}
        self._reported.update(now)
        if grown and last_errors and "spans_dropped.export_failed" in grown:
            grown["last_export_error"] = last_errors[0]
        return grown
