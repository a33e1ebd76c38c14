"""The peer that does our whole job as a Python team would write it by hand: a
confluent-kafka loop that folds each batch of the bench's events into per-key totals, sends
one compacted-topic record per changed key (the KTable), and writes the changed keys to a
Postgres table (COPY into a temporary table, ``INSERT .. ON CONFLICT`` guarded by the key's
version) with its offsets in the same transaction. At-least-once as ours is: the topic's
records are flushed before the transaction that moves the offsets commits.

Run in one process or in several at once, the partitions shared out; the table is checked
against the events produced (keys, total, count) before its rate counts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import psycopg
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from bench.common import together
from bench.peers.results import Expected, PeerResultWrong
from eventfold.contract import EventEnvelope, libpq_url
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import consumer_config
from eventfold.outbox.topics import COMPACTED_TOPIC_CONFIG, TopicAdmin

TABLE = "peer_both_sinks"
OFFSETS = "peer_both_sinks_offsets"
KTABLE_TOPIC = "peer.both_sinks.ktable"
"""Its KTable's topic, suffixed by the processes of a run."""
BATCH = 20_000
"""Events a batch reads at most: the size a hand-written loop picks to amortise a commit."""

Totals = dict[str, tuple[int, int, int]]
"""Per key: (total, sales, version)."""


def prepare(database_url: str, kafka: KafkaConnection, ktable: str, partitions: int) -> None:
    """An empty table, offsets and topic for a run."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}, {OFFSETS}")
        conn.execute(f"CREATE TABLE {TABLE} (key TEXT PRIMARY KEY, total BIGINT NOT NULL, "
                     "sales BIGINT NOT NULL, version BIGINT NOT NULL)")
        conn.execute(f"CREATE TABLE {OFFSETS} (partition INT PRIMARY KEY, "
                     "next_offset BIGINT NOT NULL)")
    TopicAdmin(kafka).ensure([ktable], COMPACTED_TOPIC_CONFIG, partitions=partitions,
                             kind="ktables")


def fold_into_both_sinks(kafka: KafkaConnection, database_url: str, topic: str,
                         ktable: str, partitions: list[int],
                         ready: Callable[[], None] = lambda: None) -> tuple[int, float]:
    """The loop over ``partitions`` of ``topic`` until their end; returns (events, seconds)."""
    consumer = Consumer(consumer_config(kafka, **{"enable.partition.eof": False,
                                                  "fetch.wait.max.ms": 100}))
    producer = Producer(kafka.client_config(**{
        "enable.idempotence": True, "linger.ms": 20, "compression.type": "lz4"}))
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
            for p in partitions}
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    states: Totals = {}
    seen = 0
    with psycopg.connect(libpq_url(database_url)) as conn:
        ready()
        started = time.perf_counter()
        while seen < sum(ends.values()):
            messages = consumer.consume(BATCH, 1.0)
            if not messages:
                continue
            changed, next_offsets = _fold(states, messages)
            _send(producer, ktable, changed, states)
            _commit(conn, changed, states, next_offsets)
            seen += len(messages)
        seconds = time.perf_counter() - started
    consumer.close()
    return seen, seconds


def _fold(states: Totals, messages: list[Message]) -> tuple[set[str], dict[int, int]]:
    changed: set[str] = set()
    next_offsets: dict[int, int] = {}
    for message in messages:
        next_offsets[message.partition()] = message.offset() + 1
        envelope = EventEnvelope.decode(message.key(), message.value())
        key = envelope.stream_id
        total, sales, version = states.get(key, (0, 0, 0))
        if envelope.stream_version <= version:
            continue  # read again after a crash: folded already
        states[key] = (total + envelope.data["value"], sales + 1, envelope.stream_version)
        changed.add(key)
    return changed, next_offsets


def _send(producer: Producer, ktable: str, changed: set[str], states: Totals) -> None:
    for key in changed:
        total, sales, version = states[key]
        while True:
            try:
                producer.produce(ktable, key=key.encode(), value=json.dumps(
                    {"total": total, "sales": sales, "version": version}).encode())
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60) != 0:
        raise RuntimeError("the KTable records were not all delivered")


def _commit(conn: psycopg.Connection, changed: set[str], states: Totals,
            next_offsets: dict[int, int]) -> None:
    with conn.transaction(), conn.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE IF NOT EXISTS changed (key TEXT, total BIGINT, "
                       "sales BIGINT, version BIGINT) ON COMMIT DELETE ROWS")
        with cursor.copy("COPY changed (key, total, sales, version) FROM STDIN") as copy:
            for key in changed:
                copy.write_row((key, *states[key]))
        cursor.execute(
            f"INSERT INTO {TABLE} SELECT * FROM changed ON CONFLICT (key) DO UPDATE SET "
            "total = EXCLUDED.total, sales = EXCLUDED.sales, version = EXCLUDED.version "
            f"WHERE {TABLE}.version < EXCLUDED.version")
        cursor.executemany(
            f"INSERT INTO {OFFSETS} VALUES (%s, %s) ON CONFLICT (partition) DO UPDATE SET "
            "next_offset = EXCLUDED.next_offset", list(next_offsets.items()))


def both_sinks(kafka: KafkaConnection, database_url: str, topic: str, partitions: int,
               processes: int, expected: Expected) -> float:
    """The loop in ``processes`` processes at once, the partitions shared out; events/s over
    the slowest, once the table holds what the events give."""
    ktable = f"{KTABLE_TOPIC}.{processes}p"
    prepare(database_url, kafka, ktable, partitions)
    rate = together(fold_into_both_sinks, [
        (kafka, database_url, topic, ktable, list(range(n, partitions, processes)))
        for n in range(processes)])
    _check(database_url, expected)
    return rate


def _check(database_url: str, expected: Expected) -> None:
    with psycopg.connect(libpq_url(database_url)) as conn:
        row = conn.execute(f"SELECT count(*), coalesce(sum(total), 0), coalesce(sum(sales), 0) "
                           f"FROM {TABLE}").fetchone()
    assert row is not None
    found = Expected(int(row[0]), int(row[1]), int(row[2]))
    if found != expected:
        raise PeerResultWrong(f"the both-sinks loop: {found}, expected {expected}")
