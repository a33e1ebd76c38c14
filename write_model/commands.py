"""Commands and their handlers: load the target aggregate, run the handler, append atomically.

A command may carry a ``command_id``: executing the same id again returns the first result
and appends nothing, also when the first attempt committed but its response was lost.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from write_model.aggregate import Aggregate
from write_model.repository import Repository
from write_model.store import AppendResult, ConcurrencyError, DuplicateCommand, StreamNotFound

A = TypeVar("A", bound=Aggregate)
C = TypeVar("C", bound="Command")


class Command(BaseModel):
    """Base of commands: a validated request to change one aggregate.

    Subclasses declare their fields with pydantic and implement ``stream_id``. With
    ``expected_version`` set, the command fails with a conflict if the aggregate moved on;
    without it the bus retries a lost race against the latest version.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    command_name: ClassVar[str]

    command_id: uuid.UUID | None = Field(
        default=None, description="Idempotency key: a retry with the same id returns the "
        "first result and appends nothing.")
    expected_version: int | None = Field(
        default=None, ge=0, description="Optimistic concurrency: the stream version you saw.")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "command_name" not in cls.__dict__:
            cls.command_name = cls.__name__

    def stream_id(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement stream_id()")


class CommandResult(BaseModel):
    stream_id: str
    version: int
    event_ids: list[uuid.UUID]
    global_positions: list[int]
    replayed: bool = Field(default=False, description="True when this is the stored result "
                           "of an earlier execution of the same command_id.")

    @classmethod
    def of(cls, result: AppendResult, replayed: bool = False) -> CommandResult:
        return cls(stream_id=result.stream_id, version=result.version,
                   event_ids=result.event_ids, global_positions=result.global_positions,
                   replayed=replayed)


@dataclass(frozen=True)
class HandlerSpec(Generic[A, C]):
    command: type[C]
    aggregate: type[A]
    handle: Callable[[A, C], None]
    requires_existing: bool


class CommandRegistry:
    """The commands an application accepts, each bound to an aggregate type and a handler."""

    def __init__(self) -> None:
        self._handlers: dict[str, HandlerSpec[Any, Any]] = {}

    def handler(
        self, command: type[C], aggregate: type[A], *, requires_existing: bool = False
    ) -> Callable[[Callable[[A, C], None]], Callable[[A, C], None]]:
        """Decorator: ``handle(aggregate, command)`` calls the aggregate's command methods.
        ``requires_existing`` makes the command fail with StreamNotFound on a new stream."""

        def register(handle: Callable[[A, C], None]) -> Callable[[A, C], None]:
            name = command.command_name
            if name in self._handlers:
                raise ValueError(f"command {name!r} already has a handler")
            self._handlers[name] = HandlerSpec(command, aggregate, handle, requires_existing)
            return handle

        return register

    def get(self, name: str) -> HandlerSpec[Any, Any]:
        try:
            return self._handlers[name]
        except KeyError:
            known = ", ".join(sorted(self._handlers)) or "none"
            raise LookupError(f"unknown command {name!r}; known commands: {known}") from None

    def __iter__(self) -> Iterator[HandlerSpec[Any, Any]]:
        return iter(self._handlers.values())

    @property
    def aggregate_types(self) -> list[str]:
        return sorted({spec.aggregate.stream_type for spec in self._handlers.values()})


class CommandBus:
    """Executes commands against the event store: the Python API of the write side."""

    MAX_ATTEMPTS = 20

    def __init__(self, repository: Repository, registry: CommandRegistry) -> None:
        self.repository = repository
        self.registry = registry

    def execute(self, command: Command, metadata: Mapping[str, Any] | None = None,
                correlation_id: str | None = None) -> CommandResult:
        """Run ``command``; events carry ``metadata`` plus correlation and causation ids (the
        causation id is the command id, the correlation id defaults to it)."""
        spec = self.registry.get(command.command_name)
        if command.command_id is not None:
            earlier = self.repository.store.command_result(command.command_id)
            if earlier is not None:
                return CommandResult.of(earlier, replayed=True)
        event_metadata = _event_metadata(command, metadata, correlation_id)
        use_cache = True
        for attempt in range(1, self.MAX_ATTEMPTS + 1):
            try:
                return self._attempt(spec, command, event_metadata, use_cache)
            except DuplicateCommand as duplicate:
                return CommandResult.of(duplicate.result, replayed=True)
            except _CachedAggregateRejected:
                use_cache = False  # decide again on the aggregate as stored
            except ConcurrencyError:
                if command.expected_version is not None or attempt == self.MAX_ATTEMPTS:
                    raise
                use_cache = False
                # Jitter, so that writers that collided do not collide again in lockstep.
                time.sleep(random.uniform(0, 0.002 * attempt))
        raise AssertionError("unreachable")

    def _attempt(self, spec: HandlerSpec[Any, Any], command: Command,
                 metadata: dict[str, Any], use_cache: bool) -> CommandResult:
        stream_id = command.stream_id()
        cached = self.repository.cache.take(spec.aggregate, stream_id) if use_cache else None
        aggregate = cached or self.repository.load(spec.aggregate, stream_id)
        try:
            self._decide(spec, command, aggregate)
        except Exception:
            # A cached aggregate may be stale: only a rejection by the stored one is final.
            if cached is not None:
                raise _CachedAggregateRejected from None
            raise
        if not aggregate.pending_events:
            self.repository.cache.put(aggregate)
            return CommandResult(stream_id=aggregate.id, version=aggregate.version,
                                 event_ids=[], global_positions=[])
        try:
            result = self.repository.save(aggregate, metadata, command.command_id)
        except ConcurrencyError:
            if cached is not None and command.expected_version is not None:
                raise _CachedAggregateRejected from None
            raise
        self.repository.cache.put(aggregate)  # only after a successful save
        return CommandResult.of(result)

    @staticmethod
    def _decide(spec: HandlerSpec[Any, Any], command: Command, aggregate: Aggregate) -> None:
        if spec.requires_existing and aggregate.version == 0:
            raise StreamNotFound(aggregate.id)
        expected = command.expected_version
        if expected is not None and expected != aggregate.version:
            raise ConcurrencyError(aggregate.id, expected, aggregate.version)
        spec.handle(aggregate, command)

    def load(self, aggregate_class: type[A], stream_id: str) -> A:
        """The aggregate as stored now (never from the cache)."""
        return self.repository.load(aggregate_class, stream_id)


class _CachedAggregateRejected(Exception):
    """A cached aggregate refused the command; the bus retries on the stored one."""


def _event_metadata(command: Command, metadata: Mapping[str, Any] | None,
                    correlation_id: str | None) -> dict[str, Any]:
    command_id = str(command.command_id or uuid.uuid4())
    return {**(metadata or {}), "command": command.command_name,
            "causation_id": command_id, "correlation_id": correlation_id or command_id}
