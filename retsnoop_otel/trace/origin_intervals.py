"""`trace --origins-interval SECONDS`: the error origins table of each interval, as syscount -i prints its counts.

The kernel's origin counts are cumulative (map origin_stats); an interval's table is what they grew by since the
previous read (render/origin_table.py counts_since), so the intervals' tables add up to the whole run's, which is
printed at stop as without the flag. The reads run on the capture loop's own thread, between two polls
(Runtime.run's after_poll), once the poll's sessions were written and flushed: a table never lands inside a
session, and a stop signal, which only sets a flag, is acted on right after the table as after any poll. The last
interval ends at the stop: its counts are the whole run's, read once the probes are detached. A quiet interval
still prints, in one line (one object with --json), so that a reader tells "no errors" from "no output".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TextIO

from retsnoop_otel.capture.model import FuncTable, OriginCount
from retsnoop_otel.render.origin_table import OriginKey, Span, counts_since, origin_totals, render_origins, rows_of

SetCounts = Iterable[tuple[FuncTable, Iterable[OriginCount]]]  # each probe set's functions and its origin counts


class OriginIntervals:
    """Prints an interval's table each time one is due; `read` gives the probe sets' counts now."""

    def __init__(self, every_s: float, read: Callable[[], SetCounts], out: TextIO, as_json: bool,
                 clock: Callable[[], float], wall_ns: Callable[[], int] = time.time_ns) -> None:
        self.every_s, self._read, self._out, self._json, self._clock = every_s, read, out, as_json, clock
        self._t0, self._wall0 = clock(), wall_ns()  # the spans' wall times follow the monotonic clock from here
        self._start = self._t0
        self._due = self._t0 + every_s
        self._before: dict[OriginKey, int] = {}

    def tick(self) -> None:
        """After each poll: the interval's table once it is due. The next is due one interval after this one was,
        so the intervals do not drift by the poll's lateness; after a stall longer than an interval, one after now."""
        now = self._clock()
        if now < self._due:
            return
        self._due += self.every_s
        if self._due <= now:
            self._due = now + self.every_s
        self._print(origin_totals(self._read()), now, running=True)

    def stop(self, at_stop: SetCounts) -> None:
        """The last interval, up to the stop, from the whole run's counts read after detaching."""
        self._print(origin_totals(at_stop), self._clock(), running=False)

    def _print(self, totals: dict[OriginKey, int], now: float, running: bool) -> None:
        rows = rows_of(counts_since(totals, self._before))
        span = Span(self._wall(self._start), self._wall(now))
        self._before, self._start = totals, now
        print(render_origins(rows, self._json, span, running), end="", file=self._out, flush=True)

    def _wall(self, t: float) -> int:
        return self._wall0 + round((t - self._t0) * 1e9)
