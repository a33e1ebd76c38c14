"""The projections of an application, by name."""

from __future__ import annotations

from collections.abc import Iterator

from eventfold.projections.definition.projection import Projection


class ProjectionRegistry:
    def __init__(self) -> None:
        self._by_name: dict[str, Projection] = {}

    def add(self, projection: Projection) -> Projection:
        if projection.name in self._by_name:
            raise ValueError(f"projection {projection.name!r} is already registered")
        self._by_name[projection.name] = projection
        return projection

    def get(self, name: str) -> Projection:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name)) or "none"
            raise LookupError(f"unknown projection {name!r}; known: {known}") from None

    def __iter__(self) -> Iterator[Projection]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def source_aggregate_types(self) -> list[str]:
        return sorted({source for p in self for source in p.sources})
