"""The read API on the real stack: a read model and KTable written by the projection sinks
into Postgres and Kafka, queried over HTTP as the read-only role."""

from __future__ import annotations

import base64
import dataclasses
import logging
import random
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import orjson
import psycopg
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from eventfold.contract import libpq_url
from eventfold.local_stack.process import free_port
from eventfold.projections.state.catalog import READER_ROLE, ProjectionCatalog
from eventfold.projections.state.store import ReadModelStore
from eventfold.read_api import ReadApiOptions, create_read_app
from eventfold.read_api import params as read_params
from eventfold.read_api.metrics import READ_YOUR_WRITES
from eventfold.read_api.query import encode_cursor, page_query, parse_list_query, parse_sort
from eventfold.read_api.schema import ReadModelSchema
from eventfold.serving import BackgroundServer
from tests.pipeline_helpers import materialize, wait_for
from tests.support.read_api import NAMES, catalog_projection, get, read_api


def catalog_rows(count: int, seed: int) -> dict[str, dict]:
    rng = random.Random(seed)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return {f"p{i:03d}": {
        "name": rng.choice(NAMES),
        "price": None if rng.random() < 0.1 else Decimal(rng.randint(100, 9999)) / 100,
        "stock": rng.randint(-5, 40),
        "rating": None if rng.random() < 0.2 else round(rng.uniform(0, 5), 2),
        "active": rng.random() < 0.5,
        "tags": [rng.choice(["x", "y"])],
        "listed_at": start + timedelta(hours=rng.randint(0, 24 * 300)),
    } for i in range(count)}


@pytest.fixture(scope="module")
def catalog(inventory_app, stack_settings):
    """240 live rows and one deleted key, committed as two batches."""
    projection = catalog_projection(uuid.uuid4().hex[:8])
    states = catalog_rows(240, seed=7)
    materialize(stack_settings, projection, {**states, "gone": {"name": "x"}})
    materialize(stack_settings, projection, {"gone": None}, batch_id=1,
                first_stream_version=1000)
    return projection, states


@pytest.fixture(scope="module")
def reads(catalog, stack_settings):
    server = read_api([catalog[0]], stack_settings, "instance-a")
    yield server
    server.stop()


# -- a Python model of the query semantics -------------------------------------------------------
def expected_keys(states: dict[str, dict], predicate, sort: str) -> list[str]:
    keys = [k for k, row in states.items() if predicate(row | {"key": k})]
    spec = [(p.lstrip("-"), p.startswith("-")) for p in sort.split(",") if p]
    if "key" not in {f for f, _ in spec}:
        spec.append(("key", bool(spec) and spec[-1][1]))  # the tie-break follows the sort
    for field, descending in reversed(spec):  # stable sorts, last key first
        # (is null, value): ASC puts nulls last, and reversed (DESC) puts them first,
        # exactly as Postgres orders by default
        keys.sort(key=lambda k, f=field: (_value(states, k, f) is None,
                                           _value(states, k, f) or 0), reverse=descending)
    return keys


def _value(states, key, field):
    return key if field == "key" else states[key][field]


def all_pages(server, path: str, limit: int, **params) -> list[dict]:
    rows, cursor = [], None
    while True:
        body = get(server, path, limit=limit, **params, **({"cursor": cursor} if cursor else {}))
        assert body.status_code == 200, body.text
        page = body.json()
        assert len(page["rows"]) <= limit
        rows += page["rows"]
        cursor = page["next_cursor"]
        if cursor is None:
            return rows


JUNE = datetime(2026, 6, 1, tzinfo=UTC)
CASES = [
    ({}, lambda r: True),
    ({"stock.gte": "0"}, lambda r: r["stock"] >= 0),
    ({"name": "apple"}, lambda r: r["name"] == "apple"),
    ({"name.in": "apple,pear"}, lambda r: r["name"] in ("apple", "pear")),
    ({"name.prefix": "ban"}, lambda r: (r["name"] or "").startswith("ban")),
    ({"name.ne": "apple"}, lambda r: r["name"] != "apple"),
    ({"price.lt": "50.5", "active": "true"},
     lambda r: r["price"] is not None and r["price"] < Decimal("50.5") and r["active"]),
    ({"rating.null": "true"}, lambda r: r["rating"] is None),
    ({"price.null": "false", "stock.lt": "10"},
     lambda r: r["price"] is not None and r["stock"] < 10),
    ({"listed_at.gte": JUNE.isoformat()}, lambda r: r["listed_at"] >= JUNE),
    ({"key.gt": "p100", "key.lte": "p150"}, lambda r: "p100" < r["key"] <= "p150"),
]
SORTS = ["", "-price", "stock,-name", "-listed_at", "name,-stock", "-key"]


@pytest.mark.parametrize("sort", SORTS)
def test_filtered_sorted_pages_match_a_python_model(reads, catalog, sort):
    projection, states = catalog
    path = f"/read-models/{projection.name}"
    for limit, (params, predicate) in zip([7, 25, 500] * 4, CASES, strict=False):
        wanted = expected_keys(states, predicate, sort)
        query = {**params, **({"sort": sort} if sort else {})}
        rows = all_pages(reads, f"{path}/rows", limit, **query)
        assert [r["key"] for r in rows] == wanted, (query, limit)
        count = get(reads, f"{path}/count", **params).json()
        assert count["count"] == len(wanted) and count["exact"] is True, params


def test_get_by_key_fields_and_freshness(reads, catalog):
    projection, states = catalog
    path = f"/read-models/{projection.name}"
    body = get(reads, f"{path}/rows/p005").json()
    assert body["row"]["stock"] == states["p005"]["stock"]
    assert body["row"]["_version"] == 6
    assert body["freshness"]["projection_version"] == 1
    assert body["freshness"]["batch_id"] == 1
    assert body["freshness"]["lag_events"] == 0
    assert get(reads, f"{path}/rows/gone").status_code == 404
    page = get(reads, f"{path}/rows", fields="name,price", sort="-stock", limit=3).json()
    assert all(set(r) == {"key", "name", "price"} for r in page["rows"])
    assert get(reads, f"{path}/rows", fields="name", sort="-stock", limit=3,
               cursor=page["next_cursor"]).status_code == 200


def test_discovery_and_openapi_describe_each_read_model(reads, catalog):
    projection, _ = catalog
    models = {m["name"]: m for m in get(reads, "/read-models").json()}
    fields = models[projection.name]["fields"]
    assert fields["price"] == {"type": "decimal", "sortable": True, "filterable": True}
    assert fields["tags"] == {"type": "json", "sortable": False, "filterable": False}
    assert fields["rating"]["sortable"] is False
    openapi = get(reads, "/openapi.json").json()
    row_path = openapi["paths"][f"/read-models/{projection.name}/rows/{{key}}"]["get"]
    schema = row_path["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["properties"]["row"]["properties"]["listed_at"]["anyOf"][0]["format"] == \
        "date-time"


@pytest.mark.parametrize(("params", "message"), [
    ({"colour": "red"}, "unknown field 'colour'"),
    ({"stock.like": "1"}, "unknown operator 'like'"),
    ({"stock": "many"}, "not a valid integer"),
    ({"tags": "x"}, "holds JSON"),
    ({"sort": "rating"}, "not indexed"),
    ({"sort": "stock,stock"}, "appears twice"),
    ({"limit": "501"}, "between 1 and 500"),
    ({"limit": "0"}, "between 1 and 500"),
    ({"fields": "key,secret"}, "unknown field 'secret'"),
    ({"stock.prefix": "1"}, "prefix needs a text field"),
    ({"cursor": "not-a-cursor"}, "cursor"),
])
def test_bad_queries_are_400_naming_the_problem(reads, catalog, params, message):
    response = get(reads, f"/read-models/{catalog[0].name}/rows", **params)
    assert response.status_code == 400, response.text
    assert message in response.json()["detail"]


@pytest.mark.parametrize("sort", ["-stock", "price", "-key"])
def test_a_deep_page_reads_a_few_pages_of_rows_whatever_its_depth(catalog, stack_settings,
                                                                   sort):
    """A page after a cursor in the middle reads at most one page per branch (a range of
    the (field, key) index each; one range when the sort allows), not every row before it:
    counted in the executed plan's
    scans, with sequential and bitmap scans priced out so that the planner cannot hide a
    missing index behind a small table."""
    projection, states = catalog
    schema = ReadModelSchema.of(projection)
    ordered = expected_keys(states, lambda r: r["stock"] >= 0, sort)
    middle = ordered[len(ordered) // 2]
    limit = 5
    query = parse_list_query(schema, [
        ("sort", sort), ("stock.gte", "0"), ("limit", str(limit)),
        ("cursor", encode_cursor(parse_sort(schema, sort), {"key": middle, **states[middle]}))])
    page = page_query(schema, query)
    with psycopg.connect(libpq_url(stack_settings.database_url), autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_bitmapscan = off")  # reads every match, as a big table's
        rows = [row[0] for row in conn.execute(page.sql, page.params)]  # limit would not
        (plan,), = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + page.sql,
                                page.params).fetchall()
    assert rows == ordered[len(ordered) // 2 + 1:][:limit + 1]

    def scans(node: dict) -> list[dict]:
        return ([node] if "Scan" in node["Node Type"] else []) + [
            scan for child in node.get("Plans", []) for scan in scans(child)]
    found = scans(plan[0]["Plan"])
    assert found and all("Index" in scan["Node Type"] for scan in found), plan
    if sort != "price":  # one direction, no null after a value: one range, as a first page
        cond = found[0]["Index Cond"]  # the cursor starts the scan, not filters it
        assert len(found) == 1 and ("ROW(stock, key) <" in cond or "(key <" in cond), plan
    read = sum(scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0) for scan in found)
    # a branch may skip rows the filter drops (stock < 0: about one in nine)
    assert read <= 2 * len(found) * (limit + 1) < len(ordered) // 2, plan


@pytest.fixture(scope="module")
def big_catalog(inventory_app, stack_settings):
    """The catalog's read model with 300,001 rows (all but one inserted by SQL, then
    analyzed): counting or sorting them all takes longer than a few milliseconds."""
    projection = catalog_projection(uuid.uuid4().hex[:8])
    materialize(stack_settings, projection, {"p000": {"stock": 1}})
    table = sql.Identifier(projection.table)
    with psycopg.connect(libpq_url(stack_settings.database_url), autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {} (key, stock, _version, _position) "
                             "SELECT 'q' || g, g % 50, 1, g "
                             "FROM generate_series(1, 300000) g").format(table))
        # (autovacuum analyzes it too, later): the table behind the view
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(f"{projection.table}__v1")))
    return projection


def test_a_slow_count_answers_an_estimate_and_a_slow_page_a_503(big_catalog, stack_settings):
    path = f"/read-models/{big_catalog.name}"
    half = {"stock.lt": "25"}  # half the rows
    impatient = read_api([big_catalog], stack_settings, "impatient", read_count_timeout_ms=1,
                         read_statement_timeout_ms=50)
    patient = read_api([big_catalog], stack_settings, "patient")
    bounded = read_api([big_catalog], stack_settings, "bounded", read_count_timeout_ms=60_000,
                       read_exact_count_max_rows=100_000)
    try:
        # over the bound: the estimate at once, however patient; under it, counted
        over = get(bounded, f"{path}/count", **half).json()
        assert over["exact"] is False and 120_000 <= over["count"] <= 180_000, over
        under = get(bounded, f"{path}/count", **{"stock.lt": "1"}).json()
        assert (under["count"], under["exact"]) == (6_000, True), under  # g % 50 == 0
        estimated = get(impatient, f"{path}/count", **half).json()
        assert estimated["exact"] is False
        assert 120_000 <= estimated["count"] <= 180_000, estimated
        counted = get(patient, f"{path}/count", **half).json()
        assert (counted["count"], counted["exact"]) == (150_001, True)  # p000 too
        # two sort fields, the first null everywhere: every row is sorted
        slow = get(impatient, f"{path}/rows", sort="name,-stock", limit=5)
        assert slow.status_code == 503, slow.text
        assert slow.json()["detail"].startswith(
            "the query ran past the read statement timeout (50 ms)")
        assert get(patient, f"{path}/rows", sort="name,-stock", limit=5).status_code == 200
    finally:
        impatient.stop()
        patient.stop()
        bounded.stop()


def test_a_cursor_only_fits_the_sort_it_was_made_for(reads, catalog):
    path = f"/read-models/{catalog[0].name}/rows"
    cursor = get(reads, path, sort="-stock", limit=2).json()["next_cursor"]
    response = get(reads, path, sort="price", cursor=cursor)
    assert response.status_code == 400
    assert "made for sort=-stock,-key" in response.json()["detail"]


def _cursor(payload) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(payload)).decode()


INJECTIONS = [
    ("name", "x' OR '1'='1", 200),
    ("name.in", "apple','pear", 200),
    ("name.prefix", "%", 200),
    ("key", "p001'; DROP TABLE projection_versions; --", 200),
    ("name'; DROP TABLE projection_versions; --", "1", 400),
    ("stock", "1 OR 1=1", 400),
    ("stock.gte", "0; DELETE FROM projection_checkpoints", 400),
    ("sort", "name; DROP TABLE projection_versions", 400),
    ("sort", "(SELECT 1)", 400),
    ("sort", "name DESC, (CASE WHEN 1=1 THEN key END)", 400),
    ("fields", "key,(SELECT rolpassword FROM pg_authid)", 400),
    ("fields", "*", 400),
    ("cursor", _cursor({"sort": ["key"], "after": ["' OR 1=1 --"]}), 200),
    ("cursor", _cursor({"sort": ["key; DROP TABLE events"], "after": ["x"]}), 400),
    ("cursor", _cursor({"sort": ["stock", "key"], "after": ["1) OR (1=1", "x"]}), 400),
    ("cursor", _cursor({"sort": ["key"], "after": [{"$gt": ""}]}), 400),
    ("cursor", _cursor({"sort": ["key"], "after": [None]}), 400),
]


@pytest.mark.parametrize(("name", "value", "status"), INJECTIONS)
def test_sql_injection_attempts_are_rejected_or_inert(reads, catalog, stack_settings, name,
                                                      value, status):
    projection, states = catalog
    response = get(reads, f"/read-models/{projection.name}/rows", **{name: value})
    assert response.status_code == status, response.text
    if status == 200:
        assert all(r["key"] in states for r in response.json()["rows"])
        if name != "cursor":
            assert response.json()["rows"] == []  # the value matched as a value, literally
    with psycopg.connect(libpq_url(stack_settings.database_url)) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{projection.table}"').fetchone()[0] == 240
        assert conn.execute("SELECT count(*) FROM projection_versions").fetchone()[0] > 0


def test_queries_run_as_a_read_only_role_that_cannot_see_events(catalog, stack_settings):
    projection, _ = catalog
    with psycopg.connect(libpq_url(stack_settings.database_url), autocommit=True) as conn:
        conn.execute(f"SET ROLE {READER_ROLE}")
        conn.execute("SET default_transaction_read_only = on")
        assert conn.execute(f'SELECT count(*) FROM "{projection.table}"').fetchone()[0] == 240
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM events LIMIT 1")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM outbox LIMIT 1")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f'DELETE FROM "{projection.table}"')  # SELECT is all it was granted
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TEMP TABLE scratch (x int)")


def test_read_your_writes_waits_then_answers_504_with_the_current_version(reads, catalog):
    projection, _ = catalog
    row = f"/read-models/{projection.name}/rows/p005"
    assert get(reads, row, min_version=6).json()["row"]["_version"] == 6
    late = get(reads, row, min_version=9, wait_ms=300)
    assert late.status_code == 504
    assert late.json()["current_version"] == 6
    entry = f"/ktables/{projection.name}/entries/p005"
    assert get(reads, entry, min_version=6).json()["version"] == 6
    assert get(reads, entry, min_version=9, wait_ms=300).status_code == 504
    assert get(reads, row, min_version="x").status_code == 400
    assert get(reads, row, wait_ms="99999999", min_version=1).status_code == 400


def test_a_waiting_read_wakes_at_the_commit_not_at_a_poll(inventory_app, stack_settings,
                                                          monkeypatch):
    """Polls put 30 s apart: only the batch commit's notification can answer the waiting
    read within seconds."""
    monkeypatch.setattr(read_params, "_POLL_S", 30.0)
    monkeypatch.setattr(read_params, "_NOTIFIED_POLL_S", 30.0)
    projection = catalog_projection(uuid.uuid4().hex[:8])
    materialize(stack_settings, projection, {"p1": {"stock": 1}})
    server = read_api([projection], stack_settings, "woken")
    waited = READ_YOUR_WRITES.labels("read_model", "waited")
    waits_before = waited._value.get()
    try:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(get, server, f"/read-models/{projection.name}/rows/p1",
                                  min_version=2, wait_ms=25_000)
            time.sleep(1.0)  # for the read to start waiting (checked below: it waited)
            materialize(stack_settings, projection, {"p1": {"stock": 2}}, batch_id=1,
                        first_stream_version=2)
            committed = time.monotonic()
            response = waiting.result(timeout=25)
            answered = time.monotonic() - committed
        assert response.status_code == 200 and response.json()["row"]["stock"] == 2
        assert answered < 5, answered
        assert waited._value.get() == waits_before + 1
    finally:
        server.stop()


def test_ktable_interactive_queries(reads, catalog):
    projection, states = catalog
    path = f"/ktables/{projection.name}"
    body = get(reads, f"{path}/entries/p005").json()
    assert body["value"]["stock"] == states["p005"]["stock"]
    assert body["freshness"]["restored"] is True
    assert get(reads, f"{path}/entries/gone").status_code == 404  # the tombstone deleted it
    ranged = get(reads, f"{path}/entries", **{"from": "p010", "to": "p019"}).json()
    assert [e["key"] for e in ranged["entries"]] == [f"p{i:03d}" for i in range(10, 20)]
    keys, after = [], None
    while True:
        page = get(reads, f"{path}/entries", limit=64, **({"after": after} if after else {}))
        keys += [e["key"] for e in page.json()["entries"]]
        after = page.json()["next_after"]
        if after is None:
            break
    assert keys == sorted(states)
    lines = get(reads, f"{path}/entries", format="ndjson").text.splitlines()
    assert [orjson.loads(line)["key"] for line in lines] == sorted(states)
    count = get(reads, f"{path}/count").json()
    assert count["count"] == 240 and count["approximate"] is True
    assert get(reads, f"{path}/entries", format="xml").status_code == 400
    assert get(reads, "/ktables/nope/entries/x").status_code == 404


def test_two_instances_each_hold_the_full_ktable(reads, catalog, stack_settings):
    projection, states = catalog
    other = read_api([projection], stack_settings, "instance-b")
    try:
        for server, instance in ((reads, "instance-a"), (other, "instance-b")):
            meta = get(server, "/ktables").json()
            assert meta["instance"] == instance
            (table,) = meta["ktables"]
            assert table["keys"] == 240 and table["restored"] is True
            assert table["restore"]["records"] >= 241  # every record, tombstone included
            assert get(server, f"/ktables/{projection.name}/entries/p100").json()["value"][
                "stock"] == states["p100"]["stock"]
    finally:
        other.stop()


def test_a_restarted_instance_restores_only_what_came_after_its_checkpoint(
        inventory_app, stack_settings, caplog) -> None:
    """Its RocksDB store kept the topic's offset with the data: a restart reads the records
    written while it was down, and nothing before them."""
    caplog.set_level(logging.INFO, logger="eventfold.read_api.state.view")
    # three partitions: a store per partition, each with its own checkpoint
    projection = dataclasses.replace(catalog_projection(uuid.uuid4().hex[:8]),
                                     ktable_partitions=3)
    path = f"/ktables/{projection.name}"
    materialize(stack_settings, projection, {f"k{i}": {"stock": i} for i in range(50)})
    first = read_api([projection], stack_settings, "restarting")
    try:
        assert get(first, "/ktables").json()["ktables"][0]["restore"]["records"] == 50
    finally:
        first.stop()
    materialize(stack_settings, projection, {"k1": {"stock": 100}, "k2": None,
                                             "new": {"stock": 7}},
                batch_id=1, first_stream_version=51)
    again = read_api([projection], stack_settings, "restarting")
    try:
        (table,) = get(again, "/ktables").json()["ktables"]
        assert (table["restore"]["records"], table["keys"]) == (3, 50)
        assert get(again, f"{path}/entries/k1").json()["value"]["stock"] == 100
        assert get(again, f"{path}/entries/k2").status_code == 404
        assert get(again, f"{path}/entries/k40").json()["value"]["stock"] == 40
        assert get(again, f"{path}/count").json()["count"] == 50
    finally:
        again.stop()
    assert "restoring 3 records after the store's checkpoint" in caplog.text


def test_a_version_switch_moves_reads_to_the_new_table_and_topic(inventory_app, stack_settings):
    projection = catalog_projection(uuid.uuid4().hex[:8])
    materialize(stack_settings, projection, {"a": {"stock": 1}})
    server = read_api([projection], stack_settings, "switch")
    try:
        versions = ProjectionCatalog(stack_settings.database_url)
        assert versions.begin_build(projection.name) == 2
        materialize(stack_settings, projection, {"a": {"stock": 2}}, version=2)
        store = ReadModelStore(stack_settings.database_url, projection, 2)
        with versions.locked(projection.name) as conn:
            store.publish_view(conn)
            ProjectionCatalog.activate(conn, projection.name, 2, {})
        store.close()
        versions.close()
        row = f"/read-models/{projection.name}/rows/a"
        assert get(server, row).json()["row"]["stock"] == 2
        wait_for(lambda: get(server, f"/ktables/{projection.name}/entries/a").json()[
            "value"]["stock"] == 2, "the KTable served from the v2 topic", 30)
        meta = get(server, "/ktables").json()["ktables"][0]
        assert meta["topic"] == projection.ktable_topic_for(2)
        assert get(server, row).json()["freshness"]["projection_version"] == 2
    finally:
        server.stop()


# -- hostile input and missing pieces: 4xx / 503, never a 500 ------------------------------------
def _cursor(payload: dict) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(payload)).decode().rstrip("=")


@pytest.mark.parametrize(("path", "params"), [
    ("/rows", {"name": "a\x00"}),
    ("/rows", {"key.prefix": "\x00"}),
    ("/rows", {"key.in": "p1,\x00"}),
    ("/rows", {"key.ne": "x\x00y"}),
    ("/rows", {"name.gte": "\x00"}),
    ("/count", {"name": "\x00"}),
    ("/rows/a\x00b", {}),
    ("/rows/p100", {"min_version": "1", "stream": "s\x00"}),
    ("/rows", {"sort": "-stock", "cursor": _cursor({"sort": ["-stock"], "after": ["\x00"]})}),
    ("/rows", {"sort": "name", "cursor": _cursor({"sort": ["name", "key"],
                                                  "after": ["a\x00", "b"]})}),
    ("/rows", {"\x00": "1"}),
])
def test_nul_anywhere_in_a_read_is_400_naming_the_parameter(reads, catalog, path, params):
    response = get(reads, f"/read-models/{catalog[0].name}{path}", **params)
    assert response.status_code == 400, response.text
    assert "NUL" in response.json()["detail"] or "cursor" in response.json()["detail"]


@pytest.mark.parametrize("path", ["/entries/a\x00", "/entries?from=\x00", "/count?x=\x00"])
def test_nul_in_ktable_reads_is_400(reads, catalog, path):
    response = requests.get(f"{reads.url}/ktables/{catalog[0].name}{path}", timeout=30)
    assert response.status_code == 400, response.text


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=st.lists(st.tuples(
    st.sampled_from(["name", "name.in", "name.prefix", "key", "key.ne", "stock.gte",
                     "price.lt", "rating.null", "listed_at.gt", "sort", "fields", "limit",
                     "cursor", "x\x00"]),
    st.one_of(st.text(max_size=10), st.sampled_from(["\x00", "\ud800", "1e999", "-0",
                                                     "9" * 40, "NaN", ","])),
), max_size=4), route=st.sampled_from(["/rows", "/count", "/rows/p1"]))
def test_generated_read_parameters_never_5xx(reads, catalog, params, route):
    pairs = [(name, value.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
             for name, value in params]
    response = requests.get(f"{reads.url}/read-models/{catalog[0].name}{route}",
                            params=pairs, timeout=30)
    assert response.status_code < 500, (pairs, response.text)


def test_a_read_model_that_never_ran_is_503_and_not_ready(stack_settings):
    projection = catalog_projection(uuid.uuid4().hex[:8])
    options = ReadApiOptions(database_url=stack_settings.database_url,
                             kafka=stack_settings.kafka)
    server = BackgroundServer(create_read_app([projection], options), "127.0.0.1",
                              free_port()).start()
    try:
        listed = get(server, "/read-models").json()
        assert [r["name"] for r in listed] == [projection.name]
        for path in ("/rows", "/rows/a", "/count"):
            response = get(server, f"/read-models/{projection.name}{path}")
            assert response.status_code == 503, response.text
            assert response.headers["Retry-After"] == "1"
            assert "never run" in response.json()["detail"]
        ready = get(server, "/ready")
        assert ready.status_code == 503 and projection.name in ready.json()["detail"]
    finally:
        server.stop()


def test_read_model_routes_answer_503_while_the_database_is_down(stack_settings, tmp_path):
    from eventfold import migrations
    from eventfold.local_stack import postgres
    from eventfold.local_stack.process import stop_pid

    port = free_port()
    data, log = tmp_path / "pg", tmp_path / "pg.log"
    postgres.init_cluster(data, log)
    pid = postgres.start(data, port, log)
    url = postgres.dsn(port).replace("postgresql://", "postgresql+psycopg://")
    try:
        migrations.upgrade(url)
        projection = catalog_projection(uuid.uuid4().hex[:8])
        # A projection that has run: its routes answer until the database goes away, so the
        # 503s below can only be the database's (one that never ran answers 503 too).
        materialize(stack_settings.replace(database_url=url), projection,
                    catalog_rows(3, seed=1))
        server = read_api([projection], stack_settings.replace(database_url=url), "db-down")
        try:
            assert get(server, f"/read-models/{projection.name}/rows/p000").status_code == 200
            stop_pid(pid, what="postgres", sig=signal.SIGINT)
            for path in ("/rows", "/rows/p000", "/count"):
                response = get(server, f"/read-models/{projection.name}{path}")
                assert response.status_code == 503, response.text
                assert response.headers["Retry-After"] == "1"
                assert response.json()["detail"] == ("the database is unavailable; retry "
                                                     "shortly")
            ready = get(server, "/ready")
            assert (ready.status_code, ready.json()["status"]) == (503, "database unavailable")
        finally:
            server.stop()
    finally:
        stop_pid(pid, what="postgres", sig=signal.SIGINT)


def test_discovery_names_each_read_models_outputs(reads, catalog):
    projection = catalog[0]
    (described,) = get(reads, "/read-models").json()
    assert described["outputs"] == {
        "read_model": projection.table, "ktable_topic": projection.ktable_topic_for(1),
        "derived_topics": [], "dead_letter_topic": projection.dead_letter_topic}
    one = get(reads, f"/read-models/{projection.name}").json()
    assert one["outputs"] == described["outputs"]
