"""Commands and their handlers: load the target aggregate, run the handler, append atomically.

A command may carry a ``command_id``: executing the same id again returns the first result
and appends nothing, also when the first attempt committed but its response was lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import random
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError, to_jsonable_python

from eventfold.write_model.domain.aggregate import Aggregate, DomainError
from eventfold.write_model.domain.values import storable_problem
from eventfold.write_model.metrics import CONFLICTS
from eventfold.write_model.persistence.repository import AggregateCache, AsyncRepository, Repository
from eventfold.write_model.persistence.store import (
    AppendResult,
    CommandIdReused,
    ConcurrencyError,
    DuplicateCommand,
    StreamNotFound,
)

A = TypeVar("A", bound=Aggregate)
C = TypeVar("C", bound="Command")
M = TypeVar("M", bound=Callable[..., None])


TARGET = "x-eventfold-target"
"""The mark a command's field gets from ``TargetId`` (an OpenAPI extension: the command API's
document shows which field names the aggregate)."""


def TargetId(**options: Any) -> Any:
    """A command field naming the aggregate it goes to (its stream id), as Axon's
    ``@TargetAggregateIdentifier``: ``book: str = TargetId(min_length=1)``; the command needs
    no ``stream_id`` method. ``options`` are pydantic ``Field``'s."""
    extra = options.pop("json_schema_extra", None) or {}
    return Field(json_schema_extra={**extra, TARGET: True}, **options)


class Command(BaseModel):
    """Base of commands: a validated request to change one aggregate.

    Subclasses declare their fields with pydantic, one of them the aggregate's id
    (``TargetId``), or implement ``stream_id``. With ``expected_version`` set, the command
    fails with a conflict if the aggregate moved on; without it the bus retries a lost race
    against the latest version.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    command_name: ClassVar[str]

    command_id: uuid.UUID | None = Field(
        default=None, description="Idempotency key: a retry with the same id returns the "
        "first result and appends nothing.")
    expected_version: int | None = Field(
        default=None, ge=0, description="Optimistic concurrency: the stream version you saw.")

    _target: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "command_name" not in cls.__dict__:
            cls.command_name = cls.__name__

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        targets = [name for name, field in cls.model_fields.items()
                   if isinstance(field.json_schema_extra, dict)
                   and field.json_schema_extra.get(TARGET)]
        if len(targets) > 1:
            raise TypeError(f"{cls.__name__}: one field names the aggregate (TargetId), "
                            f"not {', '.join(targets)}")
        cls._target = targets[0] if targets else cls._target

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        """Every field must be storable as it is (no NUL, lone surrogate, non-finite number,
        or deep nesting): the error names the field and the place in it."""
        if (problem := storable_problem(_as_data(value))) is not None:
            raise PydanticCustomError("storable", problem)
        return value

    def stream_id(self) -> str:
        """The id of the aggregate the command goes to: its ``TargetId`` field's value."""
        if self._target is None:
            raise NotImplementedError(f"{type(self).__name__}: mark the field naming the "
                                      "aggregate with TargetId(), or implement stream_id()")
        return str(getattr(self, self._target))

    def fingerprint(self) -> str:
        """A digest of what the command asks for (its name and fields, not its id): a command
        id executed again with another fingerprint is a mistake, not a retry."""
        payload = self.model_dump_json(exclude={"command_id"}).encode()
        return hashlib.sha256(self.command_name.encode() + b"\n" + payload).hexdigest()[:32]


def _as_data(value: Any) -> Any:
    """``value`` as the JSON data it is stored as, where it holds models (nested models are
    checked as stored too); anything else is checked as it is."""
    if isinstance(value, str | int | float | uuid.UUID) or value is None:
        return value
    return to_jsonable_python(value)


class CommandResult(BaseModel):
    stream_id: str
    version: int
    event_ids: list[uuid.UUID]
    global_positions: list[int]
    replayed: bool = Field(default=False, description="True when this is the stored result "
                           "of an earlier execution of the same command_id.")

    @classmethod
    def of(cls, result: AppendResult, replayed: bool = False) -> CommandResult:
        # The store's result is typed already: no validation on a command's hot path.
        return cls.model_construct(stream_id=result.stream_id, version=result.version,
                                   event_ids=result.event_ids,
                                   global_positions=result.global_positions, replayed=replayed)


@dataclass(frozen=True)
class HandlerSpec(Generic[A, C]):
    command: type[C]
    aggregate: type[A]
    handle: Callable[[A, C], None]
    requires_existing: bool
    creates: bool = False


@dataclass(frozen=True)
class _Handles:
    command: type[Command]
    requires_existing: bool
    creates: bool


def handles(command: type[Command], *, requires_existing: bool = False,
            creates: bool = False) -> Callable[[M], M]:
    """Decorator on an aggregate's method: ``command`` calls it, passing the command's fields
    its parameters name, so that one use case is written in one place::

        class Product(Aggregate):
            @handles(ShipStock, requires_existing=True)
            def ship(self, quantity: int) -> None: ...

    Register the aggregate with ``CommandRegistry.add``. ``requires_existing``: the command
    fails with StreamNotFound on a new stream; ``creates``: it starts the aggregate, and is
    refused (``DomainError``) on one that exists."""
    if requires_existing and creates:
        raise ValueError(f"{command.__name__}: a handler creates an aggregate or requires "
                         "one, not both")

    def mark(method: M) -> M:
        method.__eventfold_handles__ = _Handles(command, requires_existing, creates)  # type: ignore[attr-defined]
        return method

    return mark


@dataclass(frozen=True)
class _CallMethod:
    """A handler that calls one aggregate method with the command's fields it names."""

    method: str
    parameters: tuple[str, ...]

    def __call__(self, aggregate: Aggregate, command: Command) -> None:
        getattr(aggregate, self.method)(**{p: getattr(command, p) for p in self.parameters})


def _method_handler(aggregate: type[Aggregate], name: str, command: type[Command]
                    ) -> _CallMethod:
    parameters = tuple(inspect.signature(getattr(aggregate, name)).parameters)[1:]
    unknown = [p for p in parameters if p not in command.model_fields]
    if unknown:
        raise ValueError(f"{aggregate.__name__}.{name} takes {', '.join(unknown)}, which "
                         f"{command.__name__} has no field for")
    return _CallMethod(name, parameters)


class CommandRegistry:
    """The commands an application accepts, each bound to an aggregate type and a handler."""

    def __init__(self) -> None:
        self._handlers: dict[str, HandlerSpec[Any, Any]] = {}

    def add(self, aggregate: type[A]) -> type[A]:
        """The commands ``aggregate``'s methods handle (``@handles``)."""
        found = False
        for name, member in inspect.getmembers(aggregate, inspect.isfunction):
            marked: _Handles | None = getattr(member, "__eventfold_handles__", None)
            if marked is not None:
                self.handler(marked.command, aggregate,
                             requires_existing=marked.requires_existing,
                             creates=marked.creates)(
                    _method_handler(aggregate, name, marked.command))
                found = True
        if not found:
            raise ValueError(f"{aggregate.__name__} has no method marked @handles(Command)")
        return aggregate

    def handler(
        self, command: type[C], aggregate: type[A], *, requires_existing: bool = False,
        creates: bool = False,
    ) -> Callable[[Callable[[A, C], None]], Callable[[A, C], None]]:
        """Decorator: ``handle(aggregate, command)`` calls the aggregate's command methods.
        ``requires_existing`` makes the command fail with StreamNotFound on a new stream."""

        def register(handle: Callable[[A, C], None]) -> Callable[[A, C], None]:
            name = command.command_name
            if name in self._handlers:
                raise ValueError(f"command {name!r} already has a handler")
            self._handlers[name] = HandlerSpec(command, aggregate, handle, requires_existing,
                                               creates)
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


@dataclass(frozen=True)
class _FindResult:
    command_id: uuid.UUID


@dataclass(frozen=True)
class _Load:
    aggregate_class: type[Aggregate]
    stream_id: str


@dataclass(frozen=True)
class _Save:
    aggregate: Aggregate
    metadata: dict[str, Any]
    command_id: uuid.UUID | None
    fingerprint: str | None


@dataclass(frozen=True)
class _Pause:
    seconds: float


_Request = _FindResult | _Load | _Save | _Pause
_Steps = Generator[_Request, Any, CommandResult]


class _Execution:
    """How a command executes, free of I/O: a generator that yields what it needs done
    (find an earlier result, load, save, pause) and is sent the answer, or has the error
    thrown in. ``CommandBus`` performs the requests with blocking calls, ``AsyncCommandBus``
    with awaits, so both follow exactly the same rules."""

    MAX_ATTEMPTS = 20

    def __init__(self, registry: CommandRegistry, cache: AggregateCache) -> None:
        self.registry = registry
        self.cache = cache

    def steps(self, command: Command, metadata: Mapping[str, Any] | None,
              correlation_id: str | None) -> _Steps:
        spec = self.registry.get(command.command_name)
        # Only a command id's log entry keeps the fingerprint; without one it is not needed.
        fingerprint = None
        if command.command_id is not None:
            fingerprint = command.fingerprint()
            earlier = yield _FindResult(command.command_id)
            if earlier is not None:
                return _replayed(command, fingerprint, earlier)
        event_metadata = _event_metadata(command, metadata, correlation_id)
        use_cache = True
        for attempt in range(1, self.MAX_ATTEMPTS + 1):
            try:
                return (yield from self._attempt(spec, command, event_metadata, fingerprint,
                                                 use_cache))
            except DuplicateCommand as duplicate:
                return _replayed(command, fingerprint, duplicate.result)
            except _CachedAggregateRejected:
                use_cache = False  # decide again on the aggregate as stored
            except ConcurrencyError:
                if command.expected_version is not None or attempt == self.MAX_ATTEMPTS:
                    CONFLICTS.labels(command.command_name, "rejected").inc()
                    raise
                CONFLICTS.labels(command.command_name, "retried").inc()
                use_cache = False
                # Jitter, so that writers that collided do not collide again in lockstep.
                yield _Pause(random.uniform(0, 0.002 * attempt))
        raise AssertionError("unreachable")

    def _attempt(self, spec: HandlerSpec[Any, Any], command: Command,
                 metadata: dict[str, Any], fingerprint: str | None, use_cache: bool
                 ) -> _Steps:
        stream_id = command.stream_id()
        cached = self.cache.take(spec.aggregate, stream_id) if use_cache else None
        aggregate = cached or (yield _Load(spec.aggregate, stream_id))
        try:
            self._decide(spec, command, aggregate)
        except Exception:
            # A cached aggregate may be stale: only a rejection by the stored one is final.
            if cached is not None:
                raise _CachedAggregateRejected from None
            raise
        if not aggregate.pending_events:
            self.cache.put(aggregate)
            return CommandResult(stream_id=aggregate.id, version=aggregate.version,
                                 event_ids=[], global_positions=[])
        try:
            result = yield _Save(aggregate, metadata, command.command_id, fingerprint)
        except ConcurrencyError:
            if cached is not None and command.expected_version is not None:
                raise _CachedAggregateRejected from None
            raise
        self.cache.put(aggregate)  # only after a successful save
        return CommandResult.of(result)

    @staticmethod
    def _decide(spec: HandlerSpec[Any, Any], command: Command, aggregate: Aggregate) -> None:
        if spec.requires_existing and aggregate.version == 0:
            raise StreamNotFound(aggregate.id)
        if spec.creates and aggregate.version > 0:
            raise DomainError(f"{aggregate.stream_type} {aggregate.id} exists already")
        expected = command.expected_version
        if expected is not None and expected != aggregate.version:
            raise ConcurrencyError(aggregate.id, expected, aggregate.version)
        spec.handle(aggregate, command)


class _Stepper:
    """Drives an execution generator: hands in the answer to the last request (or its error)
    and takes the next request; None once the command is done, with ``result`` set."""

    def __init__(self, steps: _Steps) -> None:
        self._steps = steps
        self._answer: Any = None
        self._error: Exception | None = None
        self.result: CommandResult

    def next_request(self) -> _Request | None:
        answer, error, self._answer, self._error = self._answer, self._error, None, None
        try:
            return self._steps.throw(error) if error else self._steps.send(answer)
        except StopIteration as finished:
            self.result = finished.value
            return None

    def answer(self, value: Any) -> None:
        self._answer = value

    def fail(self, error: Exception) -> None:
        self._error = error


class CommandBus:
    """Executes commands against the event store: the Python API of the write side."""

    def __init__(self, repository: Repository, registry: CommandRegistry) -> None:
        self.repository = repository
        self.registry = registry
        self._execution = _Execution(registry, repository.cache)

    def execute(self, command: Command, metadata: Mapping[str, Any] | None = None,
                correlation_id: str | None = None) -> CommandResult:
        """Run ``command``; events carry ``metadata`` plus correlation and causation ids (the
        causation id is the command id, the correlation id defaults to it)."""
        stepper = _Stepper(self._execution.steps(command, metadata, correlation_id))
        while (request := stepper.next_request()) is not None:
            try:
                stepper.answer(self._perform(request))
            except Exception as exc:
                stepper.fail(exc)
        return stepper.result

    def _perform(self, request: _Request) -> Any:
        match request:
            case _FindResult(command_id):
                return self.repository.store.command_result(command_id)
            case _Load(aggregate_class, stream_id):
                return self.repository.load(aggregate_class, stream_id)
            case _Save(aggregate, metadata, command_id, fingerprint):
                return self.repository.save(aggregate, metadata, command_id, fingerprint)
            case _Pause(seconds):
                time.sleep(seconds)
        return None

    def load(self, aggregate_class: type[A], stream_id: str) -> A:
        """The aggregate as stored now (never from the cache)."""
        return self.repository.load(aggregate_class, stream_id)


class AsyncCommandBus:
    """``CommandBus`` for asyncio services (the HTTP command API runs on it): concurrent
    commands share transactions through the store's group commit, with no thread hop."""

    def __init__(self, repository: AsyncRepository, registry: CommandRegistry) -> None:
        self.repository = repository
        self.registry = registry
        self._execution = _Execution(registry, repository.cache)

    async def execute(self, command: Command, metadata: Mapping[str, Any] | None = None,
                      correlation_id: str | None = None) -> CommandResult:
        stepper = _Stepper(self._execution.steps(command, metadata, correlation_id))
        while (request := stepper.next_request()) is not None:
            try:
                stepper.answer(await self._perform(request))
            except Exception as exc:
                stepper.fail(exc)
        return stepper.result

    async def _perform(self, request: _Request) -> Any:
        match request:
            case _FindResult(command_id):
                return await self.repository.store.command_result(command_id)
            case _Load(aggregate_class, stream_id):
                return await self.repository.load(aggregate_class, stream_id)
            case _Save(aggregate, metadata, command_id, fingerprint):
                return await self.repository.save(aggregate, metadata, command_id, fingerprint)
            case _Pause(seconds):
                await asyncio.sleep(seconds)
        return None

    async def load(self, aggregate_class: type[A], stream_id: str) -> A:
        return await self.repository.load(aggregate_class, stream_id)


def _replayed(command: Command, fingerprint: str | None, earlier: AppendResult
              ) -> CommandResult:
    """The first result of ``command``'s id, if the id was first used for the same payload.
    (Results logged before fingerprints existed carry none and are trusted.)"""
    if earlier.fingerprint is not None and earlier.fingerprint != fingerprint:
        assert command.command_id is not None
        raise CommandIdReused(command.command_id)
    return CommandResult.of(earlier, replayed=True)


class _CachedAggregateRejected(Exception):
    """A cached aggregate refused the command; the bus retries on the stored one."""


def _event_metadata(command: Command, metadata: Mapping[str, Any] | None,
                    correlation_id: str | None) -> dict[str, Any]:
    command_id = str(command.command_id or uuid.uuid4())
    return {**(metadata or {}), "command": command.command_name,
            "causation_id": command_id, "correlation_id": correlation_id or command_id}
