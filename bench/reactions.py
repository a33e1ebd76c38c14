"""Reactions on a stack of their own: events/s through a reaction that sends one command per
event, against the command rate the same bus reaches when driven directly (the commands are
the cost), and the event-to-command latency at a steady 100 purchases/s. Prints figures,
then one JSON line.

    .venv/bin/python -m bench.reactions [--events 20000] [--seconds 10] [--rate 100]

The reaction is ``examples.fulfilment``'s ``reserve_stock``: each ``PurchasePlaced`` sends a
``ReserveStock`` to one of ``SHELVES`` shelves. Latency is measured on the database's clock:
from the purchase's event being recorded to its reservation being recorded, through the
outbox, Debezium, Kafka, the reaction and the command bus.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
import time
import uuid

import psycopg

from bench.common import own_stack, percentile
from eventfold.config import Settings
from eventfold.contract import libpq_url
from examples import fulfilment

SHELVES = 1_000
CLIENTS = (8, 256)
"""The command rate is taken at 8 clients (bench/append.py's figure) and at 256, about as
many commands as a reaction's batch of 500 events over 1,000 shelves has in flight."""


def _stock_shelves(settings: Settings) -> None:
    bus = fulfilment.app.runtime(settings).command_bus()
    for n in range(SHELVES):
        bus.execute(fulfilment.StockShelf(shelf_id=f"shelf-{n}", quantity=10_000_000))


def command_rate(settings: Settings, seconds: float, clients: int) -> float:
    """``ReserveStock`` commands/s, each with an id as a reaction's, from ``clients``
    concurrent clients of one async bus: what a reaction's commands cost without it."""
    runtime = fulfilment.app.runtime(settings)

    async def run() -> int:
        bus = runtime.async_command_bus()
        async with bus.repository.store:
            async def client(n: int, until: float) -> int:
                done = 0
                while time.perf_counter() < until:
                    await bus.execute(fulfilment.ReserveStock(
                        shelf_id=f"shelf-{(n * 7919 + done) % SHELVES}",
                        purchase_id=f"direct-{n}-{done}", quantity=1,
                        command_id=uuid.uuid4()))
                    done += 1
                return done

            await asyncio.gather(*(client(n, time.perf_counter() + 1) for n in range(clients)))
            until = time.perf_counter() + seconds
            return sum(await asyncio.gather(*(client(n, until) for n in range(clients))))

    return asyncio.run(run()) / seconds


def _place(settings: Settings, purchases: int, prefix: str, per_s: float | None = None) -> None:
    bus = fulfilment.app.runtime(settings).command_bus()
    started = time.perf_counter()
    for n in range(purchases):
        bus.execute(fulfilment.PlacePurchase(purchase_id=f"{prefix}-{n}",
                                             shelf_id=f"shelf-{n % SHELVES}", quantity=1))
        if per_s is not None:
            time.sleep(max(started + (n + 1) / per_s - time.perf_counter(), 0))


class RunningReaction:
    """``reserve_stock`` running in this process, on a thread of its own."""

    def __init__(self, settings: Settings) -> None:
        self.runtime = fulfilment.app.runtime(settings)
        self.stopping = threading.Event()
        self.runner = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        bus = self.runtime.async_command_bus()
        async with bus.repository.store:
            self.runner = self.runtime.reaction_runner("reserve_stock", bus)
            await self.runner.run(self.stopping)

    def __enter__(self) -> RunningReaction:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._thread.join(60)

    def events(self) -> int:
        return self.runner.counts.events if self.runner else 0


def _wait(condition, what: str, timeout_s: float = 600) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _topic_events(settings: Settings) -> int:
    from eventfold.reactions.operations import report

    ends = report(settings.kafka, settings.database_url, fulfilment.reserve_stock).partitions
    return sum(high for _, high in ends.values())


def throughput(settings: Settings, events: int) -> float:
    """Events/s through the reaction over ``events`` purchases already in Kafka, from its
    first event to its last."""
    from eventfold.reactions.operations import reset

    reset(settings.kafka, settings.database_url, fulfilment.reserve_stock, "end",
          command_id_retention_s=7 * 86400)
    before = _topic_events(settings)
    logging.info("placing %d purchases", events)
    _place(settings, events, "bulk")
    # Offsets also number transaction markers: wait until the topics hold every event.
    _wait(lambda: _topic_events(settings) >= before + events, "the purchases to reach Kafka")
    time.sleep(2)
    with RunningReaction(settings) as running:
        _wait(lambda: running.events() > 0, "the reaction's first event")
        started, first = time.perf_counter(), running.events()
        _wait(lambda: running.events() >= events, "the reaction to act on every purchase")
        elapsed = time.perf_counter() - started
    return (events - first) / elapsed


def latency(settings: Settings, rate: float, seconds: float) -> list[float]:
    """Per purchase placed at ``rate``/s: ms from its event to its reservation, both as the
    database recorded them."""
    count = int(rate * seconds)
    with RunningReaction(settings):
        time.sleep(3)  # joined its group, caught up
        _place(settings, count, "steady", per_s=rate)
        with psycopg.connect(libpq_url(settings.database_url)) as conn:
            def reserved() -> int:
                row = conn.execute("SELECT count(*) FROM events WHERE event_type = "
                                   "'StockReserved' AND data->>'purchase_id' LIKE 'steady-%'"
                                   ).fetchone()
                return int(row[0]) if row else 0

            _wait(lambda: reserved() >= count, "every steady purchase to be reserved", 120)
            rows = conn.execute(
                "SELECT extract(epoch FROM r.recorded_at - p.recorded_at) * 1000 FROM events p "
                "JOIN events r ON r.event_type = 'StockReserved' AND r.data->>'purchase_id' = "
                "p.stream_id WHERE p.event_type = 'PurchasePlaced' AND p.stream_id LIKE "
                "'steady-%'").fetchall()
    return [float(r[0]) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rate", type=float, default=100)
    parser.add_argument("--latency-seconds", type=float, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    with own_stack("eventfold-reactions-") as (settings, _):
        fulfilment.app.runtime(settings).setup()
        _stock_shelves(settings)
        direct = {clients: command_rate(settings, args.seconds, clients)
                  for clients in CLIENTS}
        for clients, rate in direct.items():
            print(f"command bus, {clients} clients: {rate:,.0f} commands/s")
        best = max(direct.values())
        through = throughput(settings, args.events)
        print(f"reaction, one command per event: {through:,.0f} events/s "
              f"({through / best:.2f}x the best command rate)")
        millis = latency(settings, args.rate, args.latency_seconds)
        p50, p99 = percentile(millis, .5), percentile(millis, .99)
        print(f"event to command at {args.rate:.0f} purchases/s: p50 {p50:.1f} ms, "
              f"p99 {p99:.1f} ms ({len(millis)} purchases)")
    print(json.dumps({
        "command_bus_8_clients_commands_per_s": round(direct[8]),
        "command_bus_256_clients_commands_per_s": round(direct[256]),
        "reaction_events_per_s": round(through),
        "reaction_vs_command_rate": round(through / best, 3),
        "event_to_command_p50_ms": round(p50, 1),
        "event_to_command_p99_ms": round(p99, 1),
        "latency_rate_per_s": args.rate,
    }))


if __name__ == "__main__":
    main()
