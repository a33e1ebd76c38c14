"""The contract every layer shares: the names, record formats and small conversions that the
write side, the outbox, the projections and the read API must agree on, declared once.

- event topics: their names (``event_topic``) and the envelope of their messages
  (``EventEnvelope``, in ``envelope``), and of the events projections derive
  (``derived_value``, read back by ``EventEnvelope.decode_derived``); where a typed event a
  fold, reaction or process receives was recorded (``Recorded``);
- Kafka partitions and offsets: ``PartitionKey`` and the JSON form of offsets that projection
  checkpoints keep; which partition holds a key (``partitioner``);
- KTable record headers;
- the database URL in libpq form;
- intervals written as Spark's triggers take them;
- the options that map or record a JVM's class-data archive, for each JVM Eventfold starts
  (``class_data``);
- the back-off every retry loop follows (``backoff``);
- a package's exports loaded when first used (``lazy``: ``eventfold`` and
  ``eventfold.projections`` name more than a process needs);
- the one way past the router that both HTTP APIs take for their hot path (``asgi``, which
  imports Starlette: only the HTTP layers import it).

Unlike the composition root beside it (app, CLI, configuration), any package of Eventfold may
import this package, Spark tasks included: it needs only the standard library and orjson, and
SQLAlchemy's URL parser when a URL is converted (imported then: a Spark process that plans
offsets never loads SQLAlchemy).
"""

from __future__ import annotations

from collections.abc import Mapping

from eventfold.contract.envelope import (
    RECORDED_ATTRIBUTE,
    EventEnvelope,
    MalformedEvent,
    Recorded,
    derived_value,
    envelope_value,
    trace_of,
)

__all__ = [
    "DEFAULT_TOPIC_PREFIX",
    "KTABLE_MOVED_HEADER",
    "KTABLE_POSITION_HEADER",
    "KTABLE_VERSION_HEADER",
    "RECORDED_ATTRIBUTE",
    "EventEnvelope",
    "MalformedEvent",
    "NestedOffsets",
    "PartitionKey",
    "Recorded",
    "derived_value",
    "envelope_value",
    "event_topic",
    "flatten_offsets",
    "libpq_url",
    "nest_offsets",
    "split_password",
    "trace_of",
]

DEFAULT_TOPIC_PREFIX = "eventfold.events."


def event_topic(aggregate_type: str, prefix: str = DEFAULT_TOPIC_PREFIX) -> str:
    """The topic that carries every event of one aggregate type, keyed by aggregate id."""
    return f"{prefix}{aggregate_type}"


PartitionKey = tuple[str, int]
"""A Kafka partition: (topic, partition)."""
NestedOffsets = dict[str, dict[str, int]]


def nest_offsets(flat: Mapping[PartitionKey, int]) -> NestedOffsets:
    """{(topic, partition): offset} as {topic: {"partition": offset}}: the JSON form kept in
    projection checkpoints."""
    nested: NestedOffsets = {}
    for (topic, partition), offset in sorted(flat.items()):
        nested.setdefault(topic, {})[str(partition)] = int(offset)
    return nested


def flatten_offsets(nested: Mapping[str, Mapping[str, int]]) -> dict[PartitionKey, int]:
    return {(t, int(p)): int(o) for t, parts in nested.items() for p, o in parts.items()}

KTABLE_VERSION_HEADER = "eventfold.version"
"""KTable record header: the stream version of the last event folded into the state."""
KTABLE_POSITION_HEADER = "eventfold.position"
"""KTable record header: that event's global position in the event store."""
KTABLE_MOVED_HEADER = "eventfold.moved_to"
"""KTable tombstone header: the key was written to this partition (partitions were added to
the topic since the key was last written to the partition the tombstone deletes it from)."""


def libpq_url(database_url: str) -> str:
    """A database URL in SQLAlchemy form (``postgresql+psycopg://...``) or libpq form, as a
    libpq connection string (password included: it is for connecting, never for printing)."""
    from sqlalchemy.engine import make_url

    return make_url(database_url).set(drivername="postgresql").render_as_string(
        hide_password=False)


def split_password(database_url: str) -> tuple[str, str]:
    """``database_url`` without its password, and the password ('' if it has none): the URL
    for a process that gets the password another way (libpq's ``PGPASSWORD``)."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    return url._replace(password=None).render_as_string(hide_password=False), url.password or ""


_UNIT_SECONDS = {"ms": 0.001, "millisecond": 0.001, "s": 1.0, "sec": 1.0, "second": 1.0,
                 "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0, "d": 86400.0,
                 "day": 86400.0}


FOREVER = "forever"
DEFAULT_DEAD_LETTER_RETENTION = "30 days"
DEFAULT_DERIVED_EVENT_RETENTION = FOREVER
"""The retentions of a projection's dead-letter and derived-event topics unless configured
(``EVENTFOLD_DEAD_LETTER_RETENTION``, ``EVENTFOLD_DERIVED_EVENT_RETENTION``)."""


def retention_ms(retention: str) -> int:
    """A retention as Kafka's ``retention.ms`` takes it: an interval (``30 days``), or
    ``forever`` (-1)."""
    if retention.strip().lower() == FOREVER:
        return -1
    return round(interval_seconds(retention) * 1000)


def interval_seconds(interval: str) -> float:
    """Seconds of an interval written as Spark's triggers take it, as
    ``EVENTFOLD_TRIGGER_INTERVAL`` is: ``500 milliseconds``, ``1 second``, ``2 s``; or in
    hours or days (``7 days``), as retentions are."""
    amount, _, unit = interval.strip().partition(" ")
    unit = unit.strip().lower()
    seconds = _UNIT_SECONDS.get(unit.removesuffix("s") if unit not in _UNIT_SECONDS else unit)
    try:
        value = float(amount)
    except ValueError:
        value = -1.0
    if seconds is None or value < 0:
        raise ValueError(f"not an interval: {interval!r} (say, '500 milliseconds' or "
                         "'1 second')")
    return value * seconds
