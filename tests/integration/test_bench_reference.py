"""bench/append.py's reference workload really runs eventsourcing's commands on our Postgres:
every command is stored, survives a restart of the application, and stays out of our tables."""

from __future__ import annotations

import psycopg
from sqlalchemy.engine import make_url

from bench.eventsourcing_reference import SCHEMA, create_schema, inventory, run_clients


def libpq(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(
        hide_password=False)


def test_reference_commands_are_stored_in_their_own_schema(inventory_app, stack_settings,
                                                          unique) -> None:
    url = stack_settings.database_url
    create_schema(url)
    app = inventory(url)
    try:
        first = run_clients(app, unique, clients=2, until=None)
        again = run_clients(app, unique, clients=2, until=None)
    finally:
        app.close()
    assert first == again == 400

    reopened = inventory(url)  # a fresh cache: the state comes back from Postgres
    try:
        on_hand = {reopened.on_hand(f"{unique}-{client}-{product}")
                   for client in range(2) for product in range(200)}
    finally:
        reopened.close()
    assert on_hand == {2}

    with psycopg.connect(libpq(url)) as conn:
        tables = {row[0] for row in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (SCHEMA,))}
        ours = conn.execute("SELECT count(*) FROM events WHERE stream_id LIKE %s",
                            (f"{unique}%",)).fetchone()
    assert tables, "eventsourcing created no tables in its schema"
    assert ours == (0,)
