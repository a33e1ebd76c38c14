"""Queries over a projection's SQL read model (the view of its live rows)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

from projections import Projection

MAX_PAGE_SIZE = 500


class ReadModelQueries:
    def __init__(self, engine: Engine, projection: Projection) -> None:
        self.engine = engine
        self.projection = projection
        view = f'"{projection.table}"'  # an identifier, validated by Projection
        self._get = text(f"SELECT * FROM {view} WHERE key = :key")
        self._page = text(
            f"SELECT * FROM {view} WHERE (CAST(:after AS text) IS NULL OR key > :after) "
            "ORDER BY key LIMIT :limit"
        )

    def get(self, key: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(self._get, {"key": key}).mappings().first()
        return dict(row) if row else None

    def page(self, after: str | None, limit: int) -> list[dict[str, Any]]:
        limit = max(1, min(limit, MAX_PAGE_SIZE))
        with self.engine.connect() as conn:
            rows = conn.execute(self._page, {"after": after, "limit": limit}).mappings().all()
        return [dict(r) for r in rows]
