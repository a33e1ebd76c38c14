"""The read side through a team's operations, run as operators meet them: three `serve reads`
instances of two HTTP workers each, with advertised URLs, over a 6-partition KTable whose keys
include ones that must be escaped in a URL ("North America 1", "café 3", "100%", ...). A
writer commits batches of updates through the projection's real sinks, and readers ask for
random keys through every instance, retrying once after a 503 or a broken connection, as a
client honouring Retry-After does. Each drill injects one fault from outside and requires,
through it: no read that fails after its one retry, no wrong answer (a value the key never
had, a key that is not there answered 404, a deleted key answered), and at the end every
instance answering every key exactly.

The faults: SIGKILL of a whole instance (and its restart from its stores), SIGKILL of the
worker that writes an instance's stores, a 10 s pause of Postgres (every process SIGSTOPped),
an instance back after the topic's delete retention has passed (its stores would serve keys
deleted meanwhile), a replay's switch to a new KTable version, and the KTable topic deleted
and made again under the instances.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest
import requests
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    ResourceType,
)
from sqlalchemy import BigInteger

from eventfold.contract.partitioner import partition_for
from eventfold.local_stack.process import (
    descendants,
    free_port,
    pid_alive,
    port_is_open,
    stop_pid,
    wait_until,
)
from eventfold.outbox.kafka import read_messages
from eventfold.projections import projection
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.store import ReadModelStore
from tests.kafka_helpers import produce
from tests.pipeline_helpers import Materializer, wait_for
from tests.support.cli import stack_env
from tests.support.read_api import get_as_a_client, lock_holder

PARTITIONS = 6
ORDINARY = [f"k{i:03d}" for i in range(48)]
ESCAPED = ["North America 1", "café 3", "100%", "a%41b", "x+y", "q?r=s", "hash#1", "amp&1",
           "ünï cödé", "trailing "]
KEYS = ORDINARY + ESCAPED
COLD = frozenset(ORDINARY[40:])
"""Keys the load leaves alone (a drill needs some that no batch writes)."""
DELETE_RETENTION_MS = 4_000
"""The KTable topic's delete.retention.ms: short, so that a drill can outwait it."""


class Instance:
    """One `serve reads` process (a supervisor and its workers, in a session of their own)."""

    def __init__(self, number: int, env: dict[str, str], tmp_path: Path) -> None:
        self.number = number
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**env, "EVENTFOLD_READ_API_PORT": str(self.port),
                    "EVENTFOLD_ADVERTISED_URL": self.url, "EVENTFOLD_HTTP_WORKERS": "2",
                    "EVENTFOLD_STATE_DIR": str(tmp_path / f"state{number}")}
        self.tmp_path = tmp_path
        self.process: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []

    def start(self) -> None:
        log = self.tmp_path / f"reads{self.number}.{len(self.logs)}.log"
        self.logs.append(log)
        self.process = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "serve",
                                         "reads"], env=self.env, stdout=log.open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: port_is_open(self.port), what=f"read API {self.number}",
                   timeout_s=90, pid=self.process.pid)

    def kill(self) -> None:
        """SIGKILL every process of the instance at once (as an OOM killer or a lost node)."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            stop_pid(self.process.pid, what=f"serve reads {self.number}", timeout_s=60)

    def workers(self) -> list[int]:
        assert self.process is not None
        return [pid for pid in descendants(self.process.pid) if pid_alive(pid)]

    def log_text(self) -> str:
        return "".join(log.read_text(errors="replace") for log in self.logs)

    def get(self, path: str, **params: str) -> requests.Response:
        return requests.get(f"{self.url}{path}", params=params, timeout=10)


class Load:
    """Batches of updates committed through the projection's real sinks, ~10 a second, each
    giving 8 random keys a new value (a global counter: every value is new). ``allowed``
    holds every value a key has had (recorded before its batch commits), ``current`` the
    last committed."""

    def __init__(self, writer: Materializer, current: dict[str, int]) -> None:
        self.writer = writer
        self.current = dict(current)
        self.allowed: dict[str, set[int | None]] = {}
        self.order: dict[str, dict[int | None, int]] = {}
        """When each value of a key was recorded (a sequence number): a reader of one
        instance never sees a key's values go back in it."""
        for key, value in current.items():
            self.note(key, value)
        self.counter = max(current.values()) + 1
        self.version = 1_000
        self.done = threading.Event()
        self.batches = 0
        self.lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def note(self, key: str, value: int | None) -> None:
        """``key`` may have ``value`` from now on (recorded before its batch commits)."""
        self.allowed.setdefault(key, set()).add(value)
        order = self.order.setdefault(key, {})
        order[value] = sum(len(o) for o in self.order.values())

    def commit(self, states: dict[str, int | None]) -> None:
        """One batch (None deletes a key)."""
        with self.lock:
            for key, value in states.items():
                self.note(key, value)
            self.writer.commit({k: None if v is None else {"quantity": v}
                                for k, v in states.items()}, first_stream_version=self.version)
            self.version += len(states) + 1
            for key, value in states.items():
                if value is None:
                    self.current.pop(key, None)
                else:
                    self.current[key] = value
            self.batches += 1

    def _run(self) -> None:
        rng = random.Random(11)
        while not self.done.wait(0.1):
            keys = rng.sample(sorted(self.current.keys() - COLD), 8)
            self.commit({key: self.counter + i for i, key in enumerate(keys)})
            self.counter += len(keys)

    @contextmanager
    def flowing(self) -> Iterator[None]:
        self.done.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        try:
            yield
        finally:
            self.done.set()
            self._thread.join(30)


class Readers:
    """A reader per live instance: a random key every 20 ms, over a fresh connection, once
    more after a 503 (after Retry-After) or a broken connection (after 200 ms). What failed
    even so, and every wrong answer, is kept."""

    def __init__(self, name: str, load: Load, instances: list[Instance]) -> None:
        self.name, self.load, self.instances = name, load, instances
        self.paused: set[int] = set()
        self.done = threading.Event()
        self.reads = 0
        self.failed: list[str] = []
        self.wrong: list[str] = []
        self.tolerated: tuple[str, ...] = ()
        """503s a drill expects for a while (their text), kept apart in ``waited``."""
        self.waited: list[str] = []
        self.went_back: list[str] = []
        self._seen: dict[tuple[int, str, int | None], int] = {}
        """The latest value each instance answered for each key of each version (when it was
        recorded)."""
        self._threads = [threading.Thread(target=self._read, args=(i,), daemon=True)
                         for i in range(len(instances))]

    def _read(self, number: int) -> None:
        rng = random.Random(number)
        while not self.done.wait(0.02):
            if number in self.paused:
                continue
            key = rng.choice(KEYS)
            url = (f"{self.instances[number].url}/ktables/{self.name}/entries/"
                   f"{quote(key, safe='')}")
            try:
                response = self._get(url)
            except requests.RequestException as exc:
                if number not in self.paused:
                    self.failed.append(f"instance {number} {key!r}: {exc}")
                continue
            self.reads += 1
            self._check(number, key, response)

    def _get(self, url: str) -> requests.Response:
        return get_as_a_client(url, pause_s=0.2, retries=1)

    def _check(self, number: int, key: str, response: requests.Response) -> None:
        allowed = self.load.allowed.get(key, set())
        if response.status_code == 404:
            if None not in allowed:  # a key that was never deleted is always there
                self.wrong.append(f"instance {number} {key!r}: 404 {response.text[:300]}")
        elif response.status_code == 503 and any(t in response.text for t in self.tolerated):
            self.waited.append(f"instance {number} {key!r}: {response.text[:300]}")
        elif response.status_code != 200:
            self.failed.append(f"instance {number} {key!r}: {response.status_code} "
                               f"{response.text[:300]}")
        elif (quantity := response.json().get("value", {}).get("quantity")) not in allowed:
            self.wrong.append(f"instance {number} {key!r}: {response.json()}")
        else:  # within one version (a replay's is built anew), a key's values never go back
            version = response.json().get("freshness", {}).get("projection_version")
            seen, recorded = (number, key, version), self.load.order[key][quantity]
            if recorded < self._seen.get(seen, -1):
                self.went_back.append(f"instance {number} {key!r} v{version}: {quantity}, "
                                      "after a newer value")
            self._seen[seen] = max(recorded, self._seen.get(seen, -1))

    def __enter__(self) -> Readers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        for thread in self._threads:
            thread.join(30)

    def assert_clean(self, at_least: int = 100) -> None:
        assert self.reads >= at_least, self.reads
        assert self.failed == [], self.failed[:10]
        assert self.wrong == [], self.wrong[:10]
        assert self.went_back == [], self.went_back[:10]


class Drill:
    def __init__(self, stack_settings, tmp_path: Path) -> None:
        self.settings = stack_settings
        self.name = f"drill_{uuid.uuid4().hex[:8]}"
        self.projection = projection(self.name, sources=["Product"],
                                     columns={"quantity": BigInteger()},
                                     ktable_partitions=PARTITIONS)(lambda state, _: state)
        self.topic = self.projection.ktable_topic_for(1)
        self.writer = Materializer(stack_settings, self.projection)
        self.load = Load(self.writer, {key: i for i, key in enumerate(KEYS)})
        self.load.commit({key: i for i, key in enumerate(KEYS)})
        env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="tests.poison_app:app",
                        EVENTFOLD_TEST_PROJECTION=self.name,
                        EVENTFOLD_TEST_KTABLE_PARTITIONS=str(PARTITIONS))
        self.instances = [Instance(n, env, tmp_path) for n in range(3)]
        self.mismatch = ""

    def start(self) -> None:
        for instance in self.instances:
            instance.start()
        self.wait_settled()

    def readers(self) -> Readers:
        return Readers(self.name, self.load, self.instances)

    def metadata(self, number: int) -> dict:
        return self.instances[number].get(f"/ktables/{self.name}/metadata").json()

    def settled(self, live: list[int]) -> bool:
        """Every live instance sees the live ones, each holding its partitions restored."""
        try:
            for number in live:
                found = self.metadata(number)["instances"]
                urls = {self.instances[n].url for n in live}
                if {m["url"] for m in found} != urls or not all(
                        set(map(int, m["restored"])) >= set(m["active"]) | set(m["standby"])
                        for m in found):
                    return False
        except (requests.RequestException, ValueError, KeyError):
            return False
        return True

    def wait_settled(self, live: list[int] | None = None, timeout_s: float = 90) -> None:
        live = list(range(len(self.instances))) if live is None else live
        wait_for(lambda: self.settled(live), f"instances {live} settled", timeout_s)

    def answers_exactly(self, live: list[int] | None = None) -> bool:
        """Every live instance answers every key with its last value, and 404 for keys
        deleted; the count and a full range are exact. (What differed last: ``mismatch``.)"""
        live = list(range(len(self.instances))) if live is None else live
        current = self.load.current
        for number in live:
            instance = self.instances[number]
            for key in self.load.allowed:
                response = instance.get(f"/ktables/{self.name}/entries/{quote(key, safe='')}")
                value = (response.json().get("value") or {}).get("quantity") \
                    if response.status_code == 200 else None
                wanted = (200, current[key]) if key in current else (404, None)
                if (response.status_code, value) != wanted:
                    self.mismatch = f"instance {number} {key!r}: {response.text[:300]}"
                    return False
        page = self.instances[live[0]].get(f"/ktables/{self.name}/entries", limit="500")
        count = self.instances[live[-1]].get(f"/ktables/{self.name}/count")
        self.mismatch = f"page {page.text[:500]}, count {count.text[:300]}"
        return (page.status_code == count.status_code == 200
                and {e["key"]: e["value"]["quantity"] for e in page.json()["entries"]}
                == current and count.json()["count"] == len(current))

    def wait_exact(self, what: str = "every instance answering every key exactly") -> None:
        try:
            wait_for(self.answers_exactly, what, 30)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last: {self.mismatch}") from None

    def close(self) -> None:
        for instance in self.instances:
            instance.stop()
        self.writer.close()


def set_topic_config(settings, topic: str, config: dict[str, str]) -> None:
    admin = AdminClient(settings.kafka.client_config())
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
        for k, v in config.items()])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


@pytest.fixture(scope="module")
def drill(inventory_app, stack_settings, tmp_path_factory) -> Iterator[Drill]:
    made = Drill(stack_settings, tmp_path_factory.mktemp("drill"))
    try:
        made.start()
        yield made
    finally:
        made.close()


def test_escaped_keys_answer_through_every_instance(drill: Drill) -> None:
    """A key that must be escaped in a URL, asked of an instance that does not hold it, is
    forwarded to one that does, and means the same key there."""
    forwarded = 0
    for key in ESCAPED:
        partition = partition_for(key, PARTITIONS)
        for instance in drill.instances:
            where = instance.get(f"/ktables/{drill.name}/keys/{quote(key, safe='')}/metadata"
                                 ).json()
            assert where["partition"] == partition
            body = instance.get(f"/ktables/{drill.name}/entries/{quote(key, safe='')}").json()
            assert (body["key"], body["value"]["quantity"]) == (key, drill.load.current[key])
            forwarded += where["active"] != instance.url
    assert forwarded > 0


def test_an_instance_killed_and_restarted(drill: Drill) -> None:
    """SIGKILL every process of one instance under load: the others serve its partitions
    from their standbys; restarted, it restores only what its stores missed."""
    victim = drill.instances[2]
    held = next(set(m["active"]) | set(m["standby"]) for m in drill.metadata(0)["instances"]
                if m["url"] == victim.url)
    with drill.load.flowing(), drill.readers() as readers:
        time.sleep(2)
        readers.paused.add(2)
        victim.kill()
        time.sleep(8)  # its partitions move to the instances that hold them restored
        victim.start()
        readers.paused.discard(2)
        drill.wait_settled()
        time.sleep(2)
    readers.assert_clean()
    resumed = re.search(r"restoring \d+ records after the store's checkpoint \(offsets "
                        r"\{([^}]*)\}\)", victim.logs[-1].read_text())
    assert resumed is not None, victim.logs[-1].read_text()[-3000:]
    # what it held, it took back from its stores, restoring only what they missed
    assert held <= {int(pair.split(":")[0]) for pair in resumed.group(1).split(", ")}
    drill.wait_exact()


def test_the_writer_worker_of_an_instance_killed(drill: Drill) -> None:
    """SIGKILL the worker that writes one instance's stores: another worker of the instance
    writes on, serving meanwhile; the supervisor starts a worker in its place."""
    instance = drill.instances[0]
    store = next((Path(instance.env["EVENTFOLD_STATE_DIR"])).iterdir())
    with drill.load.flowing(), drill.readers() as readers:
        time.sleep(2)
        writer = lock_holder(instance.workers(), "writer.lock", store)
        assert writer is not None
        os.kill(writer, signal.SIGKILL)
        time.sleep(6)
        wait_for(lambda: len(instance.workers()) == 2, "the worker replaced", 30)
        time.sleep(2)
    readers.assert_clean()
    assert "this process now writes its store" in instance.log_text()
    drill.wait_exact()


def test_a_ten_second_database_pause(drill: Drill) -> None:
    """SIGSTOP every Postgres process for 10 s under read load, and with it one instance
    (a stalled host), which comes back 3 s after the database: KTable reads never needed
    the database; reads forwarded to the stalled instance go to its partitions' standbys;
    the instances keep each other as members through it all (no partition moves, nothing is
    restored)."""
    postgres = json.loads((drill.settings.stack_dir / "stack.json").read_text())["postgres_pid"]
    database = [postgres, *descendants(postgres)]
    stalled = drill.instances[2]
    assert stalled.process is not None
    drill.wait_settled()
    with drill.readers() as readers:
        time.sleep(2)
        before = [len(i.log_text()) for i in drill.instances]
        readers.paused.add(2)
        os.killpg(stalled.process.pid, signal.SIGSTOP)
        for pid in database:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(10)
        finally:
            for pid in database:
                os.kill(pid, signal.SIGCONT)
            time.sleep(3)
            os.killpg(stalled.process.pid, signal.SIGCONT)
        readers.paused.discard(2)
        time.sleep(8)  # heartbeats go through again, and past a membership timeout
    readers.assert_clean()
    after = [i.log_text()[start:] for i, start in zip(drill.instances, before, strict=True)]
    moves = [line for text in after for line in text.splitlines()
             if "restoring" in line or "holds partitions" in line or "ktable members:" in line]
    assert moves == [], moves
    drill.wait_exact()


def test_an_instance_back_after_the_delete_retention(drill: Drill) -> None:
    """An instance down while keys are deleted and the log cleaner removes their tombstones
    (past the topic's delete.retention.ms): back, its stores' checkpoints are too old to
    resume from, and it restores them from the beginning rather than serve the deleted
    keys."""
    victim = drill.instances[1]
    doomed = [key for key in ORDINARY[:24] if key in drill.load.current]
    set_topic_config(drill.settings, drill.topic, {
        "delete.retention.ms": str(DELETE_RETENTION_MS), "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"})
    time.sleep(3)  # the instances look at the topic's configs every 2 s
    victim.kill()
    drill.wait_settled([0, 2])
    drill.load.commit(dict.fromkeys(doomed))
    wait_for(lambda: _tombstones_gone(drill, doomed), "the log cleaner to remove the "
             "tombstones", 120)
    time.sleep(DELETE_RETENTION_MS / 1000)  # the victim's checkpoints are older than that
    with drill.readers() as readers:
        readers.paused.add(1)
        victim.start()
        readers.paused.discard(1)
        drill.wait_settled()
        time.sleep(2)
    readers.assert_clean()
    assert "past the topic's delete.retention.ms" in victim.logs[-1].read_text()
    drill.wait_exact()
    for key in doomed:
        for instance in drill.instances:
            assert instance.get(f"/ktables/{drill.name}/entries/{key}").status_code == 404


def test_partitions_added_to_the_topic_under_the_instances(drill: Drill) -> None:
    """Two partitions added to the KTable topic under load: the instances notice within a
    few seconds, hold and serve them; once the projection notices too (its runner looks
    every 5 s), a key written goes to its new partition (and is deleted where the old count
    put it), while one not written since is found where it was; deletes stay deleted. A key
    whose partition is a new one answers 503 until an instance has restored it (a few
    seconds: it could hold the key, once the projection writes there)."""
    admin = AdminClient(drill.settings.kafka.client_config())
    with drill.load.flowing(), drill.readers() as readers:
        readers.tolerated = tuple(f"partition {p} of KTable" for p in (6, 7))
        time.sleep(2)
        for future in admin.create_partitions([NewPartitions(drill.topic, PARTITIONS + 2)]
                                              ).values():
            future.result(timeout=30)
        wait_for(lambda: all(drill.metadata(n)["partitions"] == PARTITIONS + 2
                             for n in range(3)), "every instance seeing 8 partitions", 30)
        drill.wait_settled()
        with drill.load.lock:  # as the running projection notices
            drill.writer.look_at_partitions()
            before = dict(drill.load.current)
        assert drill.writer.sink.output.partition_history == (PARTITIONS, PARTITIONS + 2)
        moved = [k for k in before
                 if partition_for(k, PARTITIONS) != partition_for(k, PARTITIONS + 2)]
        drill.load.commit(dict.fromkeys(moved[:3]))  # deleted under the new count
        time.sleep(3)
    # A key on the move can be served from its old partition by an instance that has not
    # restored its new one yet, after another served it from there: a value older than one
    # already seen (docs/http.md, "Partitions added").
    readers.went_back.clear()
    readers.assert_clean()
    assert len(readers.waited) < readers.reads // 4, readers.waited[:5]
    untouched = [k for k in moved[3:] if k in COLD]
    assert untouched, "some moved keys were not written since: they are found where they were"
    drill.wait_exact()


def test_a_replay_switches_every_instance_to_the_next_version(drill: Drill) -> None:
    """A replay builds version 2 (a topic of its own) and switches: every instance restores
    it beside version 1 and swaps, while reads go on through all of them."""
    settings = drill.settings
    catalog = ProjectionCatalog(settings.database_url)
    v2_writer = None
    try:
        assert catalog.begin_build(drill.name) == 2
        v2 = {key: 10_000 + value for key, value in drill.load.current.items()}
        for key, value in v2.items():
            drill.load.note(key, value)
        v2_writer = Materializer(settings, drill.projection, version=2)
        v2_writer.commit({k: {"quantity": v} for k, v in v2.items()})
        with drill.readers() as readers:
            time.sleep(1)
            store = ReadModelStore(settings.database_url, drill.projection, 2)
            with catalog.locked(drill.name) as conn:
                store.publish_view(conn)
                ProjectionCatalog.activate(conn, drill.name, 2, {})
            store.close()
            drill.load.current = v2

            def on_version_2() -> bool:
                return all(i.get(f"/ktables/{drill.name}/entries/k001").json().get(
                    "freshness", {}).get("projection_version") == 2 for i in drill.instances)

            wait_for(on_version_2, "every instance on version 2", 60)
            time.sleep(2)
        readers.assert_clean(at_least=50)
        drill.writer.close()
        drill.writer = drill.load.writer = v2_writer
        v2_writer = None
        drill.topic = drill.projection.ktable_topic_for(2)
        drill.wait_exact()
    finally:
        catalog.close()
        if v2_writer is not None:
            v2_writer.close()


def test_the_topic_deleted_and_made_again_under_the_instances(drill: Drill) -> None:
    """The KTable topic is deleted and made again (a wrong tool, a restore from backup) while
    the instances follow it: each notices, and serves what the new topic holds, not what it
    had restored of the old one."""
    admin = AdminClient(drill.settings.kafka.client_config())
    topic = drill.topic
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result(timeout=30)
    wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, "the topic gone", 30)
    kept = {key: 20_000 + i for i, key in enumerate(KEYS[::2])}
    # made again, as the projection's next start does (with a producer that never knew the
    # topic before)
    drill.writer.close()
    drill.writer = drill.load.writer = Materializer(drill.settings, drill.projection,
                                                    drill.writer.version)
    for key in KEYS:  # a key the new topic lacks is gone; one it holds may still be too
        drill.load.note(key, None)
        if key in kept:
            drill.load.note(key, kept[key])
        else:
            drill.load.allowed[key] = {None}
    drill.writer.sink.output.states((k, _state(v)) for k, v in kept.items())
    drill.writer.sink.output.flush()
    drill.load.current = kept
    drill.wait_exact("every instance serving the new topic exactly")
    assert all("the topic was deleted and made again" in i.log_text() for i in drill.instances)


def _state(value: int):
    from eventfold.projections.outcome import KeyState

    return KeyState({"quantity": value}, 50_000 + value, 50_000 + value)


def _tombstones_gone(drill: Drill, keys: list[str]) -> bool:
    """The log cleaner has removed the keys' records, tombstones included. The cleaner never
    cleans a partition's active segment: a record of a key nobody reads, produced to every
    partition, rolls them (segment.ms is short) and dirties the log again."""
    for partition in range(PARTITIONS):
        produce(drill.settings.kafka, drill.topic, "~roll", None, partition=partition)
    in_log = {key for _, _, key, _ in read_messages(drill.settings.kafka, drill.topic)}
    return not set(keys) & in_log
