"""Batch commits as they happen: a projection's batch transaction notifies
``BATCH_COMMITTED`` with the projection's name (Postgres delivers it at the commit), and one
LISTEN connection per process wakes the reads waiting for that projection's ``min_version``,
instead of each wait polling the database.

Where notifications cannot arrive (a read replica does not relay them; the connection
dropped and is being made again), ``next_commit`` answers None and the waits poll as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
from psycopg import sql

from eventfold.contract import libpq_url
from eventfold.contract.backoff import doubled
from eventfold.projections.state.catalog import BATCH_COMMITTED

log = logging.getLogger(__name__)

RECONNECT_S = (1.0, 60.0)  # first and longest pause between attempts to listen


class CommitNotifications:
    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._waiting: dict[str, asyncio.Event] = {}
        self._listening = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listening once this returns, where the database allows it."""
        first = await self._connect(warn=True)
        self._task = asyncio.get_running_loop().create_task(self._listen(first),
                                                            name="commits")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def next_commit(self, projection: str) -> asyncio.Event | None:
        """An event set at ``projection``'s next batch commit; take it before looking at the
        data, so that a commit in between still wakes the waiter. None while not listening."""
        if not self._listening:
            return None
        return self._waiting.setdefault(projection, asyncio.Event())

    async def _connect(self, warn: bool) -> psycopg.AsyncConnection[tuple[object, ...]] | None:
        conn = None
        try:
            conn = await psycopg.AsyncConnection.connect(libpq_url(self.database_url),
                                                         autocommit=True)
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(BATCH_COMMITTED)))
        except psycopg.Error as exc:
            if conn is not None:  # connected, but may not listen (a read replica)
                await conn.close()
            (log.warning if warn else log.debug)(
                "not notified of batch commits (min_version reads poll instead): %s", exc)
            return None
        self._listening = True
        return conn

    async def _listen(self, conn: psycopg.AsyncConnection[tuple[object, ...]] | None) -> None:
        failures = 0
        while True:
            if conn is not None:
                try:
                    async with conn:
                        async for notification in conn.notifies():
                            self._wake(notification.payload)
                except psycopg.Error as exc:
                    log.warning("lost the connection that listens for batch commits: %s", exc)
                    failures = 0
                finally:
                    self._listening = False
                    self._wake_all()  # waiters go back to polling
            failures += 1
            await asyncio.sleep(doubled(RECONNECT_S[0], failures, RECONNECT_S[1]))
            conn = await self._connect(warn=False)

    def _wake(self, projection: str) -> None:
        event = self._waiting.pop(projection, None)
        if event is not None:
            event.set()

    def _wake_all(self) -> None:
        for name in list(self._waiting):
            self._wake(name)
