"""The processes watched from their exec, for appctx/watch.py: when each is checked next.

Just exec'd, a process has not loaded its libraries (nor a runtime its OTel SDK and publisher), so it is
checked when its exec record is read, then again after EXEC_RECHECK_FIRST_S, doubling up to
EXEC_RECHECK_MAX_S between checks, for EXEC_WATCH_S: until its location is found and settled, or it exits.
The checks due come from a heap ordered by due time; a process that exec'd again, or published meanwhile,
leaves stale entries there, which are skipped.
"""

from __future__ import annotations

import heapq

EXEC_RECHECK_FIRST_S = 0.05  # a process just exec'd: checked when its exec is read, again after this, doubling
EXEC_RECHECK_MAX_S = 1.0  # up to this between checks (a check: 0.1 ms for a small C program, 0.4 ms for Python)
EXEC_WATCH_S = 60.0  # for this long after its exec, unless found (or exited) earlier
MAX_EXEC_WATCHED = 4096  # processes watched at once; an exec beyond is found by its first session instead
EXEC_OUTCOMES = ("located", "not_located", "exited", "error", "skipped")


class Watch:
    """A process watched from its exec: when it is checked next, and how long after that the one after."""

    __slots__ = ("born_at", "due", "interval", "seq", "checks", "located")

    def __init__(self, born_at: float, seq: int) -> None:
        self.born_at = born_at
        self.due = born_at  # the first check: as soon as the exec is read
        self.interval = EXEC_RECHECK_FIRST_S
        self.seq = seq  # its live entry in the schedule (older entries of a re-exec'd pid are skipped)
        self.checks = 0
        self.located = False  # counted and logged as located; checked on only until its location settles


class ExecWatches:
    """The watched processes (`watched`, pid -> Watch) and the schedule of their checks."""

    def __init__(self) -> None:
        self.watched: dict[int, Watch] = {}
        self._schedule: list[tuple[float, int, int]] = []  # heap of (due, seq, tgid)
        self._seq = 0

    def full(self) -> bool:
        return len(self.watched) >= MAX_EXEC_WATCHED

    def start(self, tgid: int, now: float) -> None:
        """Watch the process from its exec, now: its check is due at once (an earlier watch of it is replaced)."""
        self._seq += 1
        w = self.watched[tgid] = Watch(now, self._seq)
        heapq.heappush(self._schedule, (w.due, w.seq, tgid))

    def restart(self, w: Watch) -> None:
        """The intervals start again from EXEC_RECHECK_FIRST_S. Its entry in the schedule goes stale: the
        check that follows (schedule_next()) schedules the next one."""
        self._seq += 1
        w.seq = self._seq
        w.interval = EXEC_RECHECK_FIRST_S

    def pop_due(self, now: float) -> tuple[int, Watch] | None:
        """The process whose check is due first, taken off the schedule; None when no check is due."""
        while self._schedule and self._schedule[0][0] <= now:
            _, seq, tgid = heapq.heappop(self._schedule)
            w = self.watched.get(tgid)
            if w is not None and w.seq == seq:  # else the entry of an earlier exec of the pid
                return tgid, w
        return None

    def again(self, tgid: int, w: Watch) -> None:
        """Back on the schedule, due as it was: a check that ran out of its turn's time goes on at the next turn."""
        heapq.heappush(self._schedule, (w.due, w.seq, tgid))

    def schedule_next(self, tgid: int, w: Watch, now: float) -> bool:
        """Schedule the process's next check, one interval from now (the interval doubles, up to
        EXEC_RECHECK_MAX_S); False, and nothing scheduled, when that is past EXEC_WATCH_S after its exec."""
        w.due = now + w.interval
        w.interval = min(w.interval * 2, EXEC_RECHECK_MAX_S)
        if w.due - w.born_at > EXEC_WATCH_S:
            return False
        heapq.heappush(self._schedule, (w.due, w.seq, tgid))
        return True

    def end(self, tgid: int) -> None:
        del self.watched[tgid]
