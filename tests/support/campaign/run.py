"""One schedule of the fault campaign, start to end: its processes started (a writer and a
standby of a projection, two runners of a reaction and a process manager), a client sending
commands (each with an id, sent again until answered: the history is what the event store
holds), the nemesis striking as the schedule says, the load stopped, what was broken fixed as
an operator would (a parked key retried), everything caught up, the processes stopped, and
every checker run over what was written."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg

from eventfold import Command, Settings
from eventfold.contract import event_topic
from eventfold.local_stack import LocalStack
from eventfold.outbox.topics import EVENT_TOPIC_CONFIG, TopicAdmin
from eventfold.reactions.parking import request_retry
from eventfold.serving import BackgroundServer
from eventfold.write_model import (
    CommandBus,
    CommandResult,
    DomainError,
    StoreUnavailable,
    StreamNotFound,
)
from tests.support.campaign import app as campaign
from tests.support.campaign.actors import Actor, HostActor, ReactionsActor
from tests.support.campaign.checkers import (
    ReadsAfterWrites,
    connect,
    every_deadline_once,
    every_stamp_once,
    ktable_never_goes_back,
    no_lease_or_lock_left,
    read_ktable,
    sinks_agree,
)
from tests.support.campaign.nemesis import Nemesis, Struck
from tests.support.campaign.schedule import PROJECTION_ACTORS, Schedule
from tests.support.read_api import read_api

log = logging.getLogger(__name__)

CATCH_UP_S = 60.0
"""How long a schedule's processes may take to catch up once the load stopped."""


@dataclass
class Outcome:
    """What one schedule came to."""

    schedule: Schedule
    violations: dict[str, list[str]]
    struck: list[str] = field(default_factory=list)
    unreached: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return any(self.violations.values())

    def describe(self) -> str:
        lines = [f"{self.schedule} ({self.seconds:.1f} s)"]
        lines += [f"  struck: {s}" for s in self.struck]
        lines += [f"  not reached: {s}" for s in self.unreached]
        for invariant, found in self.violations.items():
            lines += [f"  {invariant}: {v}" for v in found[:10]]
        return "\n".join(lines)


class Campaign:
    """Runs schedules on a stack (``settings``, and the ``LocalStack`` it runs on, whose
    Postgres and broker the nemesis pauses), with leases of ``lease_s``."""

    def __init__(self, settings: Settings, stack: LocalStack, lease_s: float = 1.0) -> None:
        self.lease_s = lease_s
        self.settings = settings.model_copy(update={
            "writer_lease_s": lease_s, "trigger_interval": "100 milliseconds",
            "projection_stall_s": 600.0, "reaction_session_timeout_s": 6.0,
            "reaction_max_poll_interval_s": 6.0, "reaction_retry_pause_s": 0.3,
            "reaction_batch_max_events": 50, "metrics": False})
        self.stack = stack
        campaign.campaign_app(campaign.Names("setup")).runtime(self.settings).setup()

    def run(self, schedule: Schedule) -> Outcome:
        started = time.monotonic()
        names = campaign.Names(f"s{abs(schedule.seed)}_{uuid.uuid4().hex[:6]}")
        app = campaign.campaign_app(names)
        TopicAdmin(self.settings.kafka).ensure(
            [event_topic(f"process.{names.process}")], EVENT_TOPIC_CONFIG,
            partitions=self.settings.event_topic_partitions)
        settings = self.settings.model_copy(update={
            "driver_batch_max_rows": 0 if schedule.spark_tasks else 1_000_000})
        actors: dict[str, Actor] = {}
        nemesis = Nemesis(settings.database_url, self.stack.pid_of("postgres"),
                          self.stack.pid_of("broker"),
                          on_kill=lambda name: _named(actors, name).killed())
        prefix = names.suffix
        stuck = lost = ""
        reads: BackgroundServer | None = None
        readers: ReadsAfterWrites | None = None

        def host(role: str, standby: bool) -> Actor:
            actor = HostActor(f"campaign-{prefix}-{role}", role, app=app, settings=settings,
                              projection=names.projection, standby=standby)
            actors[actor.role] = actor.start()
            return actor

        def runners(role: str) -> Actor:
            actor = ReactionsActor(f"campaign-{prefix}-{role}", role, app=app,
                                   settings=settings,
                                   reactions=[names.reaction, names.process])
            actors[actor.role] = actor.start()
            return actor

        broken = f"{prefix}-tab0" if schedule.broken_tab else None
        with connect(settings.database_url) as conn, nemesis.installed():
            if broken:
                campaign.BROKEN_DEADLINES.add(broken)
            try:
                host("writer", standby=False)
                _wait(lambda: _lease_holder(conn, names.projection) is not None,
                      "the writer to take the lease", 120)
                host("standby", standby=True)
                runners("reactions-a")
                runners("reactions-b")
                _wait(lambda: _placed(conn, names), "the reactions to start", 60)
                reads = read_api([app.projections.get(names.projection)], settings,
                                 f"campaign-{prefix}-reads")
                readers = ReadsAfterWrites(reads.url, names)
                with _striking(nemesis, schedule, actors, conn, names):
                    _load(app.runtime(settings).command_bus(), schedule, prefix, readers)
                # As a supervisor would: a killed process starts again (a host as a standby,
                # as an HA pair runs), so a schedule that kills every writer still ends caught
                # up, and a comeback's recovery is judged too.
                for struck in nemesis.struck:
                    if struck.at is not None and struck.fault.kind == "kill":
                        role = _named(actors, struck.actor).role
                        if role in PROJECTION_ACTORS:
                            host(f"{role}-again", standby=True)
                        else:
                            runners(f"{role}-again")
                if broken:
                    campaign.BROKEN_DEADLINES.discard(broken)
                    lost = _retry_when_parked(conn, names.process, broken)
                _wait(lambda: _caught_up(conn, names, prefix), "everything to catch up",
                      CATCH_UP_S)
            except TimeoutError as exc:
                stuck = str(exc)
            finally:
                if broken:
                    campaign.BROKEN_DEADLINES.discard(broken)
                read_back = readers.done() if readers is not None else []
                if reads is not None:
                    reads.stop()
                for actor in actors.values():
                    actor.stop()
                nemesis.release_all()
                for actor in actors.values():
                    actor.join()
            violations = self._check(conn, names, prefix, actors)
            violations["caught_up"] = [stuck] if stuck else []
            violations["reads_after_writes"] = read_back
            violations["every_deadline_once"] += [lost] if lost else []
        killed = {s.actor for s in nemesis.struck if s.at is not None and s.fault.kind == "kill"}
        errors = [f"{a.name}: {type(a.error).__name__}: {a.error}" for a in actors.values()
                  if a.error is not None and a.name not in killed]
        if errors:
            violations["actors_ran"] = errors
        return Outcome(schedule, violations,
                       struck=[f"{s.fault} as {s.actor}" for s in nemesis.struck if s.at],
                       unreached=[str(s.fault) for s in nemesis.struck if not s.at],
                       seconds=time.monotonic() - started)

    def _check(self, conn: psycopg.Connection, names: campaign.Names, prefix: str,
               actors: dict[str, Actor]) -> dict[str, list[str]]:
        table = read_ktable(self.settings.kafka, f"eventfold.ktable.{names.projection}")
        return {
            "ktable_never_goes_back": ktable_never_goes_back(table),
            "sinks_agree": sinks_agree(conn, names, table, prefix),
            "every_stamp_once": every_stamp_once(conn, prefix),
            "every_deadline_once": every_deadline_once(conn, names, prefix),
            "no_lease_or_lock_left": no_lease_or_lock_left(
                conn, names, [a.name for a in actors.values()]),
        }


@contextmanager
def _striking(nemesis: Nemesis, schedule: Schedule, actors: dict[str, Actor],
              conn: psycopg.Connection, names: campaign.Names) -> Iterator[None]:
    """The schedule's faults armed, each at its time after the load began; the block ends
    once every fault that struck has run its course (a freeze thawed, a pause over)."""
    armed: list[Struck] = []

    def arm() -> None:
        began = time.monotonic()
        for fault in sorted(schedule.faults, key=lambda f: f.after_s):
            time.sleep(max(0.0, began + fault.after_s - time.monotonic()))
            actor = _actor_for(fault.target, actors, conn, names)
            armed.append(nemesis.arm(fault, actor.name))

    arming = threading.Thread(target=arm, daemon=True, name="nemesis-arming")
    arming.start()
    try:
        yield
    finally:
        arming.join()
        # The load is over: a fault that struck runs its course; one not struck within its
        # hold after the load would strike a quiet system, and is dropped.
        deadline = time.monotonic() + max((f.hold_s for f in schedule.faults), default=0) + 1
        while time.monotonic() < deadline and any(
                s.at is not None and time.monotonic() < s.at + s.fault.hold_s for s in armed):
            time.sleep(0.1)
        nemesis.disarm()
        for struck in armed:
            if struck.fault.kind == "freeze":
                nemesis.thaw(struck.actor)


def _actor_for(target: str, actors: dict[str, Actor], conn: psycopg.Connection,
               names: campaign.Names) -> Actor:
    """The actor a fault's target names now: ``writer`` is whoever holds the lease (the
    standby, once it took over), ``standby`` the host started as one."""
    if target == "writer":
        holder = _lease_holder(conn, names.projection)
        return next((a for a in actors.values() if a.name == holder), actors["writer"])
    return actors[target]


def _named(actors: dict[str, Actor], name: str) -> Actor:
    return next(actor for actor in actors.values() if actor.name == name)


def _load(bus: CommandBus, schedule: Schedule, prefix: str, readers: ReadsAfterWrites
          ) -> None:
    """The client: rings and tabs, each command with an id of its own and sent again until
    it is answered (the store may pause under it); every fourth ring read back with the
    version it made (``readers``)."""
    rng = random.Random(schedule.seed)
    commands: list[Command] = []
    tabs = [f"{prefix}-tab{n}" for n in range(schedule.tabs)]
    for tab in tabs:
        commands.append(campaign.OpenTab(tab=tab, due_ms=rng.randint(300, 1500)))
    for _ in range(schedule.rings):
        commands.append(campaign.Ring(till=f"{prefix}-till{rng.randrange(schedule.tills)}",
                                      amount=rng.randint(1, 20)))
    for tab in rng.sample(tabs, k=len(tabs) // 2):
        commands.insert(rng.randrange(len(tabs), len(commands) + 1), campaign.CloseTab(tab=tab))
    for number, command in enumerate(commands):
        result = _send(bus, command.model_copy(update={
            "command_id": uuid.UUID(int=rng.getrandbits(128))}))
        if isinstance(command, campaign.Ring) and result is not None and number % 4 == 0:
            readers.wrote(command.till, result.version)
        time.sleep(rng.uniform(0.01, 0.05))


def _send(bus: CommandBus, command: Command, timeout_s: float = 60) -> CommandResult | None:
    """Until answered: a refusal is an answer (None); the store away is not."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return bus.execute(command)
        except (DomainError, StreamNotFound):
            return None
        except (StoreUnavailable, OSError) as exc:
            if time.monotonic() > deadline:
                raise
            log.info("campaign client: %s; sending it again", exc)
            time.sleep(0.2)


def _retry_when_parked(conn: psycopg.Connection, process: str, key: str) -> str:
    """As an operator: once the broken deadline parked its key, ``dlq retry`` it. What went
    wrong, if something did: a deadline neither parked nor fired is lost."""
    deadline = time.monotonic() + CATCH_UP_S
    while time.monotonic() < deadline:
        if request_retry(conn, process, key) is not None:
            return ""
        if _ended(conn, key):
            return ""  # closed before its deadline: nothing was parked
        time.sleep(0.2)
    return f"{key}: its deadline's handler raised, and the key was neither parked nor ended"


def _ended(conn: psycopg.Connection, tab: str) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM events WHERE stream_type = 'Tab' AND stream_id = %s AND "
        "event_type IN ('TabClosed', 'TabExpired')", (tab,)).fetchone()
    return bool(row and row[0])


def _lease_holder(conn: psycopg.Connection, projection: str) -> str | None:
    row = conn.execute(
        "SELECT writer FROM projection_versions WHERE projection = %s", (projection,)
    ).fetchone()
    return None if row is None else row[0]


def _placed(conn: psycopg.Connection, names: campaign.Names) -> bool:
    row = conn.execute(
        "SELECT count(DISTINCT reaction) FROM reaction_positions WHERE reaction = ANY(%s)",
        ([names.reaction, names.process],)).fetchone()
    return bool(row and row[0] == 2)


def _caught_up(conn: psycopg.Connection, names: campaign.Names, prefix: str) -> bool:
    """The read model holds every ring, every round amount is stamped, every tab ended and
    nothing is pending."""
    row = conn.execute(
        f"""SELECT
          (SELECT count(*) FROM events WHERE stream_type = 'Till' AND stream_id LIKE %(p)s),
          (SELECT coalesce(sum(count), 0) FROM "{names.projection}" WHERE key LIKE %(p)s),
          (SELECT count(*) FROM events WHERE stream_type = 'Till' AND stream_id LIKE %(p)s
             AND (data->>'amount')::bigint %% 5 = 0),
          (SELECT count(*) FROM events WHERE stream_type = 'Card' AND stream_id LIKE %(c)s),
          (SELECT count(*) FROM events WHERE stream_type = 'Tab' AND stream_id LIKE %(p)s
             AND event_type = 'TabOpened'),
          (SELECT count(*) FROM events WHERE stream_type = 'Tab' AND stream_id LIKE %(p)s
             AND event_type IN ('TabClosed', 'TabExpired')),
          (SELECT count(*) FROM process_timers WHERE process = %(m)s)
            + (SELECT count(*) FROM process_commands WHERE process = %(m)s)""",
        {"p": f"{prefix}%", "c": f"card-{prefix}%", "m": names.process}).fetchone()
    if row is None:
        return False
    rings, folded, round_amounts, stamps, opened, ended, pending = row
    return rings == folded and stamps >= round_amounts and ended >= opened and not pending


def _wait(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not _quietly(condition):
        if time.monotonic() > deadline:
            raise TimeoutError(f"campaign: timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def _quietly(condition: Callable[[], bool]) -> bool:
    """The condition, False while what it reads is not there yet (a table not made)."""
    try:
        return condition()
    except psycopg.errors.UndefinedTable:
        return False
