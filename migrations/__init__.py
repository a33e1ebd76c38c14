"""Migrations: the Alembic history of Eventfold's own tables in Postgres.

Owns: the event store, the outbox and its publication, and the projection checkpoint table.
``alembic upgrade head`` (alembic.ini at the repository root) or ``upgrade(url)`` applies them.

May import: alembic and SQLAlchemy, plus ``write_model.schema`` for the table names. Read-model
tables belong to their projections, which create them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import command
from alembic.config import Config

SCRIPT_LOCATION = Path(__file__).resolve().parent


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def revision_module(filename: str) -> ModuleType:
    """An earlier revision's module, for the SQL text a downgrade puts back."""
    path = SCRIPT_LOCATION / "versions" / filename
    spec = importlib.util.spec_from_file_location(f"eventfold_revision_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def apply_edits(text: str, edits: list[tuple[str, str]], revision: str) -> str:
    """``text`` (an earlier revision's SQL) with each (old, new) edit made; each old text must
    occur exactly once, so that an edit never lands somewhere unintended."""
    for old, new in edits:
        if text.count(old) != 1:
            raise RuntimeError(f"{revision}: expected one occurrence of {old[:60]!r}")
        text = text.replace(old, new)
    return text
