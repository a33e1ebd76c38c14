"""The processes of a schedule, as actors in this one process: projection hosts (a writer and
a standby) and reaction runners, each on threads of its own, with a database role of its own
(its connections' ``application_name``, which the nemesis ends the sessions of) and a name its
threads give fault points (``faults.acting_as``).

A host here is the CLI's ``projection run`` (``ProjectionHost``), with the lease holder its
actor's name; runners are ``reaction run``'s (``Runtime.run_reactions``)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

from eventfold import Eventfold, Settings
from eventfold.projections.host import ProjectionHost
from eventfold.reactions.runner import POLL_WAIT_S, ReactionRunner
from tests.support.campaign.nemesis import Killed

log = logging.getLogger(__name__)


def as_actor(settings: Settings, actor: str) -> Settings:
    """``settings`` whose database connections carry ``actor`` as their application name."""
    separator = "&" if "?" in settings.database_url else "?"
    return settings.model_copy(update={
        "database_url": f"{settings.database_url}{separator}application_name={quote(actor)}"})


@dataclass
class Actor:
    """One process of the schedule: a name, and the thread its work runs on."""

    name: str
    role: str
    thread: threading.Thread | None = None
    error: BaseException | None = None

    def _run(self, work: object) -> None:
        try:
            work()  # type: ignore[operator]
        except Killed:
            pass
        except BaseException as exc:  # said at the end: an actor must not die silently
            log.exception("actor %s failed", self.name)
            self.error = exc

    def start(self) -> Actor:
        self.thread = threading.Thread(target=self._run, args=(self._work,), daemon=True,
                                       name=f"actor-{self.name}")
        self.thread.start()
        return self

    def _work(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def killed(self) -> None:
        """Struck by a kill: what a process's death does beyond stopping its threads."""

    def join(self, timeout_s: float = 60) -> None:
        if self.thread is not None:
            self.thread.join(timeout_s)


@dataclass
class HostActor(Actor):
    """``projection run NAME`` (``--standby`` for a standby)."""

    app: Eventfold | None = None
    settings: Settings | None = None
    projection: str = ""
    standby: bool = False
    host: ProjectionHost | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        assert self.app is not None and self.settings is not None
        runtime = self.app.runtime(as_actor(self.settings, self.name))
        self.host = runtime.projection_host([self.projection], standby=self.standby,
                                            holder=self.name)

    def _work(self) -> None:
        assert self.host is not None
        self.host.run()

    def stop(self) -> None:
        assert self.host is not None
        self.host.stop_requested.set()


@dataclass
class ReactionsActor(Actor):
    """``reaction run NAME...``: its runners on one event loop, with one command bus, as
    ``Runtime.run_reactions`` runs them."""

    app: Eventfold | None = None
    settings: Settings | None = None
    reactions: Sequence[str] = ()
    stopping: threading.Event = field(default_factory=threading.Event, init=False)
    runners: list[ReactionRunner] = field(default_factory=list, init=False)

    def _work(self) -> None:
        assert self.app is not None and self.settings is not None
        runtime = self.app.runtime(as_actor(self.settings, self.name))

        async def run_all() -> None:
            bus = runtime.async_command_bus()
            async with bus.repository.store:
                self.runners = [runtime.reaction_runner(name, bus, self.name)
                                for name in self.reactions]
                await asyncio.gather(*(runner.run(self.stopping) for runner in self.runners))

        asyncio.run(run_all())

    def killed(self) -> None:
        """As a process's death closes its connections: the broker drops its consumers
        (here they would heartbeat on, from threads the nemesis does not stop). Once a poll
        under way on an executor thread has returned (the loop that would start the next is
        stopped)."""
        time.sleep(2 * POLL_WAIT_S)
        for runner in self.runners:
            if runner.consumer is not None:
                try:
                    runner.consumer.close()
                except Exception:
                    # its revoke callback saves positions on a session the nemesis ended; a
                    # dead process would not have run it, and the consumer is closed anyway
                    log.debug("%s: a callback failed as its consumer closed", self.name,
                              exc_info=True)

    def stop(self) -> None:
        self.stopping.set()
