"""Alembic environment: online migrations against EVENTFOLD_DATABASE_URL or sqlalchemy.url."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

config = context.config
url = config.get_main_option("sqlalchemy.url") or os.environ.get("EVENTFOLD_DATABASE_URL")
if not url:
    raise SystemExit("set EVENTFOLD_DATABASE_URL (postgresql+psycopg://user@host:port/db)")

engine = create_engine(url)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
