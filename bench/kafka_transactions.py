"""What a Kafka transaction per projection batch would cost: the time to write one batch of
KTable rows (JSON values of about 150 bytes, distinct keys, a compacted 4-partition topic)
with today's idempotent producer (produce, then flush and check every delivery report)
against a transactional producer (begin, produce, commit; ``transactional.id`` per
projection), for streaming-sized and replay-sized batches, on a stack of its own.

    .venv/bin/python -m bench.kafka_transactions [--rounds 30]
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable

from confluent_kafka import KafkaError, Message, Producer

from bench.common import own_stack, percentile
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.topics import COMPACTED_TOPIC_CONFIG, TopicAdmin

BATCH_SIZES = (10, 1_000, 20_000)
PRODUCER = {"enable.idempotence": True, "linger.ms": 5, "compression.type": "lz4",
            "log.connection.close": False}


def batch_writer(kafka: KafkaConnection, topic: str, transactional: bool,
                 ) -> Callable[[int, int], None]:
    """A function writing batch ``n`` of ``size`` rows and returning once it is durable."""
    extra = {"transactional.id": f"bench-{uuid.uuid4().hex[:8]}"} if transactional else {}
    producer = Producer(kafka.client_config(**PRODUCER, **extra))
    if transactional:
        producer.init_transactions(30)
    failures: list[KafkaError] = []

    def delivered(error: KafkaError | None, _: Message) -> None:
        if error is not None:
            failures.append(error)

    def write(n: int, size: int) -> None:
        if transactional:
            producer.begin_transaction()
        for i in range(size):
            value = json.dumps({"quantity": n * size + i, "version": n, "sku": f"sku-{i:08d}",
                                "note": "x" * 80})
            producer.produce(topic, key=f"key-{i}", value=value, on_delivery=delivered)
            if i % 10_000 == 9_999:
                producer.poll(0)
        if transactional:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
        if failures:
            raise RuntimeError(f"{len(failures)} deliveries failed: {failures[0]}")

    return write


def measure(write: Callable[[int, int], None], size: int, rounds: int) -> list[float]:
    write(0, size)  # warm-up: connections, producer id, the first metadata
    times = []
    for n in range(1, rounds + 1):
        started = time.perf_counter()
        write(n, size)
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    figures: dict[str, float] = {}
    with own_stack("eventfold-txn-") as (settings, _):
        kafka = settings.kafka
        for size in BATCH_SIZES:
            rounds = max(5, args.rounds * 1_000 // max(size, 1_000))
            medians = {}
            for mode in ("idempotent", "transactional"):
                topic = f"bench.txn.{mode}.{size}"
                TopicAdmin(kafka).ensure([topic], COMPACTED_TOPIC_CONFIG, partitions=4,
                                         kind="ktables")
                times = measure(batch_writer(kafka, topic, mode == "transactional"), size,
                                rounds)
                medians[mode] = percentile(times, 0.5)
                figures[f"batch{size}_{mode}_p50_ms"] = round(medians[mode], 2)
                figures[f"batch{size}_{mode}_p99_ms"] = round(percentile(times, 0.99), 2)
            added = medians["transactional"] - medians["idempotent"]
            figures[f"batch{size}_transaction_added_ms"] = round(added, 2)
            print(f"batch of {size:>6,} rows: idempotent p50 {medians['idempotent']:7.1f} ms, "
                  f"transactional p50 {medians['transactional']:7.1f} ms "
                  f"({medians['transactional'] / medians['idempotent']:.2f}x, "
                  f"{added:+.1f} ms per batch; {rounds} rounds)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
