"""A projection's read model tables are created and migrated through Alembic, on the real
Postgres: additive changes apply on start, others ask for a replay."""

from __future__ import annotations

import dataclasses

import pytest
from eventfold.projections import Event, FoldProjection, State
from eventfold.projections.state.schema import SchemaNeedsReplay, migrate, state_table
from eventfold.projections.state.store import ReadModelStore
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    Integer,
    Numeric,
    String,
    create_engine,
    inspect,
)

from eventfold import migrations

SYSTEM = {"key", "_version", "_position", "_deleted", "_updated_at"}


def keep(state: State | None, event: Event) -> State | None:
    return state


@pytest.fixture
def engine(stack_settings):
    migrations.upgrade(stack_settings.database_url)  # the reader role the tables are granted to
    engine = create_engine(stack_settings.database_url)
    yield engine
    engine.dispose()


def ensure(stack_settings, projection: FoldProjection) -> None:
    store = ReadModelStore(stack_settings.database_url, projection, 1)
    try:
        store.ensure_schema()
    finally:
        store.close()


def test_tables_are_created_grow_columns_and_indexes_and_drop_undeclared_indexes(
        stack_settings, engine, unique) -> None:
    base = FoldProjection(name=f"schema_{unique}", sources=("Thing",), apply=keep,
                      columns={"total": BigInteger()})
    ensure(stack_settings, base)
    table = state_table(base, 1)
    assert {c["name"] for c in inspect(engine).get_columns(table)} == SYSTEM | {"total"}

    grown = dataclasses.replace(base, columns={
        "total": BigInteger(), "label": String(), "price": Numeric(10, 2), "tags": JSON(),
        "ratio": Float(), "flag": Boolean(), "count": Integer()}, indexes=("label",))
    ensure(stack_settings, grown)
    found = inspect(engine)
    assert {c["name"] for c in found.get_columns(table)} == SYSTEM | set(grown.columns)
    assert [(i["name"], i["column_names"]) for i in found.get_indexes(table)] == [
        (f"{table}_label", ["label", "key"])]
    with engine.begin() as conn:  # every declared type reads back as itself: nothing to do
        assert migrate(conn, grown, 1) == []

    ensure(stack_settings, dataclasses.replace(grown, indexes=()))  # an index no longer declared
    assert inspect(engine).get_indexes(table) == []


def test_a_removed_or_retyped_column_asks_for_a_replay(stack_settings, engine, unique) -> None:
    base = FoldProjection(name=f"schema_{unique}", sources=("Thing",), apply=keep,
                      columns={"total": BigInteger(), "label": String()})
    ensure(stack_settings, base)
    without_label = dataclasses.replace(base, columns={"total": BigInteger()})
    with pytest.raises(SchemaNeedsReplay, match=r"label is no longer declared.*replay"):
        ensure(stack_settings, without_label)
    retyped = dataclasses.replace(base, columns={"total": String(), "label": String()})
    with pytest.raises(SchemaNeedsReplay, match=r"total changes type"):
        ensure(stack_settings, retyped)
    ensure(stack_settings, base)  # the table was left as it was
