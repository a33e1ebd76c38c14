"""The nemesis: it strikes the campaign's processes at their fault points, as Jepsen's
nemesis does from a schedule.

The processes of a schedule run as actors in this one process (``actors``): each is a set of
threads that say whose they are (``faults.acting_as``) and a database role of their own
(its connections' ``application_name``). What a fault does to an actor is what it does to a
process: ``freeze`` stops every thread of it at the next point it reaches (the lease thread
too, so its lease goes unrenewed) until thawed; ``kill`` freezes it for good and has the
server end its database sessions (their transactions roll back, their locks go, as a dead
client's do), and its threads, released at the end, unwind with ``Killed``. Postgres and the
broker are real processes: they are stopped and continued by signal.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from eventfold.contract import libpq_url
from eventfold.projections import faults
from tests.support.campaign.schedule import Fault

log = logging.getLogger(__name__)


class Killed(BaseException):
    """An actor's thread, released after its actor was killed: it unwinds, doing nothing
    more (no ``except Exception`` catches it)."""


@dataclass
class Struck:
    """A fault that was armed, and when (monotonic seconds) it struck, if it did."""

    fault: Fault
    actor: str
    at: float | None = None


@dataclass
class Nemesis:
    database_url: str
    postgres_pid: int
    broker_pid: int
    struck: list[Struck] = field(default_factory=list)
    _frozen: dict[str, str] = field(default_factory=dict)
    """Actors stopped: ``frozen`` (to be thawed), ``killed``, ``released`` (killed, its
    threads to unwind)."""
    _armed: list[Struck] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    on_kill: Callable[[str], None] = lambda _actor: None
    """Told of each actor killed (after its sessions were ended)."""
    _uninstall: Callable[[], None] | None = None
    _pauses: list[threading.Thread] = field(default_factory=list)

    @contextmanager
    def installed(self) -> Iterator[Nemesis]:
        """The nemesis at every fault point, until the block ends: then every actor is
        thawed or released, and every process it paused continued."""
        self._uninstall = faults.install(self._at_point)
        excepthook = threading.excepthook

        def unwound(args: threading.ExceptHookArgs) -> None:
            if args.exc_type is not Killed:  # a killed actor's thread ends so, as planned
                excepthook(args)

        threading.excepthook = unwound
        try:
            yield self
        finally:
            self._uninstall()
            self.release_all()
            threading.excepthook = excepthook

    def arm(self, fault: Fault, actor: str) -> Struck:
        """Strike ``actor`` with ``fault`` when it next reaches the fault's point."""
        struck = Struck(fault, actor)
        with self._changed:
            self._armed.append(struck)
            self.struck.append(struck)
        return struck

    def disarm(self) -> None:
        """Drop the faults that have not struck."""
        with self._changed:
            self._armed.clear()

    def frozen(self, actor: str) -> bool:
        with self._changed:
            return actor in self._frozen

    def thaw(self, actor: str) -> None:
        with self._changed:
            if self._frozen.get(actor) == "frozen":
                del self._frozen[actor]
                self._changed.notify_all()

    def release_all(self) -> None:
        """Thaw the frozen, let the killed unwind, and wait for the pauses to end."""
        with self._changed:
            self._armed.clear()
            for actor, state in list(self._frozen.items()):
                if state == "frozen":
                    del self._frozen[actor]
                else:
                    self._frozen[actor] = "released"
            self._changed.notify_all()
        for pause in self._pauses:
            pause.join()

    def _at_point(self, point: str, actor: str | None) -> None:
        if actor is None:
            return
        with self._changed:
            hit = next((s for s in self._armed if s.actor == actor
                        and s.fault.point == point), None)
            if hit is not None:
                self._armed.remove(hit)
                hit.at = time.monotonic()
                log.info("nemesis: %s strikes %s at %s (thread %s)", hit.fault.kind, actor, point,
                         threading.current_thread().name)
                self._strike(hit)
            while (state := self._frozen.get(actor)) is not None:
                if state == "released":
                    raise Killed(f"{actor} was killed")
                self._changed.wait()

    def _strike(self, struck: Struck) -> None:
        """Under ``_changed``."""
        fault, actor = struck.fault, struck.actor
        if fault.kind == "freeze":
            self._frozen[actor] = "frozen"
            self._later(fault.hold_s, lambda: self.thaw(actor))
        elif fault.kind == "kill":
            self._frozen[actor] = "killed"
            self._later(0, lambda: (self._end_sessions(actor), self.on_kill(actor)))
        elif fault.kind == "postgres_pause":
            self._pause([self.postgres_pid, *_children(self.postgres_pid)], fault.hold_s)
        elif fault.kind == "broker_pause":
            self._pause([self.broker_pid], fault.hold_s)

    def _later(self, delay_s: float, action: Callable[[], None]) -> None:
        def run() -> None:
            time.sleep(delay_s)
            action()

        thread = threading.Thread(target=run, daemon=True, name="nemesis")
        thread.start()
        self._pauses.append(thread)

    def _pause(self, pids: list[int], hold_s: float) -> None:
        for pid in pids:
            _signal(pid, signal.SIGSTOP)
        self._later(hold_s, lambda: [_signal(pid, signal.SIGCONT) for pid in pids])

    def _end_sessions(self, actor: str) -> None:
        """As the server does when a client dies: every session of ``actor`` ended."""
        with psycopg.connect(libpq_url(self.database_url), autocommit=True) as conn:
            ended = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM "
                                 "pg_stat_activity WHERE application_name = %s",
                                 (actor,)).fetchone()
        log.info("nemesis: %s killed, %s database session(s) ended", actor,
                 ended[0] if ended else 0)


def _signal(pid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Postgres's backends and workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(entry.name))
    return found
