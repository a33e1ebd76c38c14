"""A read model's count as a person uses it: without filters, exact whatever the table's
size and however its rows came and went (the batches keep the count in their commit); with
filters, an estimate close to the truth after a load (the statistics are taken again once a
large share of the table was written) that says what it rests on."""

from __future__ import annotations

import uuid

import psycopg
import pytest
import requests
from sqlalchemy import BigInteger

from eventfold import Eventfold
from eventfold.contract import libpq_url
from eventfold.local_stack.process import free_port
from eventfold.projections import projection
from eventfold.projections.state.store import ReadModelStore
from eventfold.serving import BackgroundServer
from tests.pipeline_helpers import materialize

KEYS = 20_000


@pytest.fixture(scope="module")
def counted(inventory_app, stack_settings):
    """A read model of ``KEYS`` customers, then a quarter of them deleted and a fifth of
    those registered again, each step one committed batch; and a read API over it."""
    name = f"customers_{uuid.uuid4().hex[:8]}"
    customers = projection(name, sources=["Product"], columns={"score": BigInteger()},
                           indexes=["score"])(lambda state, _event: state)
    keys = [f"c{i:06d}" for i in range(KEYS)]
    materialize(stack_settings, customers, {k: {"score": i % 100} for i, k in enumerate(keys)})
    deleted = keys[::4]
    materialize(stack_settings, customers, dict.fromkeys(deleted), batch_id=1,
                first_stream_version=100_000)
    revived = deleted[::5]
    materialize(stack_settings, customers, {k: {"score": 1000} for k in revived}, batch_id=2,
                first_stream_version=200_000)
    app = Eventfold(f"counts_{name}")
    app.projections.add(customers)
    server = BackgroundServer(app.runtime(stack_settings).read_api(), "127.0.0.1",
                              free_port()).start()
    try:
        yield server, customers, KEYS - len(deleted) + len(revived)
    finally:
        server.stop()


def _count(server: BackgroundServer, name: str, **filters: str) -> dict:
    response = requests.get(f"{server.url}/read-models/{name}/count", params=filters,
                            timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def _rows(stack_settings, table: str, where: str = "true") -> int:
    with psycopg.connect(libpq_url(stack_settings.database_url)) as conn:
        return conn.execute(f'SELECT count(*) FROM "{table}" WHERE {where}').fetchone()[0]


def test_an_unfiltered_count_is_exact_through_inserts_deletes_and_revivals(
        counted, stack_settings) -> None:
    server, customers, live = counted
    assert _rows(stack_settings, customers.table) == live == 16_000
    answer = _count(server, customers.name)
    assert (answer["count"], answer["exact"]) == (live, True), answer
    assert "estimated_from" not in answer


def test_a_filtered_estimate_after_a_load_is_close_and_says_what_it_rests_on(
        counted, stack_settings) -> None:
    server, customers, _ = counted
    truth = _rows(stack_settings, customers.table, "score < 90")
    # past EVENTFOLD_READ_EXACT_COUNT_MAX_ROWS (10,000): estimated, not counted
    answer = _count(server, customers.name, **{"score.lt": "90"})
    assert answer["exact"] is False, answer
    assert abs(answer["count"] - truth) <= 0.1 * truth, (answer, truth)
    basis = answer["estimated_from"]
    assert basis["statistics_taken_at"] is not None, basis
    assert isinstance(basis["rows_written_since"], int), basis


def test_a_version_from_before_kept_counts_is_counted_once_at_its_runners_start(
        counted, stack_settings) -> None:
    server, customers, live = counted
    with psycopg.connect(libpq_url(stack_settings.database_url), autocommit=True) as conn:
        conn.execute("UPDATE projection_checkpoints SET live_rows = NULL WHERE projection = %s",
                     (customers.name,))
    unknown = _count(server, customers.name)
    assert unknown["exact"] is False  # not kept: an estimate, saying so
    store = ReadModelStore(stack_settings.database_url, customers, 1)
    try:
        store.ensure_schema()  # what a runner does as it starts
        assert store.row_count() == live
    finally:
        store.close()
    again = _count(server, customers.name)
    assert (again["count"], again["exact"]) == (live, True), again
