"""The application entry point: one object that declares an app's commands, projections and
reactions.

    app = Eventfold("inventory", aggregates=[Product], projections=[inventory_totals],
                    reactions=[reserve_stock])

    @app.commands.handler(ReceiveStock, Product)
    def receive_stock(product: Product, command: ReceiveStock) -> None: ...

    runtime = app.runtime(Settings.from_env())   # the services: eventfold.runtime

The CLI loads it from ``EVENTFOLD_APP`` (``module:attribute``) and builds one runtime per
process from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from eventfold.config import ConfigError, Settings
from eventfold.loading import AppNotFound, import_app_module
from eventfold.projections.definition.projection import Projection
from eventfold.projections.definition.registry import ProjectionRegistry
from eventfold.reactions import ReactionRegistry
from eventfold.reactions.definition import Declared
from eventfold.runtime import Runtime
from eventfold.write_model import Aggregate, CommandRegistry


class Eventfold:
    def __init__(self, name: str, *, aggregates: Iterable[type[Aggregate]] = (),
                 projections: Iterable[Projection] = (),
                 reactions: Iterable[Declared] = ()) -> None:
        """``aggregates`` (their ``@handles`` methods), ``projections`` and ``reactions``
        (reactions, process managers, effects) added as ``commands.add``,
        ``projections.add`` and ``reactions.add`` would."""
        self.name = name
        self.commands = CommandRegistry()
        self.projections = ProjectionRegistry()
        self.reactions = ReactionRegistry(self.projections)
        for aggregate in aggregates:
            self.commands.add(aggregate)
        for projection in projections:
            self.projections.add(projection)
        for reaction in reactions:
            self.reactions.add(reaction)

    @property
    def aggregate_types(self) -> list[str]:
        return sorted(set(self.commands.aggregate_types)
                      | set(self.projections.source_aggregate_types)
                      | set(self.reactions.source_aggregate_types))

    def runtime(self, settings: Settings) -> Runtime:
        """The services of this app in this process, made from ``settings``."""
        return Runtime(self, settings)


def app_of(settings: Settings) -> Eventfold:
    """The application ``EVENTFOLD_APP`` names, from ``EVENTFOLD_APP_DIR`` or the working
    directory first."""
    return load_app(settings.app, settings.app_dir)


def load_app(spec: str, app_dir: str | Path = "") -> Eventfold:
    """Import ``module:attribute`` (from the working directory and ``app_dir`` first, as
    uvicorn does: ``eventfold.loading``) and check that it is an Eventfold application."""
    try:
        module, attribute = import_app_module(spec, app_dir)
        app = getattr(module, attribute)
    except AppNotFound as exc:
        raise ConfigError(f"cannot load the application: {exc}") from None
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load EVENTFOLD_APP={spec!r}: {exc}") from exc
    if not isinstance(app, Eventfold):
        raise ConfigError(f"EVENTFOLD_APP={spec!r} is a {type(app).__name__}, not an Eventfold")
    return app
