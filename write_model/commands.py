"""Commands and where they are handled: the ``Command`` model (validated, with the field that
names its aggregate), ``handles`` on an aggregate's method, and the ``CommandRegistry`` that
finds a command's handler. The bus that executes them is ``bus``."""

from __future__ import annotations

import hashlib
import inspect
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError, to_jsonable_python

from eventfold.write_model.domain.aggregate import Aggregate
from eventfold.write_model.domain.values import storable_problem
from eventfold.write_model.persistence.store import (
    AppendResult,
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
