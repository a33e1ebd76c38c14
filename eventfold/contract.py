"""The contract every layer shares: the names and small conversions that the write side, the
outbox, the projections and the read API must agree on, declared once.

Unlike the composition root beside it (app, CLI, configuration), any package of Eventfold may
import this module, Spark tasks included: it needs only the standard library and SQLAlchemy's
URL parser.
"""

from __future__ import annotations

from sqlalchemy.engine import make_url

PartitionKey = tuple[str, int]
"""A Kafka partition: (topic, partition)."""

KTABLE_VERSION_HEADER = "eventfold.version"
"""KTable record header: the stream version of the last event folded into the state."""
KTABLE_POSITION_HEADER = "eventfold.position"
"""KTable record header: that event's global position in the event store."""


def libpq_url(database_url: str) -> str:
    """A database URL in SQLAlchemy form (``postgresql+psycopg://...``) or libpq form, as a
    libpq connection string (password included: it is for connecting, never for printing)."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(
        hide_password=False)
