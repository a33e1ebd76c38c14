"""A poison event parks its key, and `eventfold dlq retry|discard` act on it, in CLI processes
beside a streaming `projection run`, as a team works: the key's later events wait (they are
dead-lettered behind it) while other keys fold on; after the fold is fixed, a retry folds the
held events in order, while commands for the key keep coming, and the key folds on live
again; a retry whose fold still fails changes nothing; a discarded event is never folded.
The read model and KTable end equal to a fold of the event store with the fixed fold."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import BigInteger, create_engine
from sqlalchemy.exc import ProgrammingError

from eventfold.local_stack.process import free_port, stop_pid
from eventfold.projections import projection
from eventfold.projections.dead_letters import held_letters
from eventfold.projections.outcome import (
    PARKED_BEHIND,
    DeadLetter,
    ParkedKey,
    SourceRecord,
)
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.parking import ParkedKeysReleased, held_events, release
from eventfold.projections.state.stage import StagedBatch
from eventfold.projections.state.store import ReadModelStore
from eventfold.projections.state.topics import TopicSink
from examples.inventory import ReceiveStock
from tests.kafka_helpers import produce, read_table
from tests.packaging import ROOT
from tests.pipeline_helpers import rows, store_totals, wait_for
from tests.support.cli import eventfold, scrape, stack_env, total


def test_a_poison_event_parks_its_key_until_it_is_retried_or_discarded(
        inventory_app, stack_settings, tmp_path, unique) -> None:
    name = f"parking_{unique}"
    metrics_port = free_port()
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="tests.poison_app:app",
                    EVENTFOLD_TEST_PROJECTION=name, EVENTFOLD_TEST_UNLUCKY_PREFIX=unique,
                    EVENTFOLD_TRIGGER_INTERVAL="200 milliseconds",
                    EVENTFOLD_METRICS_PORT=str(metrics_port))
    fixed = {**env, "EVENTFOLD_TEST_FOLD_FIXED": "1"}
    engine = create_engine(stack_settings.database_url)
    bus = inventory_app.runtime(stack_settings).command_bus()
    poisoned, discarded, hopeless, healthy = (f"{unique}-{k}" for k in ("x", "z", "w", "y"))

    def receive(product: str, *quantities: int) -> None:
        for quantity in quantities:
            bus.execute(ReceiveStock(product=product, quantity=quantity))

    def folded() -> dict[str, object]:
        try:
            return rows(engine, name, unique, "quantity")
        except ProgrammingError:  # before the first batch made the table
            return {}

    def parked_metrics() -> tuple[float, float]:
        samples = scrape(f"http://127.0.0.1:{metrics_port}")
        return (total(samples, "eventfold_projection_parked_keys", projection=name),
                total(samples, "eventfold_projection_parked_events", projection=name))

    def letters() -> list[dict]:
        listed = eventfold("dlq", "list", name, "--json", env=env, timeout=60)
        assert listed.returncode == 0, listed.stderr[-2000:]
        return [e for e in json.loads(listed.stdout) if e["key"].startswith(unique)]

    receive(poisoned, 5, 13, 7, 2)
    receive(discarded, 13, 2)
    receive(hopeless, 13, 1)
    receive(healthy, 4)
    log_path = tmp_path / "run.log"
    run = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run", name],
                           env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
                           cwd=ROOT)
    try:
        # The poison event parks its key: the state stays at what came before it, the key's
        # later events are dead-lettered behind it, other keys fold on.
        wait_for(lambda: folded().get(healthy) == 4 and len(letters()) == 7,
                 "the healthy key folded and 7 letters written", timeout_s=240)
        receive(poisoned, 1)  # parked too: it waits behind the poison event
        wait_for(lambda: len(letters()) == 8, "the parked key's new event dead-lettered")
        assert folded() == {poisoned: 5, healthy: 4}
        shown = eventfold("projection", "status", name, env=env, timeout=60)
        assert "3 keys parked, holding 8 events" in shown.stdout, shown.stdout
        wait_for(lambda: parked_metrics() == (3, 8), "/metrics: 3 keys parked, 8 events held")
        mine = [e for e in letters() if e["key"] == poisoned]
        assert [e["status"] for e in mine] == ["pending"] * 4
        assert "13 units: unlucky" in mine[0]["error"]
        assert all(e["error"].startswith("parked behind eventfold.events.Product[")
                   for e in mine[1:]), mine

        # A retry with the fold still broken changes nothing and says why.
        failed = eventfold("dlq", "retry", name, hopeless, env=env, timeout=120)
        assert failed.returncode == 1 and "still fails" in failed.stderr, failed.stderr[-2000:]
        assert hopeless not in folded()

        # The fold is fixed: the retry folds the held events in order while commands for the
        # key keep coming (the live run holds them back or folds them after the retry).
        stop = threading.Event()
        sent_during: list[int] = []

        def keep_receiving() -> None:
            while not stop.is_set() and len(sent_during) < 40:
                receive(poisoned, 1)
                sent_during.append(1)
                stop.wait(0.05)

        sender = threading.Thread(target=keep_receiving)
        sender.start()
        try:
            retried = eventfold("dlq", "retry", name, poisoned, env=fixed, timeout=180)
        finally:
            stop.set()
            sender.join()
        assert retried.returncode == 0, retried.stderr[-3000:]
        assert "no longer parked" in retried.stdout
        wait_for(lambda: parked_metrics() == (2, 4), "/metrics: 2 keys parked, 4 events held")
        expected = 5 + 13 + 7 + 2 + 1 + len(sent_during)
        wait_for(lambda: folded().get(poisoned) == expected,
                 f"the retried key to fold on live up to {expected}", timeout_s=120)
        receive(poisoned, 3)  # unparked: the live run folds it
        wait_for(lambda: folded().get(poisoned) == expected + 3, "a new event folded live")
        ktable = read_table(stack_settings.kafka, f"eventfold.ktable.{name}")
        assert ktable[poisoned] == {"quantity": expected + 3}
        held_before = {m["dead_letter_offset"] for m in mine}
        statuses = [e["status"] for e in letters() if e["dead_letter_offset"] in held_before]
        assert len(statuses) == len(mine) == 4
        assert all(status.startswith("retried by ") for status in statuses), statuses

        # Discard the poison event of another key: it still waits on its later event until a
        # retry folds that one; the discarded one is never folded.
        head = next(e for e in letters() if e["key"] == discarded and "unlucky" in e["error"])
        dropped = eventfold("dlq", "discard", name, str(head["dead_letter_offset"]),
                            "--reason", "a test delivery", "--by", "tester", env=env,
                            timeout=120)
        assert dropped.returncode == 0, dropped.stderr[-2000:]
        assert "still waits on 1 event" in dropped.stdout
        status = {e["dead_letter_offset"]: e["status"] for e in letters()}
        assert status[head["dead_letter_offset"]] == "discarded by tester (a test delivery)"
        assert eventfold("dlq", "retry", name, discarded, env=env, timeout=120).returncode == 0
        wait_for(lambda: folded().get(discarded) == 2, "the discarded key's later event folded")
        assert eventfold("dlq", "retry", name, discarded, env=env,
                         timeout=60).returncode == 1  # not parked any more

        # Everything equals a fold of the event store with the fixed fold, less the discarded
        # event; the hopeless key (still parked on its first event) has no row.
        expected_rows = dict(store_totals(engine, "Product", "quantity", unique))
        expected_rows[discarded] -= 13
        del expected_rows[hopeless]
        assert folded() == expected_rows
        assert run.poll() is None, log_path.read_text()[-3000:]
    finally:
        stop_pid(run.pid, what="projection run", timeout_s=90)
        engine.dispose()


def test_a_batch_that_held_back_a_key_retried_meanwhile_does_not_commit(
        stack_settings, unique) -> None:
    """The race a retry has with a live batch: the batch read the key as parked when it
    started, a retry unparked it before the batch committed. The batch must not commit (its
    letters would strand the key's events): it produces nothing and raises, to fold again."""
    name = f"held_{unique}"
    held = projection(name, sources=["Product"], columns={"quantity": BigInteger()})(
        lambda state, _event: state)
    catalog = ProjectionCatalog(stack_settings.database_url)
    catalog.register(name)
    catalog.close()
    topic = "eventfold.events.Product"
    with ReadModelStore(stack_settings.database_url, held, 1) as store:
        store.ensure_schema()
        failed = DeadLetter(SourceRecord(topic, 0, 5, "k", None), "fold raised ValueError()",
                            "k", "k-1", 6, parks=True)
        first = store.stage("first")
        first.letters([failed], held=())  # as a task stages the letter that parks its key
        assert store.commit(0, StagedBatch("first", dead_letters=1,
                                           next_offsets={(topic, 0): 6}), {}) == 0
        head = ParkedKey(topic, 0, 5, "k-1", "fold raised ValueError()")
        assert store.parked(["k"]) == {"k": head}

        later = DeadLetter(SourceRecord(topic, 0, 6, "k", None), f"{PARKED_BEHIND}{head}", "k",
                           "k-2", 7, parks=True)
        second = store.stage("second")
        second.letters([later], held={"k"})  # held behind a key parked before the batch
        batch = StagedBatch("second", dead_letters=1, held={"k"},
                            next_offsets={(topic, 0): 7})
        with store.conn.transaction():  # what a retry does, holding the registry row
            release(store.conn, name, 1, [(topic, 0, 5)])
        produced: list[DeadLetter] = []
        with pytest.raises(ParkedKeysReleased):
            store.commit(1, batch, {(topic, 0): 6})
        assert store.produce_pending_letters(produced.extend) == 0 and produced == []
        assert store.committed_offsets() == {(topic, 0): 6}
        assert store.parked(["k"]) == {}


def test_a_retry_reads_the_letters_from_when_they_were_written_not_from_the_start(
        stack_settings, unique) -> None:
    """A parked event keeps a time no later than its letter's: the retry finds the letter
    by the topic's time index. An hour-old letter of the same event at the topic's start (as
    a topic read whole would meet it) is not read."""
    name = f"bytime_{unique}"
    parked = projection(name, sources=["Product"], columns={"quantity": BigInteger()},
                        park_on_failure=True)(lambda state, _event: state)
    catalog = ProjectionCatalog(stack_settings.database_url)
    catalog.register(name)
    catalog.close()
    topic, kafka = "eventfold.events.Product", stack_settings.kafka
    failed = DeadLetter(SourceRecord(topic, 0, 5, "k", '{"not": "read"}'),
                        "fold raised ValueError()", "k", "k-1", 6, parks=True)
    sink = TopicSink(kafka, parked, 1)
    try:
        sink.ensure_topics()
        old = {"projection": name, "version": 1, "error": "an hour ago", "topic": topic,
               "partition": 0, "offset": 5, "key": "k", "fold_key": "k", "value": "{}"}
        produce(kafka, parked.dead_letter_topic, "k", json.dumps(old),
                timestamp_ms=int((time.time() - 3600) * 1000))
        with ReadModelStore(stack_settings.database_url, parked, 1) as store:
            store.ensure_schema()
            store.stage("first").letters([failed], held=())  # as the task stages it...
            sink.output.dead_letters([failed])  # ...then produces it
            sink.output.flush()
            assert store.commit(0, StagedBatch("first", dead_letters=1,
                                               next_offsets={(topic, 0): 6}), {}) == 0
            with store.conn.transaction():
                held = held_events(store.conn, name, 1, "k")
    finally:
        sink.close()
    assert held[0].letters_after is not None and held[0].parked_at is not None
    assert held[0].letters_after <= held[0].parked_at

    letters = held_letters(kafka, parked.dead_letter_topic, 1, held)
    assert [[(c.dead_letter_offset, c.error) for c in copies] for copies in letters] == [
        [(1, "fold raised ValueError()")]]
    # Without the time (an event parked before it was kept), the topic is read whole.
    whole = held_letters(kafka, parked.dead_letter_topic, 1,
                         [dataclasses.replace(held[0], letters_after=None)])
    assert [c.dead_letter_offset for c in whole[0]] == [0, 1]
