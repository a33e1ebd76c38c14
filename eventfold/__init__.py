"""Eventfold: event sourcing and CQRS on Postgres, Debezium, Kafka and Spark.

One installed namespace. The repository's top-level folders install under it:
``eventfold.write_model`` (write_model/), ``eventfold.outbox`` (outbox/),
``eventfold.projections`` (projections/), ``eventfold.read_api`` (read_api/),
``eventfold.reactions`` (reactions/), ``eventfold.migrations`` (migrations/) and
``eventfold.local_stack`` (local_stack/); each says in its docstring what it owns and may
import. Data flows one way: write_model -> outbox -> (Kafka) -> projections -> read_api;
reactions read the same topics and turn events into commands (-> write_model).

``eventfold.contract`` holds what every layer must agree on (partition keys, KTable header
names, database URL forms); any package may import it. This package's other modules are the
composition root that wires the packages into one application: the configuration object
(environment variables, ``eventfold.toml``), the ``Eventfold`` declaration of an app (its
commands, projections and reactions), the ``Runtime`` a process builds once from the
settings to make its services (``runtime``, with ``wiring``: the settings translated for
each package), the ``eventfold`` CLI (``cli``, a module per area), HTTP serving, and what
operators see: logs (``logs``), Prometheus exposition (``metrics``, ``run_observer``),
``eventfold status`` (``status``) and the dashboard (``dashboard``). They may import every
subpackage; no subpackage imports them.

Users import what they write an app with from here alone: ``from eventfold import Aggregate,
Command, DomainEvent, Eventfold, handles, projection, reaction``. Each name loads on first use
from the package that owns it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eventfold.contract.lazy import lazy_exports

if TYPE_CHECKING:
    from eventfold.app import Eventfold
    from eventfold.config import Settings
    from eventfold.projections import (
        AggregateFunction,
        Avg,
        Count,
        Derived,
        Dispatch,
        Event,
        EventLog,
        Latest,
        Lookup,
        Max,
        Min,
        Projection,
        State,
        Sum,
        aggregation,
        fold_in_memory,
        on_crossing,
        projection,
        stream,
    )
    from eventfold.reactions import (
        DerivedEvents,
        ProcessContext,
        effect,
        process,
        reaction,
    )
    from eventfold.runtime import Runtime
    from eventfold.write_model import (
        Aggregate,
        Command,
        CommandResult,
        DomainError,
        DomainEvent,
        TargetId,
        handles,
    )

__version__ = "0.1.0"

_OWNERS = {
    "eventfold.app": ["Eventfold"],
    "eventfold.config": ["Settings"],
    "eventfold.runtime": ["Runtime"],
    "eventfold.write_model": ["Aggregate", "Command", "CommandResult", "DomainError",
                              "DomainEvent", "TargetId", "handles"],
    "eventfold.projections": ["AggregateFunction", "Avg", "Count", "Derived", "Dispatch",
                              "Event", "EventLog", "Latest", "Lookup", "Max", "Min",
                              "Projection", "State", "Sum", "aggregation", "fold_in_memory",
                              "on_crossing", "projection", "stream"],
    "eventfold.reactions": ["DerivedEvents", "ProcessContext", "effect", "process", "reaction"],
}
_EXPORTED_FROM = {name: module for module, names in _OWNERS.items() for name in names}
__all__ = [
    "Aggregate",
    "AggregateFunction",
    "Avg",
    "Command",
    "CommandResult",
    "Count",
    "Derived",
    "DerivedEvents",
    "Dispatch",
    "DomainError",
    "DomainEvent",
    "Event",
    "EventLog",
    "Eventfold",
    "Latest",
    "Lookup",
    "Max",
    "Min",
    "ProcessContext",
    "Projection",
    "Runtime",
    "Settings",
    "State",
    "Sum",
    "TargetId",
    "aggregation",
    "effect",
    "fold_in_memory",
    "handles",
    "on_crossing",
    "process",
    "projection",
    "reaction",
    "stream",
]


# Lazy, so that `import eventfold.config` does not pull in Spark and FastAPI.
__getattr__ = lazy_exports(globals(), _EXPORTED_FROM)
