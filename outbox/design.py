"""Outbox designs: how an append's events reach the WAL for Debezium, one per database.

- ``events_table`` (the default): Debezium captures the ``events`` rows themselves; the event
  store is the outbox. An append writes each event once.
- ``outbox_table``: each append also inserts an ``outbox`` row per event and deletes it in
  the same transaction; Debezium reads the inserts. For a database whose ``events`` table
  must not be published (rows that are not for consumers, or rewritten in place).

A design is data: ``eventfold_outbox_design`` (migration 0010) holds it, the append function
dispatches on it, the publication holds its table, and the connector spec renders the
matching router; ``outbox.switch`` moves a database from one to the other.
docs/architecture.md gives the figures each was chosen by.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import psycopg

from eventfold.write_model.persistence.schema import (
    EVENTS_TABLE,
    OUTBOX_DESIGN_TABLE,
    OUTBOX_TABLE,
)


class OutboxDesign(StrEnum):
    EVENTS_TABLE = "events_table"
    OUTBOX_TABLE = "outbox_table"

    @property
    def captured_table(self) -> str:
        """The table whose inserts Debezium routes to the event topics."""
        return EVENTS_TABLE if self is OutboxDesign.EVENTS_TABLE else OUTBOX_TABLE


DEFAULT_OUTBOX_DESIGN = OutboxDesign.EVENTS_TABLE


class OutboxDesignError(RuntimeError):
    """The switch to another design could not be made safely (nothing was changed)."""


def installed_design(conn: psycopg.Connection[Any]) -> OutboxDesign:
    row = conn.execute(f"SELECT design FROM {OUTBOX_DESIGN_TABLE}").fetchone()
    if row is None:
        raise OutboxDesignError("the database has no outbox design recorded: run migrations")
    return OutboxDesign(row[0])
