"""KTable partitions divided among read API instances, run as a team runs them: three
`serve reads` processes with advertised URLs on a 12-partition KTable. Each holds its
active and standby partitions; any of them answers any key (forwarding it), and ranges,
exports and counts are gathered from all; a read-your-writes get waits at the key's owner.
SIGKILL one while reads poll every 100 ms at random
keys through every instance and updates are written: reads keep answering from the standbys
(none fails after one retry, as a client honouring Retry-After makes it), and every answer
equals the read model once caught up. Restarted, the killed instance restores only the
records written to its partitions while it was down. Then a replay's switch to version 2,
with reads going on."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import requests
from sqlalchemy import BigInteger

from eventfold.contract.partitioner import partition_for
from eventfold.local_stack.process import free_port, port_is_open, stop_pid, wait_until
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.projections import projection
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.store import ReadModelStore
from tests.pipeline_helpers import materialize, wait_for
from tests.support.cli import stack_env, start_serving

PARTITIONS = 12
KEYS = [f"k{i:03d}" for i in range(240)]


def end_offsets(kafka, topic: str, partitions: int) -> dict[int, int]:
    planner = OffsetPlanner(kafka)
    try:
        return {p: o for (_, p), o in planner.end_offsets(
            [(topic, p) for p in range(partitions)]).items()}
    finally:
        planner.close()


def _get(url: str, **params: str) -> requests.Response:
    return requests.get(url, params=params, timeout=10)


class _Poller(threading.Thread):
    """Reads a random key through a random live instance every 100 ms, once more after a
    503 or a broken connection; keeps what failed even so."""

    def __init__(self, urls: dict[int, str], name: str) -> None:
        super().__init__(daemon=True)
        self.urls, self.name = urls, name
        self.live = set(urls)
        self.done = threading.Event()
        self.requests = 0
        self.failures: list[str] = []

    def run(self) -> None:
        rng = random.Random(7)
        while not self.done.wait(0.1):
            instance = rng.choice(sorted(self.live))
            key = rng.choice(KEYS)
            self.requests += 1
            url = f"{self.urls[instance]}/ktables/{self.name}/entries/{key}"
            try:
                try:
                    response = _get(url)
                except requests.ConnectionError:
                    # a request aimed at an instance the test has just killed goes to a live
                    # one, as a client holding the instance list does; a live one is asked again
                    if instance not in self.live:
                        url = url.replace(self.urls[instance],
                                          self.urls[rng.choice(sorted(self.live))])
                    response = _get(url)
                if response.status_code == 503:
                    time.sleep(float(response.headers.get("Retry-After", "1")))
                    response = _get(url)
                if response.status_code != 200:
                    self.failures.append(f"{instance} {key}: {response.status_code} "
                                         f"{response.text[:200]}")
            except requests.RequestException as exc:
                self.failures.append(f"{instance} {key}: {exc}")


def test_three_instances_divide_a_ktable_and_serve_through_a_crash(
        inventory_app, stack_settings, tmp_path) -> None:
    name = f"owned_{uuid.uuid4().hex[:8]}"
    kept = projection(name, sources=["Product"], columns={"quantity": BigInteger()},
                      ktable_partitions=PARTITIONS)(lambda state, _event: state)
    materialize(stack_settings, kept, {k: {"quantity": i} for i, k in enumerate(KEYS)})
    ports = {i: free_port() for i in range(3)}
    urls = {i: f"http://127.0.0.1:{port}" for i, port in ports.items()}

    def start(i: int, log: Path):
        env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="tests.poison_app:app",
                        EVENTFOLD_TEST_PROJECTION=name, EVENTFOLD_READ_API_PORT=str(ports[i]),
                        EVENTFOLD_TEST_KTABLE_PARTITIONS=str(PARTITIONS),
                        EVENTFOLD_ADVERTISED_URL=urls[i],
                        EVENTFOLD_STATE_DIR=str(tmp_path / f"state{i}"))
        return start_serving("reads", env, log)

    def metadata(i: int) -> dict:
        return _get(f"{urls[i]}/ktables/{name}/metadata").json()

    def settled(i: int, members: int) -> bool:
        """Instance i sees ``members`` instances, each holding its partitions restored."""
        found = metadata(i)["instances"]
        return len(found) == members and all(
            set(map(int, m["restored"])) >= set(m["active"]) | set(m["standby"])
            for m in found)

    processes = {i: start(i, tmp_path / f"reads{i}.log") for i in range(3)}
    poller = _Poller(urls, name)
    switching = _Poller(urls, name)
    try:
        for i, process in processes.items():
            wait_until(lambda p=ports[i]: port_is_open(p), what=f"read API {i}",
                       timeout_s=90, pid=process.pid)
        wait_for(lambda: all(settled(i, 3) for i in range(3)), "3 members, all restored", 90)

        # each holds a third of the partitions as active, another third as standby
        hosting = {m["url"]: m for m in metadata(0)["instances"]}
        assert sorted(p for m in hosting.values() for p in m["active"]) == list(
            range(PARTITIONS))
        held = {i: set(hosting[urls[i]]["active"]) | set(hosting[urls[i]]["standby"])
                for i in range(3)}
        assert all(len(h) < PARTITIONS for h in held.values()), held
        assert set(os.listdir(tmp_path / "state0" / f"eventfold.ktable.{name}")) >= {
            f"p{p}" for p in held[0]}

        # any instance answers any key: from its own store, or from the key's active host
        forwarded = 0
        for key in KEYS[:60]:
            where = _get(f"{urls[1]}/ktables/{name}/keys/{key}/metadata").json()
            assert where["partition"] == partition_for(key, PARTITIONS)
            body = _get(f"{urls[1]}/ktables/{name}/entries/{key}").json()
            assert body["value"] == {"quantity": KEYS.index(key)}
            assert (body["freshness"]["served_by"], body["freshness"]["stale"]) == (
                where["active"], False)
            forwarded += where["active"] != urls[1]
        assert forwarded > 0
        page = _get(f"{urls[2]}/ktables/{name}/entries", limit="100").json()
        assert [e["key"] for e in page["entries"]] == KEYS[:100]
        rest = _get(f"{urls[2]}/ktables/{name}/entries", after=page["next_after"],
                    limit="500").json()
        assert [e["key"] for e in rest["entries"]] == KEYS[100:]
        assert rest["next_after"] is None
        lines = _get(f"{urls[0]}/ktables/{name}/entries", format="ndjson").text.splitlines()
        assert len(lines) == len(KEYS)
        assert _get(f"{urls[1]}/ktables/{name}/count").json()["count"] == len(KEYS)

        # read-your-writes through a forwarded get: the key's active host waits for the
        # version asked for, written after the request was sent
        waiting_key, owner = next(
            (k, where["active"]) for k in KEYS[:40]
            for where in [_get(f"{urls[1]}/ktables/{name}/keys/{k}/metadata").json()]
            if where["active"] != urls[1])
        wanted = 1000 + KEYS.index(waiting_key)
        with ThreadPoolExecutor(1) as background:
            waited = background.submit(
                requests.get, f"{urls[1]}/ktables/{name}/entries/{waiting_key}",
                params={"min_version": str(wanted), "wait_ms": "20000"}, timeout=30)
            time.sleep(1)
            assert not waited.done()
            poller.start()
            materialize(stack_settings, kept, {k: {"quantity": 1000 + i}
                                               for i, k in enumerate(KEYS[:40])},
                        batch_id=1, first_stream_version=1000)
            answer = waited.result(timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["value"] == {"quantity": wanted}
        assert answer.json()["freshness"]["served_by"] == owner
        first_update = {k: 1000 + i for i, k in enumerate(KEYS[:40])}
        wait_for(lambda: all(
            _get(f"{urls[0]}/ktables/{name}/entries/{k}", local="true").json()["value"][
                "quantity"] == v
            for k, v in first_update.items() if partition_for(k, PARTITIONS) in held[0]),
            "instance 0 to apply the first update", 30)
        poller.live.discard(0)
        os.kill(processes[0].pid, signal.SIGKILL)
        processes[0].wait(10)
        killed_at = time.monotonic()
        # an export begun before the others notice: the dead instance's partitions are read
        # from their standbys instead
        exported = [orjson.loads(line)["key"] for line in _get(
            f"{urls[1]}/ktables/{name}/entries", format="ndjson").text.splitlines()]
        assert exported == KEYS and time.monotonic() - killed_at < 3
        written_while_down = {k: {"quantity": 2000 + i} for i, k in enumerate(KEYS[20:80])}
        materialize(stack_settings, kept, written_while_down, batch_id=2,
                    first_stream_version=2000)
        wait_for(lambda: settled(1, 2) and settled(2, 2), "2 members, all restored", 30)
        rebalanced_s = time.monotonic() - killed_at
        time.sleep(2)
        poller.done.set()
        poller.join(10)
        assert poller.requests > 50
        assert poller.failures == [], poller.failures

        expected = {k: i for i, k in enumerate(KEYS)}
        expected |= first_update
        expected |= {k: v["quantity"] for k, v in written_while_down.items()}

        def answers_equal_the_read_model() -> bool:
            rows = {r["key"]: r["quantity"] for r in _get(
                f"{urls[1]}/read-models/{name}/rows", limit="500").json()["rows"]}
            return rows == expected and all(
                _get(f"{urls[i]}/ktables/{name}/entries/{k}").json()["value"]["quantity"]
                == expected[k] for i in (1, 2) for k in KEYS)

        wait_for(answers_equal_the_read_model, "every answer equal to the read model", 30)
        assert rebalanced_s < 15, rebalanced_s

        # restarted: it holds what it held, and restores only what was written meanwhile
        processes[0] = start(0, tmp_path / "reads0-again.log")
        wait_for(lambda: all(settled(i, 3) for i in (1, 2)) and port_is_open(ports[0])
                 and settled(0, 3), "3 members again, all restored", 90)
        log = (tmp_path / "reads0-again.log").read_text()
        resumed = re.search(r"restoring (\d+) records after the store's checkpoint "
                            r"\(offsets \{([^}]*)\}\)", log)
        assert resumed is not None, log
        checkpoints = {int(p): int(o) for p, o in (
            pair.split(": ") for pair in resumed.group(2).split(", "))}
        # it took back (most of) what it held, from its stores, restoring only their tails:
        # per partition, exactly the records written to it while the instance was down
        taken_back = held[0] & checkpoints.keys()
        assert len(taken_back) >= len(held[0]) // 2, (checkpoints, held[0])
        topic = f"eventfold.ktable.{name}"
        ends = end_offsets(stack_settings.kafka, topic, PARTITIONS)
        for partition in taken_back:
            tail = sum(1 for k in written_while_down if partition_for(k, PARTITIONS) == partition)
            assert ends[partition] - checkpoints[partition] == tail, (partition, log)
        assert 0 < int(resumed.group(1)) <= len(written_while_down) + sum(
            ends[p] - checkpoints[p] for p in checkpoints.keys() - held[0])

        # a replay's switch to version 2, while reads go on through every instance
        switching.start()
        catalog = ProjectionCatalog(stack_settings.database_url)
        assert catalog.begin_build(name) == 2
        materialize(stack_settings, kept, {k: {"quantity": 5000 + i} for i, k in
                                           enumerate(KEYS)}, version=2)
        v2 = ReadModelStore(stack_settings.database_url, kept, 2)
        with catalog.locked(name) as conn:
            v2.publish_view(conn)
            ProjectionCatalog.activate(conn, name, 2, {})
        v2.close()
        catalog.close()

        def all_on_version_2() -> bool:
            return all(_get(f"{urls[i]}/ktables/{name}/entries/{k}").json().get("value") == {
                "quantity": 5000 + KEYS.index(k)} for i in range(3) for k in KEYS[::7])

        wait_for(all_on_version_2, "every instance serving version 2", 60)
        switching.done.set()
        switching.join(10)
        assert switching.requests > 20 and switching.failures == [], switching.failures
        # the new version's partitions may still move as its members' first reports arrive
        wait_for(lambda: all(settled(i, 3) for i in range(3)), "3 members settled on v2", 30)
    finally:
        poller.done.set()
        switching.done.set()
        for process in processes.values():
            if process.poll() is None:
                stop_pid(process.pid, what="serve reads", timeout_s=60)
