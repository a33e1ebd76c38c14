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
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Eventfold", "Runtime", "Settings"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `import eventfold.config` does not pull in Spark and FastAPI.
    if name == "Eventfold":
        from eventfold.app import Eventfold

        return Eventfold
    if name == "Runtime":
        from eventfold.runtime import Runtime

        return Runtime
    if name == "Settings":
        from eventfold.config import Settings

        return Settings
    raise AttributeError(name)
