"""Write model: the domain side users build on, and the event store it persists to.

Owns: domain events and their registry, the aggregate base, repositories, the Postgres event
store (events and their outbox rows appended in ONE transaction), commands and the HTTP
command API.

May import: the standard library, SQLAlchemy, psycopg, pydantic, FastAPI and
``eventfold.contract``. It imports no other Eventfold package: everything downstream (outbox,
projections, read_api) depends on it, never the reverse.
"""

from eventfold.write_model.aggregate import Aggregate, DomainError
from eventfold.write_model.async_store import AsyncEventStore
from eventfold.write_model.commands import (
    AsyncCommandBus,
    Command,
    CommandBus,
    CommandRegistry,
    CommandResult,
)
from eventfold.write_model.events import (
    DomainEvent,
    EventRegistry,
    NewEvent,
    RecordedEvent,
    default_registry,
)
from eventfold.write_model.repository import AsyncRepository, Repository
from eventfold.write_model.store import (
    AppendResult,
    CommandIdReused,
    ConcurrencyError,
    EventStore,
    StoreUnavailable,
    StreamAppend,
    StreamNotFound,
    StreamOwnedByAnotherType,
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
    "default_registry",
]
