"""The event store as it grows: the same measurements at 100,000 and at 10,000,000 stored events.

The store is filled in bulk (``INSERT ... SELECT`` from ``generate_series``, half a million
events a transaction, streams of ten events interleaved across the whole log as live appends
interleave them). At each size it measures:

- single-event commands/s with 8 clients: pgbench calling the append function, one command a
  transaction, with event ids made as the write model makes them (UUID version 7); what the
  database does per command (``bench/append.py`` has the Python and HTTP figures, which sit on
  top of it);
- ``read_stream`` p99 of a random ten-event stream;
- a ``read_all`` page (1,000 events) p99 at the log's start and at its end;
- ``eventfold verify-log Product`` as a user runs it, with its peak RSS, the topic holding
  every event (produced from the store by the benchmark, in the connector's envelope);
- the events table's size and its indexes' sizes, with the plans of the reads.

    .venv/bin/python -m bench.growth [--events 10000000] [--first 100000]

Prints the figures, then one JSON line: ``append_ratio_10m_vs_100k``,
``read_all_deep_vs_start_p99_ratio``, ``verify_log_peak_rss_mb``, ``events_table_mb``,
``events_indexes_mb`` and the raw figures beside them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Producer

from bench.append import APPEND_FUNCTION_CALL, pgbench_tps
from bench.common import in_a_process, own_stack, percentile, tree_rss
from eventfold.config import Settings
from eventfold.contract import event_topic, libpq_url
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.topics import EVENT_TOPIC_CONFIG, TopicAdmin
from eventfold.write_model.persistence.store import EventStore

log = logging.getLogger("bench.growth")

STREAM_TYPE = "Product"
EVENTS_PER_STREAM = 10
FILL_CHUNK = 500_000
PAGE = 1_000
PROBES = 500

# An event id as the write model makes it (``write_model.domain.ids``): a UUID version 7, its
# first 48 bits the time in milliseconds. A random (version 4) id would put every insert at a
# random page of the unique index on event_id, which the product never does.
UUID7 = """
CREATE OR REPLACE FUNCTION bench_uuid7() RETURNS uuid LANGUAGE sql VOLATILE AS $$
  SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) PLACING
    substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
    FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$
"""
APPEND_AS_THE_APP_DOES = APPEND_FUNCTION_CALL.replace("'i', gen_random_uuid()",
                                                      "'i', bench_uuid7()")

FILL = f"""
INSERT INTO events (event_id, stream_id, stream_type, stream_version, event_type, data)
SELECT bench_uuid7(), %(prefix)s || (n %% %(streams)s), '{STREAM_TYPE}',
       n / %(streams)s + 1, 'StockReceived',
       jsonb_build_object('product', %(prefix)s || (n %% %(streams)s), 'quantity', 1 + n %% 7)
FROM generate_series(%(low)s, %(high)s - 1) AS n
"""


@dataclass(frozen=True)
class Figures:
    stored: int
    appends_per_s: float
    read_stream_p99_ms: float
    read_all_start_p99_ms: float
    read_all_deep_p99_ms: float
    verify_log_s: float
    verify_log_peak_rss_mb: float
    table_mb: float
    indexes_mb: dict[str, float]

    @property
    def indexes_total_mb(self) -> float:
        return sum(self.indexes_mb.values())


def fill(dsn: str, prefix: str, events: int) -> None:
    """``events`` events in streams of ten under ``prefix``, a stream's events spread over
    the whole range (stream n % streams, version n // streams + 1)."""
    streams = max(1, events // EVENTS_PER_STREAM)
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for low in range(0, events, FILL_CHUNK):
            high = min(events, low + FILL_CHUNK)
            conn.execute(FILL, {"prefix": prefix, "streams": streams, "low": low, "high": high})
            log.info("filled %s events of %s (%.0f events/s)", f"{high:,}", f"{events:,}",
                     high / (time.perf_counter() - started))
        conn.execute("VACUUM ANALYZE events")


def produce_topic(dsn: str, kafka: KafkaConnection, after: int) -> int:
    """The events after position ``after`` on their topic, as the connector writes them
    (``envelope_value``'s fields, built by Postgres: Python only hands them to the
    producer)."""
    producer = Producer(kafka.client_config(partitioner="murmur2_random",
                                            **{"linger.ms": 50, "compression.type": "lz4"}))
    topic, sent = event_topic(STREAM_TYPE), 0
    with (psycopg.connect(dsn) as conn, conn.cursor(name="growth") as cursor):
        cursor.execute("""
            SELECT stream_id, json_build_object(
                'payload', data::text, 'eventId', event_id, 'eventType', event_type,
                'streamVersion', stream_version, 'globalPosition', global_position,
                'recordedAt', recorded_at, 'schemaVersion', schema_version,
                'metadata', metadata::text)::text
            FROM events WHERE global_position > %s ORDER BY global_position""", (after,))
        while rows := cursor.fetchmany(20_000):
            for key, value in rows:
                while True:
                    try:
                        producer.produce(topic, key=key, value=value)
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.poll(0)
            sent += len(rows)
    if producer.flush(120) != 0:
        raise RuntimeError("the topic's messages were not all delivered")
    return sent


def timed_ms(call: Any, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def read_figures(store: EventStore, dsn: str, prefix: str, events: int
                 ) -> tuple[float, float, float]:
    """p99 ms of read_stream (a random stream of the prefix), and of a read_all page at the
    log's start and at its end."""
    streams = max(1, events // EVENTS_PER_STREAM)
    stream_p99 = percentile(timed_ms(
        lambda: store.read_stream(f"{prefix}{random.randrange(streams)}"), PROBES), 0.99)
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT tx_id::text::bigint, global_position FROM events "
                           "ORDER BY tx_id DESC, global_position DESC OFFSET %s LIMIT 1",
                           (PAGE * 2,)).fetchone()
    assert row is not None
    deep_cursor = f"{row[0]}:{row[1]}"
    start_p99 = percentile(timed_ms(lambda: store.read_all("", PAGE), PROBES // 5), 0.99)
    deep_p99 = percentile(timed_ms(lambda: store.read_all(deep_cursor, PAGE), PROBES // 5),
                          0.99)
    return stream_p99, start_p99, deep_p99


def verify_log(settings: Settings, work_dir: Path) -> tuple[float, float, str]:
    """``eventfold verify-log Product``: seconds, peak RSS of its process tree (MB), and its
    summary line."""
    env = {**os.environ, "EVENTFOLD_DATABASE_URL": settings.database_url,
           "EVENTFOLD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "EVENTFOLD_CONNECT_URL": settings.connect_url, "TMPDIR": str(work_dir)}
    started, peak = time.perf_counter(), 0
    process = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "verify-log",
                                STREAM_TYPE], env=env, stdout=subprocess.PIPE, text=True)
    while process.poll() is None:
        peak = max(peak, sum(rss for _, rss in tree_rss(process.pid).values()))
        time.sleep(0.1)
    output = process.stdout.read() if process.stdout else ""
    if process.returncode != 0:
        raise RuntimeError(f"verify-log failed ({process.returncode}): {output}")
    return time.perf_counter() - started, peak / 1e6, output.splitlines()[0]


def sizes(dsn: str) -> tuple[float, dict[str, float]]:
    with psycopg.connect(dsn) as conn:
        table = conn.execute("SELECT pg_table_size('events')").fetchone()
        indexes = conn.execute(
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) "
            "FROM pg_index WHERE indrelid = 'events'::regclass ORDER BY 1").fetchall()
    return (table[0] if table else 0) / 1e6, {name: size / 1e6 for name, size in indexes}


def plans(dsn: str, prefix: str) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of the reads whose cost must not grow with the log."""
    with psycopg.connect(dsn) as conn:
        deep = conn.execute("SELECT tx_id, global_position FROM events ORDER BY tx_id DESC, "
                            "global_position DESC OFFSET %s LIMIT 1", (PAGE * 2,)).fetchone()
        assert deep is not None
        out = []
        for title, query, params in [
            ("read_stream", "SELECT * FROM events WHERE stream_id = %s AND stream_version > 0 "
             "ORDER BY stream_version", (f"{prefix}7",)),
            ("read_all at the end", "SELECT * FROM events WHERE (tx_id, global_position) > "
             "(%s, %s) AND tx_id < pg_snapshot_xmin(pg_current_snapshot()) "
             "ORDER BY tx_id, global_position LIMIT 1000", deep),
            ("a store replay's bucket", "SELECT global_position FROM events WHERE "
             "(hashtext(stream_id) & 2147483647) %% 64 = 5 AND global_position > 0 AND "
             "global_position <= 100000000 AND stream_type = 'Product' "
             "ORDER BY global_position LIMIT 10000", ()),
        ]:
            rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {query}", params)
            out.append(f"-- {title}\n" + "\n".join(row[0] for row in rows))
    return "\n".join(out)


def measure(settings: Settings, work_dir: Path, prefix: str, events: int,
            produced: int) -> tuple[Figures, int]:
    """The figures at this size; the topic is first brought up to the store's last position
    (``produced`` before), which is returned."""
    dsn = libpq_url(settings.database_url)
    store = EventStore.from_url(settings.database_url)
    try:
        appends = pgbench_tps(dsn, 8, 10, work_dir, APPEND_AS_THE_APP_DOES)
        stream_p99, start_p99, deep_p99 = read_figures(store, dsn, prefix, events)
    finally:
        store.engine.dispose()
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*), max(global_position) FROM events").fetchone()
    assert row is not None
    stored, last = int(row[0]), int(row[1])
    sent = in_a_process(produce_topic, dsn, settings.kafka, produced)
    log.info("%s events produced to the topic", f"{sent:,}")
    verify_s, verify_mb, summary = verify_log(settings, work_dir)
    table_mb, indexes_mb = sizes(dsn)
    figures = Figures(stored, appends, stream_p99, start_p99, deep_p99, verify_s, verify_mb,
                      table_mb, indexes_mb)
    print(f"\n== {stored:,} events stored")
    print(f"single-event commands/s, 8 clients (append function): {appends:,.0f}")
    print(f"read_stream p99 {stream_p99:.2f} ms; read_all page p99 at the start "
          f"{start_p99:.2f} ms, at the end {deep_p99:.2f} ms")
    print(f"verify-log: {summary} in {verify_s:.1f} s, peak RSS {verify_mb:,.0f} MB")
    print(f"events table {table_mb:,.0f} MB; indexes {figures.indexes_total_mb:,.0f} MB: "
          + ", ".join(f"{name} {mb:,.0f}" for name, mb in indexes_mb.items()))
    print(plans(dsn, prefix))
    return figures, last


def autovacuum(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT n_live_tup, n_dead_tup, autovacuum_count, "
                           "last_autovacuum::text FROM pg_stat_user_tables "
                           "WHERE relname = 'events'").fetchone()
    return f"live {row[0]:,}, dead {row[1]:,}, autovacuums {row[2]}, last {row[3]}" if row \
        else "?"


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--first", type=int, default=100_000)
    args = parser.parse_args()
    with own_stack("eventfold-growth-") as (settings, work_dir):
        from eventfold import migrations

        migrations.upgrade(settings.database_url)
        dsn = libpq_url(settings.database_url)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(UUID7)
        TopicAdmin(settings.kafka).ensure([event_topic(STREAM_TYPE)], EVENT_TOPIC_CONFIG)
        results: list[Figures] = []
        produced = 0
        for prefix, events in (("first-", args.first), ("second-", args.events - args.first)):
            started = time.perf_counter()
            in_a_process(fill, dsn, prefix, events)
            log.info("%s events added in %.0f s; autovacuum: %s", f"{events:,}",
                     time.perf_counter() - started, autovacuum(dsn))
            figures, produced = measure(settings, work_dir, prefix, events, produced)
            results.append(figures)
        small, large = results
        ratio = large.appends_per_s / small.appends_per_s
        deep_ratio = large.read_all_deep_p99_ms / large.read_all_start_p99_ms
        print(f"\nappends at {large.stored:,} vs {small.stored:,} stored: {ratio:.2f}x "
              f"(target >= 0.9x); read_all at the end vs the start of the log: "
              f"{deep_ratio:.2f}x (target <= 2x); verify-log peak RSS "
              f"{large.verify_log_peak_rss_mb:,.0f} MB (target < 300 MB)")
        print(json.dumps({
            "append_ratio_10m_vs_100k": round(ratio, 3),
            "read_all_deep_vs_start_p99_ratio": round(deep_ratio, 3),
            "verify_log_peak_rss_mb": round(large.verify_log_peak_rss_mb, 1),
            "events_table_mb": round(large.table_mb, 1),
            "events_indexes_mb": round(large.indexes_total_mb, 1),
            "stored_events": large.stored,
            "appends_per_s_small": round(small.appends_per_s),
            "appends_per_s_large": round(large.appends_per_s),
            "read_stream_p99_ms_small": round(small.read_stream_p99_ms, 2),
            "read_stream_p99_ms_large": round(large.read_stream_p99_ms, 2),
            "read_all_start_p99_ms": round(large.read_all_start_p99_ms, 2),
            "read_all_deep_p99_ms": round(large.read_all_deep_p99_ms, 2),
            "verify_log_s": round(large.verify_log_s, 1),
            "verify_log_peak_rss_mb_small": round(small.verify_log_peak_rss_mb, 1),
        }))


if __name__ == "__main__":
    main()
