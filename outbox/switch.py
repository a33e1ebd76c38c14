"""Switching a database's outbox design, with its connector drained and reconfigured
meanwhile when it runs: the one operation that needs both the design and the connector."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from eventfold.contract import libpq_url
from eventfold.outbox.design import (
    OutboxDesign,
    OutboxDesignError,
    installed_design,
)
from eventfold.outbox.operations import ConnectorOperations
from eventfold.write_model.persistence.schema import (
    OUTBOX_DESIGN_LOCK,
    OUTBOX_DESIGN_TABLE,
    OUTBOX_PUBLICATION,
)

log = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 120.0


def switch_design(database_url: str, wanted: OutboxDesign,
                  connector: ConnectorOperations | None = None,
                  drain_timeout_s: float = DRAIN_TIMEOUT_S) -> OutboxDesign | None:
    """Make ``wanted`` the database's design if it has another; the design switched from
    (None: nothing to do).

    The switch takes the lock every append holds while it runs (``OUTBOX_DESIGN_LOCK``), so
    no append runs across it. When ``connector`` (whose spec captures ``wanted``) runs, the
    switch waits, holding appends, until it has confirmed everything written before, records
    the design and reconfigures it; appends then go on, each published once, by one design
    or the other. The publication holds both tables while the router moves."""
    if connector is not None and connector.spec.design is not wanted:
        raise ValueError(f"the connector captures {connector.spec.design}, not {wanted}")
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        current = installed_design(conn)
        if current is wanted:
            return None
        _publish(conn, wanted.captured_table)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (OUTBOX_DESIGN_LOCK,))
            if installed_design(conn) is wanted:  # another process switched meanwhile
                return None
            live = connector is not None and connector.client.status(
                connector.spec.name) is not None
            if connector is not None and live:
                _wait_drained(conn, connector, drain_timeout_s)
            conn.execute(f"UPDATE {OUTBOX_DESIGN_TABLE} SET design = %s, changed_at = now()",
                         (wanted.value,))
            if connector is not None and live:
                # Stopped first: a task of the old design must not capture the appends that
                # follow the switch, which the new one captures too.
                connector.apply(stop_first=True)
        _unpublish(conn, current.captured_table)
    log.info("outbox design switched from %s to %s%s", current, wanted,
             " (the connector was drained and reconfigured meanwhile)" if live else "")
    return current


def _publish(conn: psycopg.Connection[Any], table: str) -> None:
    if table not in _published(conn):
        conn.execute(f"ALTER PUBLICATION {OUTBOX_PUBLICATION} ADD TABLE {table}")


def _unpublish(conn: psycopg.Connection[Any], table: str) -> None:
    if table in _published(conn):
        conn.execute(f"ALTER PUBLICATION {OUTBOX_PUBLICATION} DROP TABLE {table}")


def _published(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = %s",
                        (OUTBOX_PUBLICATION,))
    return {name for (name,) in rows}


def _wait_drained(conn: psycopg.Connection[Any], operations: ConnectorOperations,
                  timeout_s: float) -> None:
    """Until the connector's slot has confirmed the WAL written before this point (its
    heartbeats move it on once the last events are in Kafka)."""
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(libpq_url(operations.spec.database_url), autocommit=True) as probe:
        while True:
            confirmed = probe.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
                "WHERE slot_name = %s", (row[0], operations.spec.slot_name)).fetchone()
            if confirmed is not None and confirmed[0]:
                return
            if time.monotonic() > deadline:
                raise OutboxDesignError(
                    f"the connector's slot {operations.spec.slot_name} had not confirmed the "
                    f"WAL up to {row[0]} after {timeout_s:.0f} s: is the connector running? "
                    "Nothing was switched")
            time.sleep(0.25)
