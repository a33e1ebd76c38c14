"""What Apache Kafka under the pipeline gives, and what Eventfold does about it: KTable topics
really compacted by the log cleaner, existing topics' configs checked, every produced message
confirmed before a batch commits, and retention that deleted unread events, or a source topic
made again, stopping a projection loudly."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time

import psycopg
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from sqlalchemy import BigInteger, Text

from eventfold.contract import event_topic, libpq_url
from eventfold.outbox.kafka import OffsetPlanner, read_messages
from eventfold.outbox.topics import (
    COMPACTED_TOPIC_CONFIG,
    EVENT_TOPIC_CONFIG,
    Replication,
    ReplicationUnavailable,
    TopicAdmin,
    TopicConfigMismatch,
)
from eventfold.projections import FoldProjection
from eventfold.projections.retention import SourceDataLost, SourceTopicRecreated
from eventfold.projections.state.producer import DeliveryFailed
from eventfold.projections.state.topics import (
    OutputTopicConfigs,
    TopicSink,
    ensure_projection_topics,
)
from eventfold.read_api.state import KTableView
from tests.kafka_helpers import last_timestamp_ms, produce, read_table
from tests.pipeline_helpers import make_runner, wait_for, wait_for_more
from tests.support.events import made_again, publish


def counter(unique: str, **options) -> FoldProjection:
    """Per stream: how many ``Counted`` events, the last note; ``Dropped`` deletes the key."""

    def fold(state, event):
        if event.type == "Dropped":
            return None
        return {"count": (state or {"count": 0})["count"] + 1, "note": event.data["note"]}

    return FoldProjection(name=f"counter_{unique}", sources=(f"Counted{unique}",),
                      columns={"count": BigInteger(), "note": Text()}, apply=fold, **options)


def rows(settings, projection: FoldProjection) -> dict[str, dict]:
    with psycopg.connect(libpq_url(settings.database_url)) as conn:
        return {key: {"count": count, "note": note} for key, count, note in conn.execute(
            f'SELECT key, count, note FROM "{projection.table}"').fetchall()}


def refused_at_start(spark, settings, projection: FoldProjection,
                     refusal: type[Exception]) -> str:
    """What a run of ``projection`` started now says as it refuses to fold, raising
    ``refusal``."""
    runner = make_runner(spark, settings, projection)
    try:
        with pytest.raises(refusal) as refused:
            runner.start(once=True)
    finally:
        runner.close()
    return str(refused.value)


def catch_up(spark, settings, projection: FoldProjection, **overrides) -> None:
    runner = make_runner(spark, settings, projection, **overrides)
    try:
        runner.catch_up(timeout_s=300)
    finally:
        runner.close()


# -- compaction ------------------------------------------------------------------------------
COMPACT_FAST = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
                "min.compaction.lag.ms": "0", "delete.retention.ms": "0"}


def test_the_log_cleaner_compacts_a_ktable_topic_and_a_restore_equals_the_read_model(
        inventory_app, spark, stack_settings, unique) -> None:
    projection = counter(unique)
    topic = projection.ktable_topic_for(1)
    keys = [f"k{n}" for n in range(10)]

    def segment_ms_passed() -> bool:
        """The newest KTable record is older than segment.ms: the next one rolls a segment."""
        newest = last_timestamp_ms(stack_settings.kafka, topic)
        return time.time() * 1000 - newest > int(COMPACT_FAST["segment.ms"])

    # Three batches, each a new segment (segment.ms=100): 10 keys written, then 3 of them
    # deleted, then a new key.
    publish(stack_settings, f"Counted{unique}",
            [(key, "Counted", {"note": f"n{i}"}) for i in range(5) for key in keys])
    catch_up(spark, stack_settings, projection, topic_configs=OutputTopicConfigs(COMPACT_FAST))
    wait_for(segment_ms_passed, "segment.ms to pass since the first batch's records")
    publish(stack_settings, f"Counted{unique}", [(key, "Dropped", {}) for key in keys[:3]])
    catch_up(spark, stack_settings, projection, topic_configs=OutputTopicConfigs(COMPACT_FAST))
    wait_for(segment_ms_passed, "segment.ms to pass since the second batch's records")
    publish(stack_settings, f"Counted{unique}", [("k10", "Counted", {"note": "last"})])
    catch_up(spark, stack_settings, projection, topic_configs=OutputTopicConfigs(COMPACT_FAST))
    assert TopicAdmin(stack_settings.kafka).configs(topic)["cleanup.policy"] == \
        "compact"
    # What was written, by the end offset: reading the log now would race the cleaner,
    # which may already have compacted part of it (seen in CI: 11 of 14 left).
    planner = OffsetPlanner(stack_settings.kafka)
    try:
        written = sum(planner.end_offsets(planner.partitions([topic])).values())
    finally:
        planner.close()

    def compacted() -> bool:
        # The cleaner never touches the active segment, and drops a tombstone only on a pass
        # after the one that cleaned it: another writer's tombstone of a key nobody has rolls
        # a segment and dirties the log again (it goes away as well).
        produce(stack_settings.kafka, topic, "~roll", None)
        keys_in_log = [key for _, _, key, _ in read_messages(stack_settings.kafka,
                                                             topic) if key != "~roll"]
        return len(keys_in_log) == len(set(keys_in_log)) and not set(keys[:3]) & set(keys_in_log)

    wait_for(compacted, "the log cleaner to leave one record per live key", timeout_s=120)
    kept = [key for _, _, key, _ in read_messages(stack_settings.kafka, topic)
            if key != "~roll"]
    # 10 values, 3 tombstones, 1 value: 8 live keys (the offsets also hold a marker per
    # partition of each of the writer's Kafka transactions)
    assert len(kept) == 8 < 14 <= written
    expected = rows(stack_settings, projection)
    assert sorted(expected) == sorted([*keys[3:], "k10"])
    assert expected["k9"] == {"count": 5, "note": "n4"}
    assert read_table(stack_settings.kafka, topic) == expected
    view = KTableView(stack_settings.kafka, topic)
    view.hold_all()
    view.start()
    try:
        wait_for(lambda: view.restored, "the KTable restore", timeout_s=60)
        assert {k: e.value for c in view.store.chunks() for k, e in c} == expected
    finally:
        view.stop()


# -- configs of existing topics ---------------------------------------------------------------
def test_topics_are_replicated_as_their_kind_says_and_the_cluster_can_hold(
        stack_settings, unique) -> None:
    topic = f"replicated-{unique}"
    TopicAdmin(stack_settings.kafka).ensure([topic], COMPACTED_TOPIC_CONFIG, kind="ktables")
    metadata = AdminClient(stack_settings.kafka.client_config()).list_topics(topic, timeout=10)
    assert [len(p.replicas) for p in metadata.topics[topic].partitions.values()] == [1]
    assert TopicAdmin(stack_settings.kafka).configs(topic)["min.insync.replicas"] == "1"

    too_many = TopicAdmin(stack_settings.kafka, Replication.parse("ktables=3"))
    with pytest.raises(ReplicationUnavailable) as refused:
        too_many.ensure([f"{topic}-3"], COMPACTED_TOPIC_CONFIG, kind="ktables")
    assert str(refused.value) == (
        f"cannot create ktables topic(s) {topic}-3 with replication factor 3: the cluster has "
        "1 broker(s) (see EVENTFOLD_REPLICATION_FACTOR)")
    too_many.ensure([f"{topic}-events"], COMPACTED_TOPIC_CONFIG, kind="events")  # not ktables

    stricter = TopicAdmin(stack_settings.kafka, Replication.parse("", "ktables=2"))
    with pytest.raises(ReplicationUnavailable, match=r"min\.insync\.replicas 2 is more than"):
        stricter.ensure([topic], COMPACTED_TOPIC_CONFIG, kind="ktables", check=True)


def test_an_existing_ktable_topic_that_is_not_compacted_is_refused_then_fixed(
        inventory_app, stack_settings, unique) -> None:
    projection = counter(unique)
    admin = TopicAdmin(stack_settings.kafka)
    topic = projection.ktable_topic_for(1)
    admin.ensure([topic], {**COMPACTED_TOPIC_CONFIG, "cleanup.policy": "delete"})
    with pytest.raises(TopicConfigMismatch) as refused:
        ensure_projection_topics(admin, projection)
    assert f"topic {topic}: cleanup.policy is 'delete', needs 'compact'" in str(refused.value)
    assert "--fix-topics" in str(refused.value)
    ensure_projection_topics(admin, projection, fix=True)
    assert admin.configs(topic)["cleanup.policy"] == "compact"
    ensure_projection_topics(admin, projection)  # now it passes


def test_dead_letters_and_derived_events_are_kept_for_their_retention(
        inventory_app, stack_settings, unique) -> None:
    """The retention settings reach the topics: a dead-letter topic created with one, checked
    against another (refused, then fixed), and a derived topic made on first use."""
    projection = counter(unique)
    admin = TopicAdmin(stack_settings.kafka)
    hours = OutputTopicConfigs(dead_letter_retention_ms=7_200_000, derived_retention_ms=3_600_000)
    ensure_projection_topics(admin, projection, configs=hours)
    assert admin.configs(projection.dead_letter_topic)["retention.ms"] == "7200000"
    month = str(30 * 86_400_000)  # the default
    with pytest.raises(TopicConfigMismatch, match=rf"retention\.ms is '7200000', needs '{month}'"):
        ensure_projection_topics(admin, projection)
    ensure_projection_topics(admin, projection, fix=True)
    assert admin.configs(projection.dead_letter_topic)["retention.ms"] == month

    sink = TopicSink(stack_settings.kafka, projection, 1, hours)
    try:
        derived = f"{unique}.derived"
        assert sink.ensure_outputs([derived]) == {derived}
    finally:
        sink.close()
    assert admin.configs(derived)["retention.ms"] == "3600000"


def test_a_ktable_topic_has_its_sources_partitions_unless_declared_and_a_change_waits_for_a_replay(
        inventory_app, stack_settings, unique, caplog) -> None:
    caplog.set_level(logging.INFO, logger="eventfold.projections.state.topics")
    admin = TopicAdmin(stack_settings.kafka)
    projection = FoldProjection(name=f"parts_{unique}", sources=("Product",),
                                columns={"count": BigInteger()}, apply=lambda s, _e: s)
    ensure_projection_topics(admin, projection)
    sources = admin.partitions("eventfold.events.Product")
    assert sources > 1 and admin.partitions(projection.ktable_topic_for(1)) == sources

    declared = dataclasses.replace(projection, ktable_partitions=sources + 2)
    ensure_projection_topics(admin, declared)  # the live version's topic keeps its partitions
    assert admin.partitions(declared.ktable_topic_for(1)) == sources
    assert (f"has {sources} partition(s), it declares {sources + 2}; a replay "
            f"(`eventfold projection replay {projection.name}`)") in caplog.text
    ensure_projection_topics(admin, declared, version=2)  # what a replay's version makes
    assert admin.partitions(declared.ktable_topic_for(2)) == sources + 2
    with pytest.raises(ValueError, match="ktable_partitions must be at least 1"):
        dataclasses.replace(projection, ktable_partitions=0)


def test_a_topic_is_counted_whole_as_soon_as_it_is_created(stack_settings, unique) -> None:
    # Setting up a new app creates its event topics and at once the KTable topics sized by
    # them: a new topic's metadata must already show every partition (the demo once made
    # a 1-partition KTable for a 4-partition source).
    admin = TopicAdmin(stack_settings.kafka)
    for n in range(5):
        source = f"Fresh{unique}n{n}"
        admin.ensure([event_topic(source)], EVENT_TOPIC_CONFIG, partitions=4)
        projection = FoldProjection(name=f"fresh_{unique}_{n}", sources=(source,),
                                    columns={"count": BigInteger()}, apply=lambda s, _e: s)
        ensure_projection_topics(admin, projection)
        assert admin.partitions(projection.ktable_topic_for(1)) == 4


# -- delivery reports -------------------------------------------------------------------------
def test_a_ktable_record_the_broker_refuses_fails_the_batch_and_moves_no_checkpoint(
        inventory_app, spark, stack_settings, unique) -> None:
    projection = counter(unique)
    big = os.urandom(30_000).hex()  # KTable records are lz4-compressed: no repeats
    publish(stack_settings, f"Counted{unique}", [("small", "Counted", {"note": "x"}),
                                                 ("big", "Counted", {"note": big})])
    limited = {"max.message.bytes": "10000"}
    with pytest.raises(Exception, match="not delivered") as failed:
        catch_up(spark, stack_settings, projection, topic_configs=OutputTopicConfigs(limited))
    assert "MSG_SIZE_TOO_LARGE" in str(failed.value) or "too large" in str(failed.value)
    assert DeliveryFailed.__name__ in str(failed.value)  # the sink's check, not another error
    runner = make_runner(spark, stack_settings, projection,
                         topic_configs=OutputTopicConfigs(limited))
    try:
        assert runner.store.committed_offsets() == {}  # the checkpoint did not move
    finally:
        runner.close()
    TopicAdmin(stack_settings.kafka).ensure(
        [projection.ktable_topic_for(1)], {"max.message.bytes": "1000000"}, check=True,
        fix=True)
    catch_up(spark, stack_settings, projection)
    expected = {"small": {"count": 1, "note": "x"}, "big": {"count": 1, "note": big}}
    assert rows(stack_settings, projection) == expected
    assert read_table(stack_settings.kafka, projection.ktable_topic_for(1)) == expected


# -- retention deleted what a projection never read ---------------------------------------------
def test_events_deleted_by_retention_before_a_projection_read_them_stop_it_loudly(
        inventory_app, spark, stack_settings, unique) -> None:
    projection = counter(unique)
    publish(stack_settings, f"Counted{unique}",
            [(f"s{n}", "Counted", {"note": "x"}) for n in range(6)])
    topic = event_topic(f"Counted{unique}")
    admin = AdminClient(stack_settings.kafka.client_config())
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(timeout=30)
    message = refused_at_start(spark, stack_settings, projection, SourceDataLost)
    assert "4 events it never read were deleted" in message
    assert f"{topic}[0] offsets 0-3" in message
    assert f"eventfold projection replay {projection.name} --from store" in message
    assert "EVENTFOLD_ALLOW_DATA_LOSS" in message
    catch_up(spark, stack_settings, projection, allow_data_loss=True)
    assert sorted(rows(stack_settings, projection)) == ["s4", "s5"]


def test_a_source_topic_made_again_stops_a_run_before_it_skips_an_event(
        inventory_app, spark, stack_settings, unique, monkeypatch) -> None:
    """An operator deletes a streaming projection's source topic and makes it again, and
    events arrive on the new one at once. Its offsets begin at 0 again while the checkpoint
    counts the old topic's: folding on from the checkpoint would skip as many of them. The
    run stops before it reads the new topic, saying how to rebuild. Made again once more
    while no run is up, and written past the checkpoint's offsets, a run stops at its start:
    the topic has another id than the one the checkpoint's offsets were read from. A version
    that recorded no ids (checkpointed before they were) stops when the topic ends before
    its checkpoint."""
    from eventfold.projections import retention

    projection = counter(unique)
    aggregate = f"Counted{unique}"
    topic = event_topic(aggregate)

    publish(stack_settings, aggregate, [(f"s{n}", "Counted", {"note": "old"}) for n in range(5)])
    runner = make_runner(spark, stack_settings, projection)
    query = runner.start()
    try:
        wait_for(lambda: len(rows(stack_settings, projection)) == 5, "the old events folded")
        made_again(stack_settings, aggregate, "new", 8)  # a run reading on would skip 5
        wait_for(lambda: not query.isActive, "the run to stop", timeout_s=60)
        stopped = query.exception()
        assert isinstance(stopped, SourceTopicRecreated), stopped
        # seen deleted, or already made again: either way it stops, naming the topic
        assert re.search(rf"{topic}(, which it has read from,)? was deleted", str(stopped))
        assert f"eventfold projection replay {projection.name} --from store" in str(stopped)
    finally:
        runner.close()
    assert {row["note"] for row in rows(stack_settings, projection).values()} == {"old"}

    def started_again() -> str:
        message = refused_at_start(spark, stack_settings, projection, SourceTopicRecreated)
        assert {row["note"] for row in rows(stack_settings, projection).values()} == {"old"}
        return message

    made_again(stack_settings, aggregate, "newer", 8)  # past the checkpoint's offset 5
    assert re.search(rf"{topic} was deleted and made again while no run was up \(id \S+, "
                     r"not \S+ as when the checkpoint's offsets were read\)", started_again())

    with psycopg.connect(libpq_url(stack_settings.database_url), autocommit=True) as conn:
        conn.execute("DELETE FROM source_topic_ids WHERE reader = %s",
                     (f"projection {projection.name} v1",))
    made_again(stack_settings, aggregate, "newest", 3)
    monkeypatch.setattr(retention, "BEHIND_GRACE_S", 1.0)
    assert f"{topic}[0] ends at offset 3, before offset 5" in started_again()


def test_a_reaction_reads_a_source_topic_made_again_while_it_was_down_from_its_beginning(
        inventory_app, stack_settings, unique, caplog) -> None:
    """A reaction's saved positions count the old topic's offsets: a runner started after
    the topic was made again and written past them reads the new topic from its beginning,
    as librdkafka does for a runner that is up, and acts on each of its events."""
    import threading

    from eventfold import Eventfold
    from eventfold.projections import Event
    from eventfold.reactions import effect

    aggregate = f"Counted{unique}"
    acted: list[tuple[str, str]] = []

    @effect(f"remember_{unique}", sources=[aggregate], start="earliest")
    def remember(event: Event, idempotency_key: str) -> None:
        acted.append((event.data["note"], event.stream_id))

    app = Eventfold(f"recreated_{unique}")
    app.reactions.add(remember)
    runtime = app.runtime(stack_settings)

    def acts_until(count: int) -> None:
        stopping = threading.Event()
        running = threading.Thread(target=runtime.run_reactions, args=([remember.name], stopping))
        running.start()
        try:
            wait_for(lambda: len(acted) >= count, f"the reaction to act on {count} events")
        finally:
            stopping.set()
            running.join(timeout=60)
        assert not running.is_alive()

    publish(stack_settings, aggregate, [(f"s{n}", "Counted", {"note": "old"}) for n in range(5)])
    acts_until(5)
    made_again(stack_settings, aggregate, "new", 8)  # past its positions (offset 5)
    with caplog.at_level(logging.WARNING, logger="eventfold.reactions.operations"):
        acts_until(13)
    assert sorted(acted[5:]) == sorted(("new", f"s{n}") for n in range(8))
    assert "was deleted and made again while no runner was up" in caplog.text


# -- a broker crash ---------------------------------------------------------------------------
@pytest.mark.drill
def test_a_broker_crash_while_commands_flow_and_a_projection_streams_loses_nothing(
        tmp_path, unique) -> None:
    """SIGKILL the broker under a streaming `projection run` while commands flow; `stack up`
    brings it back over its log directories. The run starts its query again by itself, and
    every command (the write side never needs the broker) reaches the read model and the
    KTable exactly once."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    from eventfold.config import Settings
    from eventfold.local_stack import LocalStack
    from eventfold.local_stack.process import stop_pid
    from examples.inventory import ReceiveStock, app, inventory_totals

    stack = LocalStack(tmp_path / "stack")
    endpoints = stack.up()
    settings = Settings(database_url=endpoints.database_url,
                        kafka_bootstrap=endpoints.kafka_bootstrap,
                        connect_url=endpoints.connect_url)
    env = {**os.environ, "EVENTFOLD_DATABASE_URL": settings.database_url,
           "EVENTFOLD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "EVENTFOLD_CONNECT_URL": settings.connect_url,
           "EVENTFOLD_TRIGGER_INTERVAL": "200 milliseconds"}
    stop = threading.Event()
    sent = [0]

    def send() -> None:
        bus = app.runtime(settings).command_bus()
        while not stop.is_set():
            bus.execute(ReceiveStock(product=f"{unique}-{sent[0] % 10}", quantity=1))
            sent[0] += 1
            time.sleep(0.01)

    def table(sql: str) -> dict[str, int]:
        with psycopg.connect(libpq_url(settings.database_url)) as conn:
            return {k: int(v) for k, v in conn.execute(sql, (f"{unique}-%",)).fetchall()}

    def reference() -> dict[str, int]:
        return table("SELECT stream_id, count(*) FROM events WHERE stream_id LIKE %s "
                     "GROUP BY stream_id")

    def folded() -> dict[str, int]:
        try:
            return table("SELECT key, quantity FROM inventory_totals WHERE key LIKE %s")
        except psycopg.errors.UndefinedTable:
            return {}

    writer = threading.Thread(target=send)
    log = tmp_path / "run.log"
    run = None
    try:
        app.runtime(settings).setup()
        run = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run",
                                "inventory_totals"], env=env, stdout=log.open("w"),
                               stderr=subprocess.STDOUT, start_new_session=True)
        writer.start()
        wait_for(lambda: sum(folded().values()) > 50, "the projection to stream")
        os.kill(endpoints.broker_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for_more(lambda: sent[0], 100, "while the broker is down")
        stack.up()  # starts the dead broker alone, on its port, over its log directories
        wait_for_more(lambda: sent[0], 100, "after the broker is back")
        stop.set()
        writer.join()
        wait_for(lambda: folded() == reference(), "the read model to equal the event store",
                 timeout_s=180)
        recovered_s = time.monotonic() - killed_at
        assert run.poll() is None, log.read_text()[-3000:]  # it rode the outage out
        expected = reference()
        assert sum(expected.values()) == sent[0]
        assert {k: v["quantity"] for k, v in read_table(
            settings.kafka, inventory_totals.ktable_topic_for(1)).items()
            if k.startswith(unique)} == expected
        print(f"broker SIGKILL: {sent[0]} commands, 0 lost, read model and KTable exact "
              f"{recovered_s:.1f} s after the kill")
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        if run is not None:
            stop_pid(run.pid, what="projection run", timeout_s=60)
        stack.down()


# -- lag in the standard tools ----------------------------------------------------------------
def test_a_projections_progress_shows_in_kafka_consumer_groups(
        inventory_app, spark, stack_settings, unique) -> None:
    import subprocess

    from eventfold.local_stack.java import classpath, java_binary

    projection = counter(unique)
    publish(stack_settings, f"Counted{unique}",
            [(f"s{n}", "Counted", {"note": "x"}) for n in range(5)])
    catch_up(spark, stack_settings, projection)
    group = f"eventfold.projection.{projection.name}"
    described = subprocess.run(
        [java_binary(), "-cp", classpath(),
         "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
         "--bootstrap-server", stack_settings.kafka_bootstrap, "--describe", "--group", group],
        capture_output=True, text=True, timeout=120, check=True).stdout
    row = next(line.split() for line in described.splitlines()
               if event_topic(f"Counted{unique}") in line)
    # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG ...
    assert row[:6] == [group, event_topic(f"Counted{unique}"), "0", "5", "5", "0"], described
