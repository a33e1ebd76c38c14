"""A projection's read model tables are created and migrated through Alembic, on the real
Postgres: additive changes apply on start, others ask for a replay."""

from __future__ import annotations

import dataclasses

import pytest
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
from eventfold.projections import Event, FoldProjection, State
from eventfold.projections.outcome import KeyState
from eventfold.projections.state.schema import SchemaNeedsReplay, migrate, state_table
from eventfold.projections.state.stage import StagedBatch
from eventfold.projections.state.store import ReadModelStore

SYSTEM = {"key", "_version", "_position", "_deleted", "_updated_at", "_deleted_at"}


def keep(state: State | None, event: Event) -> State | None:
    return state


@pytest.fixture
def engine(stack_settings):
    migrations.upgrade(stack_settings.database_url)  # the reader role the tables are granted to
    engine = create_engine(stack_settings.database_url)
    yield engine
    engine.dispose()


def totals(name: str) -> FoldProjection:
    """A projection of one column, its rows written by the test."""
    return FoldProjection(name=name, sources=("Thing",), apply=keep,
                          columns={"total": BigInteger()})


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
        (f"{table}__deleted_at", ["_deleted_at"]), (f"{table}_label", ["label", "key"])]
    with engine.begin() as conn:  # every declared type reads back as itself: nothing to do
        assert migrate(conn, grown, 1) == []

    ensure(stack_settings, dataclasses.replace(grown, indexes=()))  # an index no longer declared
    assert [i["name"] for i in inspect(engine).get_indexes(table)] == [f"{table}__deleted_at"]


def test_deleted_keys_are_forgotten_after_their_retention_a_bounded_batch_at_a_time(
        stack_settings, engine, unique) -> None:
    """Rows of keys deleted long enough ago go, by the partial index of deleted rows, at most
    ``batch`` x ``batches`` a pass; live rows and recently deleted ones stay. Resolutions of
    letters below the dead-letter topic's first offset go too."""
    projection = totals(f"forget_{unique}")
    ensure(stack_settings, projection)
    table = state_table(projection, 1)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO {table} (key, total, _version, _position, _deleted, _deleted_at, "
            "_updated_at) SELECT 'old-' || n, NULL::bigint, 3, n, true, "
            "now() - interval '8 days', now() FROM generate_series(1, 5) AS n UNION ALL "
            "SELECT 'recent', NULL, 2, 9, true, now() - interval '1 day', now() UNION ALL "
            "SELECT 'live', 7, 1, 10, false, NULL, now() - interval '30 days'")
        conn.exec_driver_sql(
            "INSERT INTO dead_letter_resolutions (projection, dead_letter_offset, action, "
            f"resolved_by) SELECT '{projection.name}', n, 'discarded', 'tester' "
            "FROM generate_series(0, 4) AS n")
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # can the index serve it?
        plan = "\n".join(row[0] for row in conn.exec_driver_sql(
            f"EXPLAIN SELECT key FROM {table} WHERE _deleted AND _deleted_at < now() "
            "ORDER BY _deleted_at LIMIT 5000"))
    assert f"{table}__deleted_at" in plan, plan

    store = ReadModelStore(stack_settings.database_url, projection, 1)
    try:
        week = 7 * 86_400.0
        assert store.forget_deleted(week, batch=2, batches=2) == 4  # bounded: 2 x 2
        assert store.forget_deleted(week, batch=2, batches=2) == 1
        assert store.forget_deleted(week) == 0
        assert store.forget_resolutions_before(3) == 3
    finally:
        store.close()
    with engine.begin() as conn:
        left = {key for (key,) in conn.exec_driver_sql(f"SELECT key FROM {table}")}
        offsets = [o for (o,) in conn.exec_driver_sql(
            "SELECT dead_letter_offset FROM dead_letter_resolutions WHERE projection = "
            f"'{projection.name}' ORDER BY 1")]
    assert left == {"recent", "live"}
    assert offsets == [3, 4]


def deletion_times(engine, table: str) -> dict[str, object]:
    with engine.begin() as conn:
        return dict(conn.exec_driver_sql(f"SELECT key, _deleted_at FROM {table}").all())


def test_a_key_is_dated_when_it_is_deleted_and_only_then(stack_settings, engine, unique) -> None:
    """The merge dates a row as its key is deleted, keeps the date while it stays deleted
    (the retention counts from the deletion) and clears it when the key lives again; a fresh
    version's rows written straight into its table are dated the same way."""
    projection = totals(f"dated_{unique}")
    table = state_table(projection, 1)
    with ReadModelStore(stack_settings.database_url, projection, 1) as store:
        store.ensure_schema()

        def merge(attempt: str, changed: dict[str, KeyState], known: dict[str, bool]) -> None:
            new, old, live = store.stage(attempt).rows(changed.items(), known)
            with store.conn.transaction():
                store.merge(StagedBatch(attempt, new_rows=new, known_rows=old,
                                        live_rows_delta=live))
                store.unstage(attempt)

        merge("a1", {"live": KeyState({"total": 1}, 1, 1), "gone": KeyState(None, 1, 2)}, {})
        first = deletion_times(engine, table)
        assert first["live"] is None and first["gone"] is not None
        merge("a2", {"live": KeyState(None, 2, 3), "gone": KeyState(None, 2, 4)},
              {"live": True, "gone": False})
        second = deletion_times(engine, table)
        assert second["live"] is not None and second["gone"] == first["gone"]
        merge("a3", {"gone": KeyState({"total": 5}, 3, 5)}, {"gone": False})
        assert deletion_times(engine, table)["gone"] is None

    fresh = state_table(projection, 2)
    with ReadModelStore(stack_settings.database_url, projection, 2) as store:
        store.ensure_schema()
        store.begin_direct()
        assert store.stage("d1").direct([("live", KeyState({"total": 1}, 1, 1)),
                                         ("gone", KeyState(None, 1, 2))]) == (2, 1)
    dated = deletion_times(engine, fresh)
    assert dated["live"] is None and dated["gone"] is not None


def test_a_table_from_before_deletion_dates_migrates_and_keeps_room_for_updates(
        stack_settings, engine, unique) -> None:
    """A state table as versions before ``_deleted_at`` made it: the column is added, its
    deleted rows dated by their last update (their retention goes on from there), the
    retention index replaced and its pages left room for updates, once."""
    projection = totals(f"olddates_{unique}")
    table = state_table(projection, 1)
    before = (f"CREATE TABLE {table} (key text PRIMARY KEY, total bigint, "
              "_version bigint NOT NULL, _position bigint NOT NULL, "
              "_deleted boolean NOT NULL DEFAULT false, "
              "_updated_at timestamptz NOT NULL DEFAULT now())",
              f"CREATE INDEX {table}__deleted ON {table} (_updated_at) WHERE _deleted",
              f"INSERT INTO {table} VALUES ('gone', NULL, 2, 1, true, now() - interval "
              "'3 days'), ('live', 4, 1, 2, false, now() - interval '5 days')")
    with engine.begin() as conn:
        for statement in before:
            conn.exec_driver_sql(statement)
    ensure(stack_settings, projection)
    with engine.begin() as conn:
        rows = dict(conn.exec_driver_sql(
            f"SELECT key, _deleted_at IS NOT DISTINCT FROM (CASE WHEN _deleted "
            f"THEN _updated_at END) FROM {table}").all())
        options = conn.exec_driver_sql(
            f"SELECT reloptions FROM pg_class WHERE oid = '{table}'::regclass").scalar()
        assert migrate(conn, projection, 1) == []
    assert rows == {"gone": True, "live": True}
    assert options == ["fillfactor=80"]
    assert [i["name"] for i in inspect(engine).get_indexes(table)] == [f"{table}__deleted_at"]


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
