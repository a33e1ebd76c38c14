"""The reference for bench/append.py: the same single-event commands through ``eventsourcing``
9.5 (the Python library the write model is measured against), on the same Postgres, in the
same run, so the ratio says how the two compare on the machine as it is at that moment.

The workload mirrors the inventory example's ``ReceiveStock``: one ``StockReceived`` event per
command on a product aggregate, each client cycling over 200 products of its own. Clients are
threads on one ``Application`` (its API is blocking). eventsourcing gets its fastest setting for
this loop: an aggregate cache that is trusted without a re-read (``AGGREGATE_CACHE_FASTFORWARD
=n``), as Eventfold's command bus trusts its own cache. Its tables live in a schema of their
own, so they never meet the event store's.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

from bench.common import PRODUCTS_PER_CLIENT, threaded_round

if TYPE_CHECKING:
    import multiprocessing as mp

SCHEMA = "eventsourcing_reference"


def eventsourcing_env(database_url: str) -> dict[str, str]:
    """eventsourcing's settings (it reads them as environment variables) for ``database_url``."""
    url = make_url(database_url)
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": url.database or "", "POSTGRES_HOST": url.host or "127.0.0.1",
        "POSTGRES_PORT": str(url.port or 5432), "POSTGRES_USER": url.username or "",
        "POSTGRES_PASSWORD": url.password or "", "POSTGRES_SCHEMA": SCHEMA,
        "POSTGRES_POOL_SIZE": "10", "AGGREGATE_CACHE_MAXSIZE": "100000",
        "AGGREGATE_CACHE_FASTFORWARD": "n",
    }


def inventory(database_url: str):  # noqa: ANN201 (the class exists only once imported)
    """An eventsourcing Application that receives stock into product aggregates."""
    from eventsourcing.application import AggregateNotFoundError, Application
    from eventsourcing.domain import Aggregate, event

    class Product(Aggregate):
        @event("Registered")
        def __init__(self, name: str) -> None:
            self.name = name
            self.on_hand = 0

        @event("StockReceived")
        def receive(self, quantity: int) -> None:
            self.on_hand += quantity

        @staticmethod
        def create_id(name: str) -> uuid.UUID:
            return uuid.uuid5(uuid.NAMESPACE_URL, f"/products/{name}")

    class Inventory(Application[uuid.UUID]):
        def receive_stock(self, name: str, quantity: int) -> None:
            try:
                product = self.repository.get(Product.create_id(name))
            except AggregateNotFoundError:
                product = Product(name)
            product.receive(quantity)
            self.save(product)

        def on_hand(self, name: str) -> int:
            return self.repository.get(Product.create_id(name)).on_hand

    return Inventory(env=eventsourcing_env(database_url))


def create_schema(database_url: str) -> None:
    import psycopg

    libpq = make_url(database_url).set(drivername="postgresql").render_as_string(
        hide_password=False)
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")


def run_clients(app, tag: str, clients: int, until: float | None) -> int:  # noqa: ANN001
    """``threaded_round`` of ``clients`` threads receiving stock on ``app``."""
    return threaded_round(
        lambda n, done: app.receive_stock(f"{tag}-{n}-{done % PRODUCTS_PER_CLIENT}", 1),
        clients, until)


def eventsourcing_threads(database_url: str, clients: int, seconds: float,
                          counts: mp.Queue) -> None:
    """``bench.append.in_process`` target: warm every product up, then count for ``seconds``."""
    create_schema(database_url)
    app = inventory(database_url)
    tag = uuid.uuid4().hex[:8]
    run_clients(app, tag, clients, None)
    counts.put(run_clients(app, tag, clients, time.perf_counter() + seconds))
    app.close()
