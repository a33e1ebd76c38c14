"""A side effect for the test of effects: each placed purchase of ``examples.fulfilment`` sends
a receipt, here a row in ``test_receipts`` (the receiving service's log, with the idempotency
key it was given). Its first attempt fails for purchases whose id ends in ``3``; every
attempt fails for those ending in ``-bad``; attempts are counted in ``test_receipt_attempts``."""

from __future__ import annotations

import os

import psycopg

from eventfold import Eventfold
from eventfold.contract import libpq_url
from eventfold.projections import Event
from eventfold.reactions import effect


def _connection(database_url: str = "") -> psycopg.Connection:
    return psycopg.connect(libpq_url(database_url or os.environ["EVENTFOLD_DATABASE_URL"]),
                           autocommit=True)


def create_tables(database_url: str) -> None:
    with _connection(database_url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS test_receipts (purchase TEXT NOT NULL, "
                     "idempotency_key TEXT NOT NULL, at TIMESTAMPTZ DEFAULT now())")
        conn.execute("CREATE TABLE IF NOT EXISTS test_receipt_attempts (purchase TEXT NOT NULL)")


@effect("send_receipt", sources=["Purchase"], max_attempts=3, first_pause_s=0.1)
def send_receipt(event: Event, idempotency_key: str) -> None:
    if event.type != "PurchasePlaced":
        return
    with _connection() as conn:
        conn.execute("INSERT INTO test_receipt_attempts VALUES (%s)", (event.stream_id,))
        attempts = conn.execute("SELECT count(*) FROM test_receipt_attempts WHERE purchase = %s",
                                (event.stream_id,)).fetchone()
        if event.stream_id.endswith("-bad"):
            raise ConnectionError("the receipt service refuses this one")
        if event.stream_id.endswith("3") and attempts is not None and attempts[0] == 1:
            raise TimeoutError("the receipt service timed out")
        conn.execute("INSERT INTO test_receipts (purchase, idempotency_key) VALUES (%s, %s)",
                     (event.stream_id, idempotency_key))


app = Eventfold("receipts")
app.reactions.add(send_receipt)
