"""What the runtime and the operators' views read of an app's declaration (``app.Eventfold``
is one): named by what they ask of it, so that none of them imports the app module."""

from __future__ import annotations

from typing import Protocol

from eventfold.projections.definition.registry import ProjectionRegistry
from eventfold.reactions import ReactionRegistry
from eventfold.write_model import CommandRegistry


class DeclaredApp(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def commands(self) -> CommandRegistry: ...
    @property
    def projections(self) -> ProjectionRegistry: ...
    @property
    def reactions(self) -> ReactionRegistry: ...
    @property
    def aggregate_types(self) -> list[str]: ...
