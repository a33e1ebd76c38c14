"""One writer per projection: the lease a runner of a projection's active version holds on
its ``projection_versions`` row (migration 0019), as Kafka Streams' exactly-once gives each
task one producer epoch.

The lease has a holder (a process), an epoch that grows with each taking of it, and a
renewal time. A runner takes it when it starts (refused while another live holder has it:
``WriterBusy``, which names that holder; a standby waits for it instead), renews it on a
thread of its own, and lets it go when it stops, so that a standby takes over at once. Every
commit of the active version checks the epoch under the registry row it already locks
(``catalog.claim_batch``), and the KTable and derived-event producers are transactional with
ids named for the projection version (``topics.writer_transactional_ids``): a newer holder
fences the older one in Postgres and at the broker alike. A holder that could not renew for
a whole lease (paused, or cut off from the database) takes itself for fenced.

It imports only the contract and psycopg.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql

from eventfold.contract import libpq_url

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
        "SELECT writer, writer_epoch, writer_renewed_at, coalesce(writer_renewed_at > now() - "
        "make_interval(secs => %s), false) FROM {} WHERE projection = %s").format(_TABLE),
        (lease_s, projection)).fetchone()
    return None if row is None else Writer(row[0], int(row[1]), row[2], bool(row[3]))


def live_writers(conn: psycopg.Connection, lease_s: float = LEASE_S) -> dict[str, str]:
    """Each projection a live runner writes, and that runner (``holder``)."""
    rows = conn.execute(sql.SQL(
        "SELECT projection, writer FROM {} WHERE writer IS NOT NULL AND writer_renewed_at > "
        "now() - make_interval(secs => %s)").format(_TABLE), (lease_s,)).fetchall()
    return {str(projection): str(writer) for projection, writer in rows}


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
        self._renewed = 0.0
        """``time.monotonic()`` of the last renewal the database confirmed."""
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
        ``WriterBusy`` naming the live holder otherwise."""
        with self._lock:
            started = time.monotonic()
            row = self._conn().execute(sql.SQL(
                "UPDATE {} SET writer = %s, writer_epoch = writer_epoch + 1, "
                "writer_renewed_at = now() WHERE projection = %s AND (writer IS NULL OR "
                "writer = %s OR writer_renewed_at <= now() - make_interval(secs => %s)) "
                "RETURNING writer_epoch").format(_TABLE),
                (self.holder, self.projection, self.holder, self.lease_s)).fetchone()
            if row is None:
                writer = writer_of(self._conn(), self.projection, self.lease_s)
                if writer is None:
                    raise LookupError(f"projection {self.projection!r} is not registered")
                raise WriterBusy(self.projection, writer.holder or "?", writer.renewed_at)
            self.epoch, self._renewed, self._lost = int(row[0]), started, None
        log.info("projection %s: this runner writes it (lease epoch %d, %s)", self.projection,
                 self.epoch, self.holder)
        return self.epoch

    def take(self, poll_s: float = 0.5) -> int:
        """Take the lease unless its holder is alive: one that renews it while this looks
        (three times a lease) refuses this runner (``WriterBusy``); one that does not (a
        process killed a moment ago) is waited out, up to the rest of its lease."""
        try:
            return self.acquire()
        except WriterBusy as busy:
            seen, deadline = busy.renewed_at, time.monotonic() + self.lease_s + poll_s
            log.info("projection %s: %s holds its writer lease; seeing whether it renews it",
                     self.projection, busy.holder)
            while time.monotonic() < deadline:
                time.sleep(poll_s)
                try:
                    return self.acquire()
                except WriterBusy as again:
                    if again.renewed_at != seen:
                        raise again from None
            raise

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
        """Renew on a thread of its own, three times a lease."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_until_stopped, daemon=True,
                                        name=f"lease-{self.projection}")
        self._thread.start()
        return self

    def _renew_until_stopped(self) -> None:
        failing = False
        while not self._stop.wait(self.lease_s / 3):
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
            started = time.monotonic()
            row = self._conn().execute(sql.SQL(
                "UPDATE {} SET writer_renewed_at = now() WHERE projection = %s AND writer = %s "
                "AND writer_epoch = %s RETURNING 1").format(_TABLE),
                (self.projection, self.holder, self.epoch)).fetchone()
            if row is not None:
                self._renewed = started
                return
            writer = writer_of(self._conn(), self.projection, self.lease_s)
            self._lose(writer.holder if writer else None, writer.epoch if writer else None)
            assert self._lost is not None
            raise self._lost

    def renewed_in_commit(self, started: float) -> None:
        """A batch's commit renewed the lease on the registry row it held (``renew_held``),
        the renewal starting at ``time.monotonic()`` ``started``. No lock: the renewal thread
        may be waiting on that very row, holding it."""
        self._renewed = max(self._renewed, started)

    def _lose(self, holder: str | None, epoch: int | None) -> None:
        if self._lost is None:
            self._lost = WriterFenced(self.projection, holder, epoch, holder == self.holder)
            log.error("%s; it stops", self._lost)

    def lost(self) -> WriterFenced | None:
        """Why the lease is lost: taken, let go, or a whole lease unrenewed (this runner was
        paused, or cut off from the database: another may hold it now); None while held."""
        if (self._lost is None and self.epoch is not None
                and time.monotonic() - self._renewed >= self.lease_s):
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
