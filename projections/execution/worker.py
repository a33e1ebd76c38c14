"""What a Spark Python worker keeps between the tasks it runs: one database connection, one
Kafka producer and one consumer per endpoint, and the derived-event topics it has made sure of.

Spark reuses its Python workers (``spark.python.worker.reuse``), and a new connection per task
and batch costs more than the task's work when batches are small. A task that fails lets its
connection and consumer go, so the next one starts on fresh ones.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import psycopg
from confluent_kafka import Consumer, Producer
from pyspark import TaskContext

from eventfold.contract import libpq_url
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import consumer_config
from eventfold.outbox.topics import EVENT_TOPIC_CONFIG, Replication, TopicAdmin
from eventfold.projections.state.producer import new_producer
from eventfold.projections.state.transactions import (
    DRIVER_SLOT,
    TransactionalWrites,
    writer_transactional_id,
)


class _Held(threading.local):
    """Per thread: a worker runs its tasks on one thread, and a driver that folds small batches
    itself (``engine.fold_on_driver``) does so on each projection's thread at once."""

    def __init__(self) -> None:
        self.connections: dict[tuple[str, str], psycopg.Connection] = {}
        self.producers: dict[KafkaConnection, Producer] = {}
        self.consumers: dict[KafkaConnection, Consumer] = {}
        self.transactions: dict[tuple[KafkaConnection, str], TransactionalWrites] = {}


_held = _Held()
_derived_topics: set[tuple[KafkaConnection, str]] = set()


@contextmanager
def connection(database_url: str, purpose: str = "store") -> Iterator[psycopg.Connection]:
    """This worker's connection to ``database_url`` for ``purpose`` for the duration of a task
    (a read that goes on while the task writes has one of its own); dropped if the task fails
    with it (it may be broken, or inside a failed transaction)."""
    held = (database_url, purpose)
    conn = _held.connections.get(held)
    if conn is None or conn.closed or conn.broken:
        conn = _held.connections[held] = psycopg.connect(libpq_url(database_url))
    try:
        yield conn
    except BaseException:
        _held.connections.pop(held, None)
        conn.close()
        raise
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.rollback()  # nothing of one task's reads lingers into the next


def producer(kafka: KafkaConnection) -> Producer:
    """This worker's producer of projection outputs."""
    found = _held.producers.get(kafka)
    if found is None:
        found = _held.producers[kafka] = new_producer(kafka)
    return found


def transactional_writes(kafka: KafkaConnection, writer: str) -> TransactionalWrites:
    """The transactional producer of this task's slot of ``writer``. A Spark task's is made
    for it (initialising it fences whoever had its slot before, an older runner or this
    runner's other worker); the driver keeps its one per projection thread."""
    task = TaskContext.get()
    if task is not None:
        return TransactionalWrites(kafka, writer_transactional_id(
            writer, f"task-{task.partitionId()}"))
    transactional_id = writer_transactional_id(writer, DRIVER_SLOT)
    found = _held.transactions.get((kafka, transactional_id))
    if found is None or found.fenced:
        found = _held.transactions[(kafka, transactional_id)] = TransactionalWrites(
            kafka, transactional_id)
    return found


def consumer(kafka: KafkaConnection) -> Consumer:
    """This worker's range reader (``kafka_source``): a new connection per partition and
    micro-batch costs more than reading its events (docs/benchmarks.md)."""
    found = _held.consumers.get(kafka)
    if found is None:
        found = _held.consumers[kafka] = Consumer(consumer_config(kafka, **{"fetch.min.bytes": 1}))
    return found


def drop_consumer(kafka: KafkaConnection) -> None:
    found = _held.consumers.pop(kafka, None)
    if found is not None:
        found.close()


def release() -> None:
    """Close what this thread holds: a stream thread that folded small batches itself lets
    its clients go when it ends (a worker's live as long as the worker)."""
    held = _held
    for conn in held.connections.values():
        conn.close()
    for reader in held.consumers.values():
        reader.close()
    for writer in held.producers.values():
        writer.flush(30)  # every task flushed already: nothing is waiting
    held.connections.clear()
    held.consumers.clear()
    held.producers.clear()
    held.transactions.clear()


def ensure_derived_topics(kafka: KafkaConnection, replication: Replication,
                          topics: Iterable[str], config: Mapping[str, str]) -> None:
    """Create the derived-event topics a fold emits to before producing to them (once per
    worker and topic)."""
    missing = {topic for topic in topics if (kafka, topic) not in _derived_topics}
    if missing:
        TopicAdmin(kafka, replication).ensure(missing, {**EVENT_TOPIC_CONFIG, **config},
                                              kind="derived")
        _derived_topics.update((kafka, topic) for topic in missing)
