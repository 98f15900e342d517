"""User stacks symbolized off the capture loop, and the sessions that wait for them, in order.

Symbolizing a user stack reads the process's mappings and parses every ELF file it maps (symbol tables: a
quarter of a second for libLLVM on the host) and asks llvm-symbolizer for source lines (a first query per
binary loads its DWARF); under emulation the first stack of a large binary takes tens of seconds. On the
capture loop, that held up every record behind it. Here one worker thread owns the symbolizer:

- `StackWorker.submit` queues a stack (a bounded queue: when it is full the stack is not queued, and that
  is counted), `remember` queues a snapshot of a new process's mappings (taken when no stack waits: a
  stack of a process not yet snapshotted takes the snapshot itself);
- `HeldSessions` keeps the sessions of watched probe sets in the order they ended: one goes out once its
  stack is symbolized, or once it waited `wait_s` (it then goes out without symbols, and says why in
  `Session.ustack_unsymbolized`), and never before the sessions ahead of it. Since every session's wait
  started no later than those behind it, none waits much longer than `wait_s`, whatever is ahead of it.

A stack seen before in the same process (a failing call in a loop) is answered on the loop from the frames
of the last time, so it neither queues behind a slow stack of another process nor loses its symbols to it;
the same stack held twice while the first is queued waits on the same task. A stack whose sessions all went
out without it is skipped by the worker when it has not started; one that has started finishes (it fills the
caches, and its frames answer the process's next identical stack).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from retsnoop_otel.capture.model import Session, UserFrame

MAX_QUEUED = 1024  # stacks waiting for the worker; beyond, a session goes out without symbols (queue_full)
MAX_REMEMBER = 4096  # processes waiting for a snapshot; beyond, their first stack takes it
MAX_KNOWN_PROCS = 1024  # processes whose symbolized stacks are kept to answer their next identical ones
MAX_KNOWN_STACKS = 64  # distinct stacks kept per process
WAIT_S = 1.0  # how long a session waits for its user stack's symbols by default (limits.user_stack_wait_s)
JOIN_S = 1.0  # close() waits this long for a stack in progress, then leaves the (daemon) worker to finish it
REASONS = ("queue_full", "timeout", "error")  # why a session went out without its stack's symbols

T = TypeVar("T")
Frames = tuple[UserFrame, ...]


class UserSymbolizer(Protocol):
    """symbols.user_symbols.UserSymbolizer: used from the worker thread only."""

    def remember(self, pid: int) -> None: ...

    def frames(self, pid: int, addrs: Sequence[int]) -> list[UserFrame]: ...

    def close(self) -> None: ...


class StackJob:
    """One stack for the worker; `done` is set once it is answered (`frames` or `error`) or skipped."""

    __slots__ = ("pid", "addrs", "frames", "error", "skipped", "done", "holders")

    def __init__(self, pid: int, addrs: tuple[int, ...]) -> None:
        self.pid = pid
        self.addrs = addrs
        self.frames: Frames = ()
        self.error = ""
        self.skipped = False  # nobody waited for it any more when its turn came (or the worker closed)
        self.done = threading.Event()
        self.holders = 1  # sessions still waiting for it (changed on the loop only); 0: the worker may skip it

    @property
    def answered(self) -> bool:
        return self.done.is_set() and not self.skipped and not self.error


class StackWorker:
    """The thread that owns the user-space symbolizer. `start=False` leaves it to the caller to run
    `run_one()` (tests drive the real queue step by step)."""

    def __init__(self, symbolizer: UserSymbolizer, max_queued: int = MAX_QUEUED, start: bool = True) -> None:
        self.symbolizer = symbolizer
        self.max_queued = max_queued
        self._stacks: deque[StackJob] = deque()
        self._remember: dict[int, None] = {}  # an insertion-ordered set of pids
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name="retsnoop-user-stacks", daemon=True)
            self._thread.start()

    def submit(self, pid: int, addrs: tuple[int, ...]) -> StackJob | None:
        """Queue a stack; None when the queue is full."""
        with self._cond:
            if len(self._stacks) >= self.max_queued or self._closing:
                return None
            job = StackJob(pid, addrs)
            self._stacks.append(job)
            self._cond.notify()
            return job

    def remember(self, pid: int) -> None:
        """Snapshot a new process's mappings when no stack is waiting, so its stacks resolve after it exits."""
        with self._cond:
            if len(self._remember) < MAX_REMEMBER and not self._closing:
                self._remember[pid] = None
                self._cond.notify()

    def run_one(self, block: bool = False) -> bool:
        """Take one task (stacks first: their sessions wait) and do it; False when there was none to do."""
        with self._cond:
            while True:
                while self._stacks and self._stacks[0].holders <= 0:
                    _skip(self._stacks.popleft())
                if self._stacks:
                    job: StackJob | None = self._stacks.popleft()
                    pid = 0
                    break
                if self._remember:
                    job, pid = None, next(iter(self._remember))
                    del self._remember[pid]
                    break
                if not block or self._closing:
                    return False
                self._cond.wait()
        if job is None:
            try:
                self.symbolizer.remember(pid)
            except Exception:  # noqa: BLE001 - its first stack takes the snapshot instead
                pass
            return True
        try:
            job.frames = tuple(self.symbolizer.frames(job.pid, job.addrs))
        except Exception as exc:  # noqa: BLE001 - the session goes out without its stack's symbols
            job.error = str(exc) or type(exc).__name__
        job.done.set()
        return True

    def _run(self) -> None:
        while self.run_one(block=True):
            pass
        self.symbolizer.close()  # here, in its own thread: a stack in progress may hold it for a while

    def close(self) -> None:
        """Stop taking tasks; the symbolizer closes once the stack in progress (if any) is done."""
        with self._cond:
            self._closing = True
            for job in self._stacks:
                _skip(job)
            self._stacks.clear()
            self._remember.clear()
            self._cond.notify_all()
        if self._thread is None:
            self.symbolizer.close()
        else:
            self._thread.join(JOIN_S)


def _skip(job: StackJob) -> None:
    job.skipped = True
    job.done.set()


class _Held(Generic[T]):
    __slots__ = ("item", "session", "job", "deadline")

    def __init__(self, item: T, session: Session, job: StackJob | None, deadline: float) -> None:
        self.item = item
        self.session = session
        self.job = job
        self.deadline = deadline


class HeldSessions(Generic[T]):
    """Sessions waiting for their user stacks' symbols, released in the order they were held; used from the
    capture loop only.

    `item` travels with each session (the runtime's probe set). Counts of sessions that went out without
    their symbols are kept by reason (REASONS); `on_error` is told of each symbolizer error.
    """

    def __init__(self, worker: StackWorker | None, monotonic: Callable[[], float], wait_s: float = WAIT_S) -> None:
        self.worker = worker
        self.wait_s = wait_s
        self._now = monotonic
        self._line: deque[_Held[T]] = deque()
        self._jobs: dict[tuple[int, tuple[int, ...]], StackJob] = {}  # submitted, frames not yet taken
        self._known: OrderedDict[int, dict[tuple[int, ...], Frames]] = OrderedDict()  # pid -> stack -> frames
        self.unsymbolized = dict.fromkeys(REASONS, 0)
        self.on_error: Callable[[Session, str], None] | None = None

    def __len__(self) -> int:
        return len(self._line)

    def hold(self, item: T, session: Session) -> None:
        """The session behind the others; its user stack answered from what is known or queued for the worker."""
        job = None
        if session.ustack and self.worker is not None:
            frames = self._known_frames(session.pid, session.ustack)
            if frames is not None:
                session.user_frames = frames
            else:
                job = self._job(session.pid, session.ustack)
                if job is None:
                    self._without(session, "queue_full")
        self._line.append(_Held(item, session, job, self._now() + self.wait_s))

    def _known_frames(self, pid: int, addrs: tuple[int, ...]) -> Frames | None:
        key = (pid, addrs)
        job = self._jobs.get(key)
        if job is not None and job.done.is_set():  # answered since its sessions went out (or skipped, or failed)
            del self._jobs[key]
            if job.answered:
                self._keep(job)
        stacks = self._known.get(pid)
        return stacks.get(addrs) if stacks is not None else None

    def _job(self, pid: int, addrs: tuple[int, ...]) -> StackJob | None:
        assert self.worker is not None
        key = (pid, addrs)
        job = self._jobs.get(key)
        if job is not None and job.holders > 0:  # the same stack waits already: both wait for one answer
            job.holders += 1
            return job
        job = self.worker.submit(pid, addrs)
        if job is not None:
            if len(self._jobs) >= 2 * self.worker.max_queued:
                self._prune()
            self._jobs[key] = job
        return job

    def _prune(self) -> None:
        """Jobs whose sessions all went out and whose stacks did not come again: keep what they found."""
        for key, job in list(self._jobs.items()):
            if job.done.is_set():
                del self._jobs[key]
                if job.answered:
                    self._keep(job)

    def _keep(self, job: StackJob) -> None:
        stacks = self._known.get(job.pid)
        if stacks is None or len(stacks) >= MAX_KNOWN_STACKS:
            stacks = self._known[job.pid] = {}
        self._known.move_to_end(job.pid)
        stacks[job.addrs] = job.frames
        while len(self._known) > MAX_KNOWN_PROCS:
            self._known.popitem(last=False)

    def forget(self, pid: int) -> None:
        """The process exited: its pid may come back as another program."""
        self._known.pop(pid, None)

    def due(self, wait: bool = False) -> list[tuple[T, Session]]:
        """The sessions that may go out now, in order. `wait`: all of them, each waiting out what is left
        of its bound (a drain before detaching or at the end)."""
        out: list[tuple[T, Session]] = []
        line = self._line
        while line:
            head = line[0]
            job = head.job
            if job is not None:
                if not job.done.is_set():
                    left = head.deadline - self._now()
                    if left > 0:
                        if not wait:
                            break
                        job.done.wait(left)
                self._settle(head.session, job)
            line.popleft()
            out.append((head.item, head.session))
        return out

    def _settle(self, session: Session, job: StackJob) -> None:
        if job.answered:
            session.user_frames = job.frames
            if self._jobs.get((job.pid, job.addrs)) is job:
                del self._jobs[(job.pid, job.addrs)]
                self._keep(job)
        elif job.done.is_set() and job.error:
            self._without(session, "error")
            if self.on_error is not None:
                self.on_error(session, job.error)
        else:
            job.holders -= 1  # the worker skips it when nobody else waits for it
            self._without(session, "timeout")

    def _without(self, session: Session, reason: str) -> None:
        """The session goes out with its stack's raw addresses and why they are not symbolized."""
        self.unsymbolized[reason] += 1
        session.ustack_unsymbolized = reason
        session.user_frames = tuple(UserFrame(addr, None, 0, None) for addr in session.ustack or ())
