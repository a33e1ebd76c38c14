"""Group commit: appends that arrive together share one transaction.

Each command hands its append (a *unit*) to ``submit`` and waits for its own outcome. A
caller that finds a free commit slot leads: it takes its share of the waiting units (split
evenly over the free slots), commits them in one call and hands every caller its outcome.
Units that arrive while a batch commits wait for the next one. A lone command commits at
once on its own thread (a task first lets the event loop run once, so that callers the last
batch woke join it); under load one round trip and one WAL flush serve many commands.

Two units that share a key (a stream, a command id) never go into one batch, nor into two
batches in flight at once: the second waits for the next batch. So each batch can be checked
set-wise, and batches of one process never race each other on a stream.

``GroupCommit`` serves threads, ``AsyncGroupCommit`` asyncio tasks; both batch through one
``BatchQueue``. What a commit does is the caller's ``commit`` function.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from eventfold.write_model.metrics import GROUP_COMMIT_APPENDS

U = TypeVar("U")
R = TypeVar("R")
Outcomes = Sequence["R | Exception"]
Keys = Callable[[U], Iterable[Hashable]]


class _Pending(Protocol[U]):
    unit: U
    keys: frozenset[Hashable]


P = TypeVar("P", bound=_Pending[Any])


class BatchQueue(Generic[P]):
    """Waiting units in arrival order, the keys of the batches in flight, and the commit
    slots: at most ``max_concurrent`` leaders commit at once.

    Not thread-safe by itself: ``GroupCommit`` calls it under its lock, ``AsyncGroupCommit``
    from the event loop only.
    """

    def __init__(self, max_batch: int, max_concurrent: int = 1) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        self.max_batch = max_batch
        self.max_concurrent = max_concurrent
        self.waiting: deque[P] = deque()
        self._in_flight: Counter[Hashable] = Counter()
        self._leaders = 0
        self._committing = 0
        self._committing_units = 0

    def claim_lead(self) -> bool:
        """Take a free commit slot, if there is one."""
        if self._leaders >= self.max_concurrent:
            return False
        self._leaders += 1
        return True

    def release_lead(self) -> None:
        self._leaders -= 1

    def take(self) -> list[P]:
        """The next batch: waiting units in order, skipping any that shares a key with one
        taken or in flight (it stays first in line).

        A batch takes its share of the waiting units, split evenly over the free commit
        slots: callers woken together by one commit then go out as batches in parallel, and
        from then on one batch's callers run their Python while the other batch is in the
        database, instead of all of them waiting on one round trip. Beside batches in flight,
        a batch starts only with at least half as many units as they hold on average: every
        round trip has a fixed cost, and a trickle of single units would pay it each."""
        batch: list[P] = []
        taken: set[Hashable] = set()
        kept: deque[P] = deque()
        if self._committing and 2 * len(self.waiting) * self._committing < self._committing_units:
            return batch  # too few for a round trip of their own: a batch in flight hands on
        free_slots = max(self.max_concurrent - self._committing, 1)
        share = min(self.max_batch, -(-len(self.waiting) // free_slots))
        while self.waiting and len(batch) < share:
            pending = self.waiting.popleft()
            if pending.keys.isdisjoint(taken) and not any(k in self._in_flight
                                                          for k in pending.keys):
                batch.append(pending)
                taken |= pending.keys
            else:
                kept.append(pending)
        kept.extend(self.waiting)
        self.waiting = kept
        self._in_flight.update(taken)
        if batch:
            self._committing += 1
            self._committing_units += len(batch)
            GROUP_COMMIT_APPENDS.observe(len(batch))
        return batch

    def done(self, batch: Sequence[P]) -> None:
        self._committing -= 1
        self._committing_units -= len(batch)
        for pending in batch:
            self._in_flight.subtract(pending.keys)
        self._in_flight += Counter()  # drops the keys that reached zero


def checked(outcomes: Outcomes[R], units: Sequence[object]) -> Outcomes[R]:
    if len(outcomes) != len(units):
        raise RuntimeError(f"commit returned {len(outcomes)} outcomes for {len(units)} units")
    return outcomes


def _interrupted(count: int) -> list[Exception]:
    return [RuntimeError("the commit was interrupted")] * count


# -- threads --------------------------------------------------------------------------------
class _Waiter(Generic[U, R]):
    """One submitted unit. Every change of its state, and every wake-up, happens under the
    GroupCommit's lock; the waiting thread re-reads its state after each wake-up."""

    __slots__ = ("_signaled", "_wake", "done", "keys", "leading", "outcome", "unit")

    def __init__(self, unit: U, keys: frozenset[Hashable]) -> None:
        self.unit = unit
        self.keys = keys
        self.outcome: R | Exception | None = None
        self.done = False
        self.leading = False
        self._signaled = False
        self._wake = threading.Lock()
        self._wake.acquire()

    def wake(self) -> None:
        if not self._signaled:
            self._signaled = True
            self._wake.release()

    def sleep(self, lock: threading.Lock) -> None:
        self._wake.acquire()
        with lock:
            self._signaled = False


class GroupCommit(Generic[U, R]):
    """Batches concurrent ``submit`` calls from threads into calls of ``commit``.

    ``commit(units)`` returns one outcome per unit, in order: a result, or the exception that
    unit's caller gets. If it raises, every unit of the batch gets that exception.
    ``keys(unit)`` names what two units must not share in one batch. ``max_concurrent``
    batches run at once (one connection each).
    """

    def __init__(self, commit: Callable[[Sequence[U]], Outcomes[R]], keys: Keys[U],
                 max_batch: int = 256, max_concurrent: int = 2) -> None:
        self._commit = commit
        self._keys = keys
        self._lock = threading.Lock()
        self._queue: BatchQueue[_Waiter[U, R]] = BatchQueue(max_batch, max_concurrent)

    def submit(self, unit: U) -> R:
        """Commit ``unit`` (with whatever else is waiting) and return its result."""
        waiter: _Waiter[U, R] = _Waiter(unit, frozenset(self._keys(unit)))
        with self._lock:
            self._queue.waiting.append(waiter)
            waiter.leading = self._queue.claim_lead()
        while True:
            if waiter.leading:
                self._lead(waiter)
            if waiter.done:
                break
            waiter.sleep(self._lock)
        if isinstance(waiter.outcome, Exception):
            raise waiter.outcome
        return waiter.outcome  # type: ignore[return-value]

    def _lead(self, own: _Waiter[U, R]) -> None:
        """Commit batches until ``own`` is done, then pass the lead on; step down early when
        every waiting unit shares a key with a batch in flight (its leader passes it on)."""
        while True:
            with self._lock:
                batch = [] if own.done else self._queue.take()
                if not batch:
                    own.leading = False
                    if own.done:
                        self._pass_lead_on()
                    else:
                        self._queue.release_lead()
                    return
            try:
                self._commit_batch(batch)
            except BaseException:
                with self._lock:  # e.g. KeyboardInterrupt: the others must not wait forever
                    own.leading = False
                    self._pass_lead_on()
                raise

    def _pass_lead_on(self) -> None:
        successor = next((w for w in self._queue.waiting if not w.leading), None)
        if successor is None:
            self._queue.release_lead()
        else:
            successor.leading = True  # the count of leaders stays
            successor.wake()

    def _commit_batch(self, batch: list[_Waiter[U, R]]) -> None:
        units = [w.unit for w in batch]
        outcomes: Outcomes[R] = _interrupted(len(batch))
        try:
            outcomes = checked(self._commit(units), units)
        except Exception as exc:  # every caller of the batch gets it
            outcomes = [exc] * len(batch)
        finally:
            with self._lock:
                self._queue.done(batch)
                for waiter, outcome in zip(batch, outcomes, strict=True):
                    waiter.outcome = outcome
                    waiter.done = True
                    waiter.wake()


# -- asyncio --------------------------------------------------------------------------------
class _Submitted(Generic[U, R]):
    __slots__ = ("future", "keys", "unit")

    def __init__(self, unit: U, keys: frozenset[Hashable],
                 future: asyncio.Future[R]) -> None:
        self.unit = unit
        self.keys = keys
        self.future = future


class AsyncGroupCommit(Generic[U, R]):
    """``GroupCommit`` for asyncio tasks: the first ``max_concurrent`` submitters commit the
    waiting units themselves, on the event loop. A leader whose own unit is done while
    others wait hands its slot to a background task that leads them."""

    def __init__(self, commit: Callable[[Sequence[U]], Awaitable[Outcomes[R]]], keys: Keys[U],
                 max_batch: int = 256, max_concurrent: int = 2) -> None:
        self._commit = commit
        self._keys = keys
        self._queue: BatchQueue[_Submitted[U, R]] = BatchQueue(max_batch, max_concurrent)
        self._background: set[asyncio.Task[None]] = set()

    async def submit(self, unit: U) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.waiting.append(_Submitted(unit, frozenset(self._keys(unit)), future))
        if self._queue.claim_lead():
            # One turn of the loop first: callers that the last batch woke get to submit, and
            # commit with this unit instead of after it (else the first of them would often
            # commit alone, and the rest wait for it).
            await asyncio.sleep(0)
            await self._lead(future)
        return await future

    async def _lead(self, own: asyncio.Future[R] | None) -> None:
        """Commit batches until ``own`` is done (a background leader: until none is left).
        Every batch ends with its callers woken, also when the commit is cancelled."""
        batch: list[_Submitted[U, R]] = []
        try:
            while (own is None or not own.done()) and (batch := self._queue.take()):
                await self._commit_batch(batch)
        finally:
            if own is not None and own.done() and self._queue.waiting:
                task = asyncio.get_running_loop().create_task(self._lead(None))
                self._background.add(task)  # the slot passes on; the count of leaders stays
                task.add_done_callback(self._background.discard)
            else:
                # Nothing waits, or all that waits shares a key with a batch in flight,
                # whose leader takes it next.
                self._queue.release_lead()

    async def _commit_batch(self, batch: list[_Submitted[U, R]]) -> None:
        units = [s.unit for s in batch]
        outcomes: Outcomes[R] = _interrupted(len(batch))
        try:
            outcomes = checked(await self._commit(units), units)
        except Exception as exc:  # every caller of the batch gets it
            outcomes = [exc] * len(batch)
        finally:
            self._queue.done(batch)
            for submitted, outcome in zip(batch, outcomes, strict=True):
                _settle(submitted.future, outcome)


def _settle(future: asyncio.Future[R], outcome: R | Exception) -> None:
    if future.done():  # its caller was cancelled
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
