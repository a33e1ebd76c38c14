"""The read API as operators run it: behind a bearer token, on its own login that can only
read, answering KTable routes with 503 while their store cannot restore (and read models
meanwhile), finishing in-flight reads on SIGTERM, and with several HTTP workers sharing one
KTable store (one writes it; another takes over when it dies)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
import requests
from eventfold.local_stack.process import (
    descendants,
    free_port,
    port_is_open,
    stop_pid,
    wait_until,
)
from eventfold.projections import projection
from eventfold.read_api.read_models import reader_session
from psycopg import sql
from sqlalchemy import BigInteger

from eventfold import Eventfold
from eventfold.config import Settings
from eventfold.contract import libpq_url
from eventfold.serving import BackgroundServer
from tests.integration.test_cli import stack_env, start_serving
from tests.integration.test_read_api import catalog_projection, get
from tests.pipeline_helpers import materialize, wait_for


@pytest.fixture(scope="module")
def shop(inventory_app, stack_settings):
    """An app whose one projection has run: a read model row and a KTable entry."""
    projection = catalog_projection(uuid.uuid4().hex[:8])
    materialize(stack_settings, projection, {"p1": {"stock": 7, "name": "apple"}})
    app = Eventfold(f"shop_{projection.name}")
    app.projections.add(projection)
    return app, projection


def serve(app: Eventfold, settings, **changes: str) -> BackgroundServer:
    """``app``'s read API on ``settings`` with ``changes`` (a new Settings: derived values
    such as the Kafka connection are made afresh)."""
    changed = Settings(**{**settings.model_dump(), **changes})
    return BackgroundServer(app.read_api(changed), "127.0.0.1", free_port()).start()


def test_a_read_api_token_guards_data_routes_but_not_health(shop, stack_settings) -> None:
    app, projection = shop
    server = serve(app, stack_settings, api_token="s3cret-token")
    row = f"/read-models/{projection.name}/rows/p1"
    try:
        wait_for(lambda: get(server, "/ready").status_code == 200, "ready", 60)

        def with_token(token: str | None) -> int:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return requests.get(f"{server.url}{row}", headers=headers, timeout=30).status_code
        assert (with_token(None), with_token("wrong"), with_token("s3cret-token")) == (
            401, 401, 200)
        assert requests.get(f"{server.url}/ktables/{projection.name}/entries/p1", timeout=30,
                            headers={"Authorization": "Bearer s3cret-token"}).json()[
            "value"]["stock"] == 7
        assert get(server, f"/ktables/{projection.name}/entries/p1").status_code == 401
        assert get(server, "/health").status_code == 200
        spec = get(server, "/openapi.json").json()
        assert spec["paths"][f"/read-models/{projection.name}/rows/{{key}}"]["get"]["security"]
    finally:
        server.stop()


def test_a_read_database_login_with_the_reader_role_reads_and_cannot_write(
        shop, stack_settings) -> None:
    app, projection = shop
    login = f"reads_{uuid.uuid4().hex[:8]}"
    admin_url = libpq_url(stack_settings.database_url)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE eventfold_reader").format(
            sql.Identifier(login)))
    read_url = stack_settings.database_url.replace("//eventfold@", f"//{login}@")
    assert read_url != stack_settings.database_url
    server = serve(app, stack_settings, read_database_url=read_url)
    try:
        wait_for(lambda: get(server, "/ready").status_code == 200, "ready", 60)
        row = get(server, f"/read-models/{projection.name}/rows/p1")
        assert row.status_code == 200 and row.json()["row"]["stock"] == 7
        with psycopg.connect(libpq_url(read_url), autocommit=True) as conn:
            for statement in reader_session("eventfold_reader"):
                conn.execute(statement)
            assert conn.execute("SELECT current_user").fetchone() == ("eventfold_reader",)
            conn.execute("SET default_transaction_read_only = off")  # a client may; the
            for target in (projection.table, f"{projection.table}__v1"):  # role cannot write
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql.SQL("UPDATE {} SET stock = 0").format(
                        sql.Identifier(target)))
            conn.execute("RESET ROLE")  # the login itself has no grant of its own either
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(
                    f"{projection.table}__v1")))
    finally:
        server.stop()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(login)))


def test_ktable_routes_answer_503_while_their_store_cannot_restore(shop, stack_settings
                                                                    ) -> None:
    """Kafka unreachable: the KTable never restores; read models answer meanwhile."""
    app, projection = shop
    nowhere = f"127.0.0.1:{free_port()}"
    server = serve(app, stack_settings, kafka_bootstrap=nowhere)
    try:
        entry = get(server, f"/ktables/{projection.name}/entries/p1")
        assert entry.status_code == 503 and "is restoring" in entry.json()["detail"], entry.text
        assert entry.headers["Retry-After"]
        ready = get(server, "/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "restoring"
        assert get(server, f"/read-models/{projection.name}/rows/p1").json()["row"][
            "stock"] == 7
    finally:
        server.stop()


def test_sigterm_lets_an_in_flight_read_finish(inventory_app, stack_settings, tmp_path,
                                                unique) -> None:
    """A read waiting for a version (up to 6 s) when SIGTERM arrives still gets its answer
    (504 at its deadline, the version never came), then the process exits 0."""
    port = free_port()
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_READ_API_PORT=str(port))
    log = tmp_path / "reads.log"
    reads = start_serving("reads", env, log)
    try:
        wait_until(lambda: port_is_open(port), what="read API", timeout_s=90, pid=reads.pid)
        url = f"http://127.0.0.1:{port}/read-models/inventory_totals/rows/{unique}-none"
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(requests.get, url, timeout=60,
                                    params={"min_version": 1, "wait_ms": 6000})
            time.sleep(1.0)  # the read is waiting (its answer below comes at its deadline)
            sent = time.monotonic()
            reads.send_signal(signal.SIGTERM)
            response = in_flight.result(timeout=60)
        assert response.status_code == 504, response.text
        assert "has not reached version 1" in response.json()["detail"]
        assert reads.wait(timeout=60) == 0
        assert time.monotonic() - sent >= 4  # it waited for the read, not stopped at once
    finally:
        stop_pid(reads.pid, what="serve reads", timeout_s=60)
    assert "stopped cleanly" in log.read_text()


def _lock_holder(pids: list[int], lock: Path) -> int | None:
    """The process that has ``lock`` open (the store's writer)."""
    for pid in pids:
        try:
            if any(os.readlink(fd) == str(lock) for fd in Path(f"/proc/{pid}/fd").iterdir()):
                return pid
        except OSError:
            continue
    return None


def test_http_workers_share_one_store_and_a_reader_takes_over_from_a_dead_writer(
        inventory_app, stack_settings, tmp_path) -> None:
    """`serve reads` with two workers: both answer every key from one RocksDB store (one
    directory, one writer); SIGKILL the writer and the other worker writes on: a record
    published after the kill is served."""
    name = f"shared_{uuid.uuid4().hex[:8]}"
    kept = projection(name, sources=["Product"], columns={"quantity": BigInteger()})(
        lambda state, _event: state)
    materialize(stack_settings, kept, {f"k{i}": {"quantity": i} for i in range(20)})
    port = free_port()
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="tests.poison_app:app",
                    EVENTFOLD_TEST_PROJECTION=name, EVENTFOLD_READ_API_PORT=str(port),
                    EVENTFOLD_HTTP_WORKERS="2")
    log = tmp_path / "reads.log"
    reads = start_serving("reads", env, log)
    url = f"http://127.0.0.1:{port}/ktables/{name}/entries"

    def answers(key: str) -> dict[str, int]:
        """Which worker answered what, over fresh connections (each may land on either)."""
        seen: dict[str, int] = {}
        for _ in range(40):
            response = requests.get(f"{url}/{key}", timeout=10)
            if response.status_code == 200:
                body = response.json()
                seen[body["freshness"]["instance"]] = body["value"]["quantity"]
        return seen

    try:
        wait_until(lambda: port_is_open(port), what="read API", timeout_s=90, pid=reads.pid)
        wait_for(lambda: len(answers("k7")) == 2, "both workers serving k7", 60)
        assert set(answers("k7").values()) == {7}
        stores = list((tmp_path / "state").iterdir())
        assert [d.name for d in stores] == [f"eventfold.ktable.{name}"]  # one copy
        workers = descendants(reads.pid)
        writer = _lock_holder(workers, stores[0] / "writer.lock")
        assert writer is not None, workers
        os.kill(writer, signal.SIGKILL)
        materialize(stack_settings, kept, {"k7": {"quantity": 70}}, batch_id=1,
                    first_stream_version=100)
        wait_for(lambda: set(answers("k7").values()) == {70},
                 "the record published after the writer died, served", 60)
        assert "now writes its store (the writer before it is gone)" in log.read_text()
    finally:
        stop_pid(reads.pid, what="serve reads", timeout_s=60)
