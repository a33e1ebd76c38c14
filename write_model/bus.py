"""The command bus: load the target aggregate, run the handler, append atomically, as one
I/O-free execution (``_Execution``) that a blocking bus (``CommandBus``) and an async one
(``AsyncCommandBus``) both perform, so both follow exactly the same rules.

A command may carry a ``command_id``: executing the same id again returns the first result
and appends nothing, also when the first attempt committed but its response was lost.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from eventfold.write_model.commands import Command, CommandRegistry, CommandResult, HandlerSpec
from eventfold.write_model.domain.aggregate import Aggregate, DomainError
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
