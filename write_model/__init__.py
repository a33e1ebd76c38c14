"""Write model: the domain side users build on, and the event store it persists to.

Three layers, each importing only those before it:

- ``domain``: aggregates, domain events and their registry, value checks, ids;
- ``persistence``: the Postgres event store (events and their outbox rows appended in ONE
  transaction), group commit, repositories;
- ``commands`` (the application: commands and where they are handled), ``bus`` (the command
  bus that executes them) and ``http`` (the command API, a transport over the bus, with its
  OpenAPI document in ``openapi``).

May import: the standard library, SQLAlchemy, psycopg, pydantic, FastAPI, prometheus-client
(``metrics``, a leaf every layer may import) and ``eventfold.contract``. It imports no other
Eventfold package: everything downstream (outbox, projections, read_api) depends on it, never
the reverse.
"""

from eventfold.write_model.bus import AsyncCommandBus, CommandBus
from eventfold.write_model.commands import (
    Command,
    CommandRegistry,
    CommandResult,
    TargetId,
    handles,
)
from eventfold.write_model.domain.aggregate import Aggregate, DomainError
from eventfold.write_model.domain.events import (
    DomainEvent,
    EventRegistry,
    NewEvent,
    RecordedEvent,
    default_registry,
)
from eventfold.write_model.persistence.async_store import AsyncEventStore
from eventfold.write_model.persistence.repository import AsyncRepository, Repository
from eventfold.write_model.persistence.store import (
    AppendResult,
    CommandIdReused,
    ConcurrencyError,
    EventStore,
    StoreUnavailable,
    StreamAppend,
    StreamNotFound,
    StreamOwnedByAnotherType,
    append_in_transaction,
    stream_versions,
)

__all__ = [
    "Aggregate",
    "AppendResult",
    "AsyncCommandBus",
    "AsyncEventStore",
    "AsyncRepository",
    "Command",
    "CommandBus",
    "CommandIdReused",
    "CommandRegistry",
    "CommandResult",
    "ConcurrencyError",
    "DomainError",
    "DomainEvent",
    "EventRegistry",
    "EventStore",
    "NewEvent",
    "RecordedEvent",
    "Repository",
    "StoreUnavailable",
    "StreamAppend",
    "StreamNotFound",
    "StreamOwnedByAnotherType",
    "TargetId",
    "append_in_transaction",
    "default_registry",
    "handles",
    "stream_versions",
]
