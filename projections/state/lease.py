"""One writer per projection: the lease a runner of a projection's active version holds on
its ``projection_versions`` row (migration 0019), as Kafka Streams' exactly-once gives each
task one producer epoch.

The lease has a holder (a process), an epoch that grows with each taking of it, and a
renewal time, and says how long it lasts unrenewed (the holder's own setting, so that a
standby configured shorter does not take over from a live holder). A runner takes it when it
starts (refused while another live holder has it: ``WriterBusy``, which names that holder; a
standby waits for it instead), renews it on a thread of its own, and lets it go when it
stops, so that a standby takes over at once.

What fences a holder that lost the lease is in the database, never its own clock:

- every commit of the active version checks the epoch under the registry row it already
  locks (``catalog.claim_batch``);
- every task (and the driver, for a batch it folds) commits its Kafka transaction only
  while it holds the projection's fence lock shared, with the epoch checked under it
  (``guard_kafka_commit``); taking the lease takes that lock exclusively, so a takeover
  waits for the commits under way, and no task of the old holder commits after it. The
  server ends a session that stays inside that check for a whole lease (a frozen task), so
  a takeover never waits on one for longer;
- the new holder then fences at the broker every transactional id any holder's tasks may
  have used (``writer_slots``): whatever an old task still has open is aborted.

A holder that could not renew for a whole lease (paused, or cut off from the database) takes
itself for fenced: it stops before its next batch, on a clock that counts a suspend too.

It imports only the contract and psycopg.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql

from eventfold.contract import libpq_url
from eventfold.projections.faults import acting_as, crash_point

log = logging.getLogger(__name__)

LEASE_S = 10.0
"""How long a lease lasts unrenewed (``EVENTFOLD_WRITER_LEASE``): a holder renews it three
times within it, and a standby takes over this long after a holder's death."""

PROCESS_HOLDER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
"""This process as a holder: a runner started again in the same process takes the lease
over from the one before it (with a new epoch, fencing it)."""

VERSIONS_TABLE = "projection_versions"
"""The projections' registry (``catalog``), whose rows hold the leases."""
_TABLE = sql.Identifier(VERSIONS_TABLE)
_FENCE = "eventfold.fence:"
"""The prefix of a projection's fence lock (an advisory lock on the name's hash)."""
_EXPIRED = sql.SQL("writer_renewed_at <= now() - make_interval(secs => coalesce("
                   "writer_lease_s, %s))")
"""A lease unrenewed for as long as its holder said it lasts (the caller's setting for a
lease taken before holders said so)."""
_SERVER_SECONDS = sql.SQL("extract(epoch FROM clock_timestamp() - now())")
"""How long the statement has run on the server since its transaction began (``now()``)."""


def lease_clock() -> float:
    """Seconds on a clock that goes on across a suspend: a resumed VM sees its lease as old
    as it is (``time.monotonic`` stops while the machine sleeps)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class WriterBusy(RuntimeError):
    """Another live runner writes the projection: this one is refused."""

    def __init__(self, projection: str, holder: str, renewed_at: datetime | None) -> None:
        self.holder = holder
        self.renewed_at = renewed_at
        when = "" if renewed_at is None else f" (renewed {renewed_at:%H:%M:%S %Z})"
        super().__init__(
            f"projection {projection} is written by {holder}{when}; one runner writes a "
            f"projection. Stop that one first, or start this one with --standby to take "
            f"over when it ends")


class WriterFenced(RuntimeError):
    """The lease went to another runner: this one stops writing."""

    def __init__(self, projection: str, holder: str | None, epoch: int | None,
                 mine: bool = False) -> None:
        self.holder = holder
        taken = (f"a newer run of it in this process took it over (epoch {epoch}), this one "
                 f"having been given up as stalled" if holder and mine
                 else f"{holder} took it over (epoch {epoch})" if holder
                 else "it was let go or could not be renewed in time")
        super().__init__(f"projection {projection}: this runner lost its writer lease: "
                         f"{taken}")


@dataclass(frozen=True)
class Writer:
    """Who holds a projection's lease now."""

    holder: str | None
    epoch: int
    renewed_at: datetime | None
    live: bool


def writer_of(conn: psycopg.Connection, projection: str, lease_s: float = LEASE_S
              ) -> Writer | None:
    """The projection's lease as it stands (None: the projection never ran)."""
    row = conn.execute(sql.SQL(
        "SELECT writer, writer_epoch, writer_renewed_at, coalesce(NOT {expired}, false) "
        "FROM {table} WHERE projection = %s").format(expired=_EXPIRED, table=_TABLE),
        (lease_s, projection)).fetchone()
    return None if row is None else Writer(row[0], int(row[1]), row[2], bool(row[3]))


def live_writers(conn: psycopg.Connection, lease_s: float = LEASE_S) -> dict[str, str]:
    """Each projection a live runner writes, and that runner (``holder``)."""
    rows = conn.execute(sql.SQL(
        "SELECT projection, writer FROM {table} WHERE writer IS NOT NULL AND NOT {expired}"
    ).format(table=_TABLE, expired=_EXPIRED), (lease_s,)).fetchall()
    return {str(projection): str(writer) for projection, writer in rows}


def epoch_is(conn: psycopg.Connection, projection: str, epoch: int) -> None:
    """Raise ``WriterFenced`` unless the lease is still at ``epoch`` (a look before a task
    takes its transactional id: a task of a runner fenced meanwhile takes none from the new
    holder's tasks)."""
    row = conn.execute(sql.SQL("SELECT writer, writer_epoch FROM {} WHERE projection = %s")
                       .format(_TABLE), (projection,)).fetchone()
    if row is None or int(row[1]) != epoch:
        raise WriterFenced(projection, row[0] if row else None, row[1] if row else None)


def guard_kafka_commit(conn: psycopg.Connection, projection: str, epoch: int,
                       lease_s: float) -> None:
    """In a transaction the caller keeps open until its Kafka transaction has committed: the
    projection's fence lock, held shared, and the lease checked at ``epoch`` under it (raises
    ``WriterFenced``). A takeover takes the lock exclusively (``WriterLease.acquire``), so it
    waits for the commits under way and no commit of the old holder follows it. A caller
    frozen inside for a whole lease has the server end its session, and so lets the lock
    go."""
    conn.execute(sql.SQL("SET LOCAL idle_in_transaction_session_timeout = {}").format(
        sql.Literal(f"{lease_s * 1000:.0f}")))
    conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(
        sql.Literal(f"{max(lease_s / 3, 1.0) * 1000:.0f}")))
    conn.execute("SELECT pg_advisory_xact_lock_shared(hashtext(%s))", (_FENCE + projection,))
    epoch_is(conn, projection, epoch)


def renew_held(conn: psycopg.Connection, projection: str, epoch: int) -> None:
    """Renew the lease inside a transaction that holds its registry row with the epoch checked
    (a batch's commit): a commit longer than a lease keeps the renewal thread waiting on the
    row, and would otherwise leave the lease expired on the server the moment it commits."""
    conn.execute(sql.SQL("UPDATE {} SET writer_renewed_at = clock_timestamp() WHERE "
                         "projection = %s AND writer_epoch = %s").format(_TABLE),
                 (projection, epoch))


class WriterLease:
    """A runner's lease on one projection, through an autocommit connection of its own.

    ``acquire`` (or ``wait``) takes it, ``renewing`` keeps it on a thread, ``check`` raises
    ``WriterFenced`` once it is lost, ``release`` lets it go."""

    def __init__(self, database_url: str, projection: str, holder: str = PROCESS_HOLDER,
                 lease_s: float = LEASE_S) -> None:
        self.database_url = database_url
        self.projection = projection
        self.holder = holder
        self.lease_s = lease_s
        self.epoch: int | None = None
        self.slots = 0
        """The most transactional-id slots any holder's tasks said they write from."""
        self._renewed = 0.0
        """``lease_clock()`` when the server last renewed the lease, as far as this runner
        can tell."""
        self._lost: WriterFenced | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._connection: psycopg.Connection | None = None

    def _conn(self) -> psycopg.Connection:
        if self._connection is None or self._connection.closed:
            wait_s = max(int(self.lease_s / 3), 2)
            self._connection = psycopg.connect(libpq_url(self.database_url), autocommit=True,
                                               connect_timeout=wait_s)
            # A commit under way holds the row: a renewal waits for it a third of a lease at
            # most, then tries again, rather than hanging the thread behind a stuck commit.
            self._connection.execute(sql.SQL("SET lock_timeout = {}").format(
                sql.Literal(f"{wait_s}s")))
        return self._connection

    @property
    def held(self) -> bool:
        return self.epoch is not None and self.lost() is None

    def acquire(self) -> int:
        """Take the lease: free, expired or this process's own; its new epoch. Raises
        ``WriterBusy`` naming the live holder otherwise. Under the projection's fence lock,
        taken exclusively: the old holder's Kafka commits under way end first, and none
        starts after (``guard_kafka_commit``)."""
        with self._lock:
            conn = self._conn()
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                             (_FENCE + self.projection,))
                row = conn.execute(sql.SQL(
                    "UPDATE {table} SET writer = %s, writer_epoch = writer_epoch + 1, "
                    "writer_renewed_at = now(), writer_lease_s = %s WHERE projection = %s AND "
                    "(writer IS NULL OR writer = %s OR {expired}) "
                    "RETURNING writer_epoch, writer_slots, {elapsed}").format(
                    table=_TABLE, expired=_EXPIRED, elapsed=_SERVER_SECONDS),
                    (self.holder, self.lease_s, self.projection, self.holder, self.lease_s)
                ).fetchone()
            if row is None:
                writer = writer_of(conn, self.projection, self.lease_s)
                if writer is None:
                    raise LookupError(f"projection {self.projection!r} is not registered")
                raise WriterBusy(self.projection, writer.holder or "?", writer.renewed_at)
            self.epoch, self.slots, self._lost = int(row[0]), int(row[1]), None
            self._renewed = lease_clock() - float(row[2])
        log.info("projection %s: this runner writes it (lease epoch %d, %s)", self.projection,
                 self.epoch, self.holder)
        return self.epoch

    def widen(self, slots: int) -> int:
        """Record that this holder's tasks write from up to ``slots`` transactional-id slots;
        the most any holder said (every one of them to fence)."""
        with self._lock:
            row = self._conn().execute(sql.SQL(
                "UPDATE {} SET writer_slots = greatest(writer_slots, %s) WHERE projection = %s "
                "AND writer = %s AND writer_epoch = %s RETURNING writer_slots").format(_TABLE),
                (slots, self.projection, self.holder, self.epoch)).fetchone()
            if row is None:
                self._lose(None, None)
                assert self._lost is not None
                raise self._lost
            self.slots = int(row[0])
        return self.slots

    def take(self, poll_s: float = 0.5) -> int:
        """Take the lease unless its holder is alive: one that renews it while this looks
        (three times a lease) refuses this runner (``WriterBusy``); one that does not (a
        process killed a moment ago) is waited out, up to the rest of its lease."""
        try:
            return self.acquire()
        except WriterBusy as busy:
            if (epoch := self._watch_renew(busy, poll_s, self.acquire)) is None:
                raise
            return epoch

    def live_holder(self, poll_s: float = 0.5) -> WriterBusy | None:
        """Without taking the lease: ``WriterBusy`` if another holder has it and renews it
        while this looks (as ``take`` would find), None if it is free, this process's, or
        left by a holder that does not renew it (a runner may start: it takes it then)."""
        writer = writer_of(self._conn(), self.projection, self.lease_s)
        if writer is None or not writer.live or writer.holder in (None, self.holder):
            return None
        busy = WriterBusy(self.projection, writer.holder or "?", writer.renewed_at)

        def look() -> int:
            again = writer_of(self._conn(), self.projection, self.lease_s)
            if again is None or not again.live or again.holder != writer.holder:
                return 0  # let go, or expired: free
            raise WriterBusy(self.projection, again.holder or "?", again.renewed_at)

        try:
            self._watch_renew(busy, poll_s, look)
        except WriterBusy as renewed:
            return renewed
        return None

    def _watch_renew(self, busy: WriterBusy, poll_s: float,
                     again: Callable[[], int]) -> int | None:
        """Look (``again``, which raises ``WriterBusy`` while the lease is held) until the
        holder ``busy`` names renews it, up to a lease: raises ``WriterBusy`` once it did;
        what ``again`` returned once the lease was free."""
        seen, deadline = busy.renewed_at, time.monotonic() + self.lease_s + poll_s
        log.info("projection %s: %s holds its writer lease; seeing whether it renews it",
                 self.projection, busy.holder)
        while time.monotonic() < deadline:
            time.sleep(poll_s)
            try:
                return again()
            except WriterBusy as held:
                if held.renewed_at != seen:
                    raise held from None
        return None

    def wait(self, stopping: threading.Event, poll_s: float = 0.5) -> int | None:
        """Wait as a standby until the lease is free, then take it; None if ``stopping`` was
        set first."""
        said = False
        while not stopping.is_set():
            try:
                return self.acquire()
            except WriterBusy as busy:
                if not said:
                    log.info("projection %s: standing by while %s writes it", self.projection,
                             busy.holder)
                    said = True
            except psycopg.Error as exc:
                log.warning("projection %s: waiting for the writer lease: %s",
                            self.projection, exc)
                self._drop_connection()
            stopping.wait(poll_s)
        return None

    def renewing(self) -> WriterLease:
        """Renew on a thread of its own, three times a lease (once: a second call keeps the
        thread it has)."""
        if self._thread is not None and self._thread.is_alive() and not self._stop.is_set():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_until_stopped, daemon=True,
                                        name=f"lease-{self.projection}")
        self._thread.start()
        return self

    def _renew_until_stopped(self) -> None:
        acting_as(self.holder)
        failing = False
        while not self._stop.wait(self.lease_s / 3):
            crash_point("lease.renewing")
            if self._stop.is_set():
                return  # given up while it waited at the point
            try:
                self.renew()
                failing = False
            except WriterFenced:
                return
            except psycopg.Error as exc:
                # Once per streak: a commit stuck on a lock fails every renewal behind it.
                log.log(logging.DEBUG if failing else logging.WARNING, "projection %s: "
                        "renewing the writer lease: %s", self.projection,
                        str(exc).splitlines()[0])
                failing = True
                self._drop_connection()

    def renew(self) -> None:
        """Renew the lease; raises ``WriterFenced`` if it was taken or let go meanwhile."""
        with self._lock:
            if self._lost is not None:
                raise self._lost
            row = self._conn().execute(sql.SQL(
                "UPDATE {} SET writer_renewed_at = now() WHERE projection = %s AND writer = %s "
                "AND writer_epoch = %s RETURNING {}").format(_TABLE, _SERVER_SECONDS),
                (self.projection, self.holder, self.epoch)).fetchone()
            if row is not None:
                # As the server counts it: from its now(), not from when this asked (a
                # database stalled for seconds would otherwise leave a fresh lease old).
                self._renewed = lease_clock() - float(row[0])
                return
            writer = writer_of(self._conn(), self.projection, self.lease_s)
            self._lose(writer.holder if writer else None, writer.epoch if writer else None)
            assert self._lost is not None
            raise self._lost

    def renewed_in_commit(self, started: float) -> None:
        """A batch's commit renewed the lease on the registry row it held (``renew_held``),
        the renewal starting at ``lease_clock()`` ``started``. No lock: the renewal thread
        may be waiting on that very row, holding it."""
        self._renewed = max(self._renewed, started)

    def abandon(self) -> None:
        """Stop renewing, and count the lease lost, without letting it go: a run given up as
        stalled, whose thread may still be inside a batch. A newer run of this process takes
        it over with a new epoch; if none does, it expires and a standby takes it."""
        self._stop.set()
        self._lose(None, None)

    def _lose(self, holder: str | None, epoch: int | None) -> None:
        if self._lost is None:
            self._lost = WriterFenced(self.projection, holder, epoch, holder == self.holder)
            log.error("%s; it stops", self._lost)

    def lost(self) -> WriterFenced | None:
        """Why the lease is lost: taken, let go, or a whole lease unrenewed (this runner was
        paused, or cut off from the database: another may hold it now); None while held."""
        if (self._lost is None and self.epoch is not None
                and lease_clock() - self._renewed >= self.lease_s):
            self._lose(None, None)
        return self._lost

    def check(self) -> None:
        """Raise ``WriterFenced`` if the lease is lost (``lost``)."""
        if (lost := self.lost()) is not None:
            raise lost

    def release(self) -> None:
        """Let the lease go (a standby takes it at its next look) and stop renewing."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        with self._lock:
            if self.epoch is not None and self._lost is None:
                try:
                    self._conn().execute(sql.SQL(
                        "UPDATE {} SET writer = NULL, writer_renewed_at = NULL WHERE "
                        "projection = %s AND writer = %s AND writer_epoch = %s").format(_TABLE),
                        (self.projection, self.holder, self.epoch))
                    log.info("projection %s: writer lease let go (epoch %d)", self.projection,
                             self.epoch)
                except psycopg.Error as exc:
                    log.warning("projection %s: letting the writer lease go: %s (it expires "
                                "in %.0f s)", self.projection, exc, self.lease_s)
            self.epoch = None
        self._drop_connection()

    def _drop_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
