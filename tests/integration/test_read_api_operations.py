"""The read API as operators run it: behind a bearer token, on its own login that can only
read, answering KTable routes with 503 while their store cannot restore (and read models
meanwhile), finishing in-flight reads on SIGTERM, and with several HTTP workers sharing one
KTable store (one writes it; another takes over when it dies)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from sqlalchemy import BigInteger

from eventfold import Eventfold
from eventfold.config import Settings
from eventfold.contract import libpq_url
from eventfold.local_stack.process import (
    descendants,
    free_port,
    pid_alive,
    port_is_open,
    stop_pid,
    wait_until,
)
from eventfold.projections import projection
from eventfold.read_api.read_models import reader_session
from eventfold.serving import BackgroundServer
from tests.pipeline_helpers import Materializer, materialize, wait_for
from tests.support.cli import stack_env, start_serving
from tests.support.read_api import catalog_projection, get, get_as_a_client, lock_holder


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
    return BackgroundServer(app.runtime(changed).read_api(), "127.0.0.1", free_port()).start()


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
        for anonymous in (f"/ktables/{projection.name}/entries/p1",  # gets skip the router:
                          f"/ktables/{projection.name}/entries/p1?local=true"):  # same check
            refused = get(server, anonymous)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert requests.get(f"{server.url}/ktables/{projection.name}/entries/p1", timeout=30,
                            headers={"Authorization": "Bearer wrong"}).status_code == 401
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


def _database_connections(database_url: str, pids: list[int]) -> dict[str, int]:
    """How many connections ``pids`` hold to the database, by application_name."""
    sockets = {os.readlink(fd) for pid in pids if Path(f"/proc/{pid}").exists()
               for fd in Path(f"/proc/{pid}/fd").iterdir() if _is_socket(fd)}
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if f"socket:[{fields[9]}]" in sockets:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        rows = conn.execute("SELECT application_name, client_port FROM pg_stat_activity "
                            "WHERE backend_type = 'client backend'").fetchall()
    found: dict[str, int] = {}
    for name, port in rows:
        if port in ports:
            found[name] = found.get(name, 0) + 1
    return found


def _is_socket(fd: Path) -> bool:
    try:
        return os.readlink(fd).startswith("socket:")
    except OSError:
        return False


class _Reader(threading.Thread):
    """Reads keys through the instance every 50 ms, each over a fresh connection (so that
    any worker may answer), retrying as a client does; keeps what failed even so, and what
    answered a value other than ``expected``'s."""

    def __init__(self, url: str, expected: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.url, self.expected = url, expected
        self.done = threading.Event()
        self.reads = 0
        self.answered: list[float] = []
        """When each read that answered right ended (``time.monotonic()``)."""
        self.failed: list[str] = []

    def run(self) -> None:
        keys = sorted(self.expected)
        while not self.done.wait(0.05):
            key = keys[self.reads % len(keys)]
            self.reads += 1
            try:
                response = get_as_a_client(f"{self.url}/{key}")
            except requests.RequestException as exc:
                self.failed.append(f"{key}: {exc}")
                continue
            if response.status_code != 200:
                self.failed.append(f"{key}: {response.status_code} {response.text[:200]}")
            elif response.json()["value"]["quantity"] not in (self.expected[key], 70):
                self.failed.append(f"{key}: {response.json()['value']}")
            else:
                self.answered.append(time.monotonic())

    def answered_within(self, start: float, seconds: float) -> int:
        return sum(start <= at < start + seconds for at in self.answered)


def _restarts(url: str) -> dict[str, float]:
    """The HTTP supervisor's count of replaced workers, by how they died, from /metrics."""
    found = {}
    for family in text_string_to_metric_families(requests.get(f"{url}/metrics",
                                                              timeout=10).text):
        if family.name == "eventfold_http_worker_restarts":
            found = {sample.labels["exit"]: sample.value for sample in family.samples}
    return found


def test_http_workers_share_one_store_and_one_lead_and_survive_losing_both(
        inventory_app, stack_settings, tmp_path) -> None:
    """`serve reads` with three workers: all answer every key from one RocksDB store (one
    directory, one writer), and one of them (the lead) polls freshness and beats for the
    instance (and renews every worker's presence). SIGKILL the writer and the lead while
    reads go on: every read answers, retried as a client does (another worker writes on,
    serving the partitions it read as a reader meanwhile); the supervisor replaces both
    workers, logging and counting it; one worker leads again (freshness stays current, the
    membership row is renewed, the living workers' presence is renewed and the dead's
    deleted)."""
    name = f"shared_{uuid.uuid4().hex[:8]}"
    kept = projection(name, sources=["Product"], columns={"quantity": BigInteger()})(
        lambda state, _event: state)
    materialize(stack_settings, kept, {f"k{i}": {"quantity": i} for i in range(20)})
    port = free_port()
    advertised = f"http://127.0.0.1:{port}"
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="tests.poison_app:app",
                    EVENTFOLD_TEST_PROJECTION=name, EVENTFOLD_READ_API_PORT=str(port),
                    EVENTFOLD_HTTP_WORKERS="3", EVENTFOLD_ADVERTISED_URL=advertised)
    log = tmp_path / "reads.log"
    reads = start_serving("reads", env, log)
    url = f"{advertised}/ktables/{name}/entries"
    reader = _Reader(url, {f"k{i}": i for i in range(20)})

    def answers(key: str) -> dict[str, int]:
        """Which worker answered what, over fresh connections (each may land on any); a
        read that does not answer 200 after a client's retries fails the test."""
        seen: dict[str, int] = {}
        for _ in range(60):
            response = get_as_a_client(f"{url}/{key}")
            assert response.status_code == 200, response.text
            body = response.json()
            seen[body["freshness"]["instance"]] = body["value"]["quantity"]
        return seen

    def every_worker_ready() -> bool:
        return all(requests.get(f"{advertised}/ready", timeout=10).status_code == 200
                   for _ in range(30))

    def background_connections() -> dict[str, int]:
        found = _database_connections(stack_settings.database_url, descendants(reads.pid))
        return {purpose: found.get(f"eventfold read API {purpose}", 0)
                for purpose in ("freshness", "membership", "presence")}

    def membership_age_s() -> float:
        with psycopg.connect(libpq_url(stack_settings.database_url)) as conn:
            row = conn.execute("SELECT extract(epoch FROM now() - seen_at) FROM members WHERE "
                               "kind = 'ktable_member' AND member_id = %s",
                               (advertised,)).fetchone()
        return float(row[0]) if row else float("inf")

    def presence_ages_s() -> dict[int, float]:
        """How old each worker's presence row for the KTable's topic is, by worker pid."""
        with psycopg.connect(libpq_url(stack_settings.database_url)) as conn:
            rows = conn.execute("SELECT detail ->> 'instance_id', extract(epoch FROM now() - "
                                "seen_at) FROM members WHERE kind = 'ktable_reader' AND "
                                "detail ->> 'projection' = %s", (name,)).fetchall()
        return {int(instance.rsplit(":", 1)[1]): float(age) for instance, age in rows}

    def freshness_ages_s() -> list[float]:
        """How old the freshness of read model answers is, over fresh connections."""
        ages = []
        for _ in range(30):
            body = requests.get(f"{advertised}/read-models/{name}/rows/k7", timeout=10).json()
            checked = datetime.fromisoformat(body["freshness"]["checked_at"])
            ages.append((datetime.now(UTC) - checked).total_seconds())
        return ages

    def living_workers() -> set[int]:
        return {pid for pid in descendants(reads.pid) if pid_alive(pid)
                and Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0}

    try:
        wait_until(lambda: port_is_open(port), what="read API", timeout_s=90, pid=reads.pid)
        wait_for(every_worker_ready, "three workers restored", 60)
        wait_for(lambda: len(answers("k7")) == 3, "three workers serving k7", 60)
        assert set(answers("k7").values()) == {7}
        stores = list((tmp_path / "state").iterdir())
        assert [d.name for d in stores] == [f"eventfold.ktable.{name}"]  # one copy
        # One worker polls and beats for the instance, presence included.
        wait_for(lambda: background_connections() == {
            "freshness": 1, "membership": 1, "presence": 1}, "one lead's connections", 30)
        workers = descendants(reads.pid)
        assert set(presence_ages_s()) == set(workers)
        writer = lock_holder(workers, "writer.lock", stores[0])
        lead = lock_holder(workers, "lead.lock")
        assert writer is not None and lead is not None, workers
        reader.start()
        time.sleep(1)
        for doomed in {writer, lead}:
            os.kill(doomed, signal.SIGKILL)
        killed_at = time.monotonic()
        time.sleep(3)  # reads go on meanwhile, from the workers left and the new ones
        materialize(stack_settings, kept, {"k7": {"quantity": 70}}, batch_id=1,
                    first_stream_version=100)
        wait_for(lambda: set(answers("k7").values()) == {70},
                 "the record published after the writer died, served", 60)
        assert "now writes its store (the writer before it is gone)" in log.read_text()
        reader.done.set()
        reader.join(10)
        assert reader.failed == [], reader.failed
        # Reads went on through the deaths, at the pace a client's retries leave.
        answered = reader.answered_within(killed_at, 3)
        assert answered >= 10, f"{answered} reads answered in the 3 s after the kills"
        # the supervisor replaced both
        wait_for(lambda: len(living_workers()) == 3, "three workers again", 30)
        assert log.read_text().count("exited (signal SIGKILL)") == len({writer, lead})
        assert _restarts(advertised) == {"signal SIGKILL": len({writer, lead})}
        wait_for(lambda: len(answers("k7")) == 3, "three workers serving k7 again", 60)
        wait_for(lambda: background_connections()["freshness"] == 1
                 and background_connections()["membership"] == 1, "a new lead", 30)
        leads = re.findall(r"this worker \(pid (\d+)\) leads", log.read_text())
        assert len(leads) == 2 and int(leads[0]) == lead and int(leads[1]) != lead, leads
        wait_for(lambda: max(freshness_ages_s()) < 5, "freshness kept current", 30)
        wait_for(lambda: membership_age_s() < 3, "the membership renewed by the new lead", 10)
        living = living_workers()
        wait_for(lambda: set(presence_ages_s()) == living,
                 "the dead workers' presence deleted, the new ones' there", 30)
        registered_at = time.monotonic()
        time.sleep(6)  # older than a beat or two
        assert max(presence_ages_s().values()) < 4.5  # renewed every 3 s, for every worker
        assert background_connections()["presence"] == 1
        assert time.monotonic() - killed_at > 5 and registered_at
        survivors = descendants(reads.pid)
        stop_pid(reads.pid, what="serve reads", timeout_s=60)
        assert reads.wait(10) == 0 and "stopped cleanly" in log.read_text()
        assert not [pid for pid in survivors if pid_alive(pid)]
    finally:
        reader.done.set()
        stop_pid(reads.pid, what="serve reads", timeout_s=60)


def test_a_stuck_writers_lag_shows_in_every_answer(inventory_app, stack_settings,
                                                    tmp_path) -> None:
    """The worker that writes an instance's store stops (SIGSTOP) while records keep coming:
    the other worker, reading behind the store, answers with the lag measured against the
    topic's end (not the writer's last word), stale past the acceptable lag; the writer back,
    the lag goes to 0 and the answers are current."""
    name = f"stuck_{uuid.uuid4().hex[:8]}"
    kept = projection(name, sources=["Product"], columns={"quantity": BigInteger()},
                      ktable_partitions=1)(lambda state, _event: state)
    writer = Materializer(stack_settings, kept)
    writer.commit({"k": {"quantity": 0}})
    port = free_port()
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="tests.poison_app:app",
                    EVENTFOLD_TEST_PROJECTION=name, EVENTFOLD_TEST_KTABLE_PARTITIONS="1",
                    EVENTFOLD_READ_API_PORT=str(port), EVENTFOLD_HTTP_WORKERS="2",
                    EVENTFOLD_KTABLE_ACCEPTABLE_LAG="5")
    reads = start_serving("reads", env, tmp_path / "reads.log")
    url = f"http://127.0.0.1:{port}/ktables/{name}/entries/k"

    def answer() -> dict:
        """An answer of the worker that is not stopped (a connection to the other hangs)."""
        while True:
            try:
                response = requests.get(url, timeout=1)
            except requests.Timeout:
                continue
            if response.status_code == 200:
                return response.json()

    stopped = None
    try:
        wait_until(lambda: port_is_open(port), what="read API", timeout_s=90, pid=reads.pid)
        wait_for(lambda: answer()["value"] == {"quantity": 0}, "k served", 60)
        store = next((tmp_path / "state").iterdir())
        stopped = lock_holder(descendants(reads.pid), "writer.lock", store)
        assert stopped is not None
        os.kill(stopped, signal.SIGSTOP)
        for n in range(1, 21):
            writer.commit({"k": {"quantity": n}}, first_stream_version=n + 1)
        wait_for(lambda: answer()["freshness"]["lag_records"] >= 20, "the lag measured", 20)
        body = answer()
        assert body["value"] == {"quantity": 0} and body["freshness"]["stale"] is True, body
        assert body["freshness"]["lag_measured_at"] is not None
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        wait_for(lambda: (lambda b: b["value"] == {"quantity": 20} and b["freshness"][
            "lag_records"] == 0 and not b["freshness"]["stale"])(answer()), "caught up", 30)
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        writer.close()
        stop_pid(reads.pid, what="serve reads", timeout_s=60)
