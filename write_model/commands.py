"""Commands and their handlers: load the target aggregate, run the handler, append atomically."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from write_model.aggregate import Aggregate
from write_model.repository import Repository
from write_model.store import ConcurrencyError, StreamNotFound

A = TypeVar("A", bound=Aggregate)
C = TypeVar("C", bound="Command")


class Command(BaseModel):
    """Base of commands: a validated request to change one aggregate.

    Subclasses declare their fields with pydantic and implement ``stream_id``. A command with
    ``expected_version`` set fails with a conflict if the aggregate moved on; without it the bus
    retries a lost race against the latest version.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    command_name: ClassVar[str]

    expected_version: int | None = Field(
        default=None, ge=0, description="Optimistic concurrency: the stream version you saw."
    )

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
        """Decorator: ``handle(aggregate, command)`` calls the aggregate's command methods."""

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

    def __iter__(self) -> Any:
        return iter(self._handlers.values())

    @property
    def aggregate_types(self) -> list[str]:
        return sorted({spec.aggregate.stream_type for spec in self._handlers.values()})


class CommandBus:
    """Executes commands against the event store."""

    MAX_ATTEMPTS = 20

    def __init__(self, repository: Repository, registry: CommandRegistry) -> None:
        self.repository = repository
        self.registry = registry

    def execute(self, command: Command, metadata: Mapping[str, Any] | None = None) -> CommandResult:
        spec = self.registry.get(command.command_name)
        for attempt in range(1, self.MAX_ATTEMPTS + 1):
            aggregate = self.repository.load(spec.aggregate, command.stream_id())
            if spec.requires_existing and aggregate.version == 0:
                raise StreamNotFound(aggregate.id)
            expected = command.expected_version
            if expected is not None and expected != aggregate.version:
                raise ConcurrencyError(aggregate.id, expected, aggregate.version)
            spec.handle(aggregate, command)
            try:
                result = self.repository.save(aggregate, metadata)
            except ConcurrencyError:
                if expected is not None or attempt == self.MAX_ATTEMPTS:
                    raise
                # Jitter, so that writers that collided do not collide again in lockstep.
                time.sleep(random.uniform(0, 0.002 * attempt))
                continue
            return CommandResult(
                stream_id=result.stream_id,
                version=result.version,
                event_ids=result.event_ids,
                global_positions=result.global_positions,
            )
        raise AssertionError("unreachable")
