"""A broker that takes credentials: strangers are refused, and the whole pipeline (CDC through
the Connect worker, projections on Spark, KTable reads) works with the credentials given once,
in EVENTFOLD_KAFKA_CONFIG. The Debezium database password reaches Connect through a config
provider and is never printed."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import requests
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from eventfold.local_stack import LocalStack
from eventfold.local_stack.process import free_port, port_is_open, stop_pid, wait_until
from eventfold.outbox.connection import KafkaConnection
from sqlalchemy.engine import make_url

from eventfold.config import Settings
from tests.integration.test_cli import eventfold
from tests.kafka_helpers import read_table
from tests.pipeline_helpers import wait_until_in_topic

USER = "eventfold-app"
CDC_ROLE = "cdc_secret"


def scram(password: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": USER, "sasl.password": password}


def refused(bootstrap: str, settings: dict[str, str]) -> str:
    """What a client with ``settings`` is told when it asks the broker for metadata."""
    errors: list[str] = []
    admin = AdminClient(KafkaConnection.of(bootstrap, settings).client_config(
        **{"log_level": 0, "error_cb": lambda error: errors.append(str(error))}))
    with pytest.raises(KafkaException) as raised:
        admin.list_topics(timeout=5)
    admin.poll(1)  # serves error_cb
    return " ".join([str(raised.value), *errors])


def require_password_for(stack: LocalStack, database_url: str, role: str, password: str) -> None:
    """A login role of its own that must give its password (the stack trusts loopback)."""
    url = make_url(database_url).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{password}'")
        hba = stack.data_dir / "postgres" / "pg_hba.conf"
        hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n{hba.read_text()}")
        conn.execute("SELECT pg_reload_conf()")
    wrong = url.set(username=role, password="wrong").render_as_string(hide_password=False)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong).close()


def test_secured_broker_refuses_strangers_and_carries_the_pipeline(tmp_path: Path) -> None:
    password, db_password = secrets.token_hex(12), secrets.token_hex(12)
    client = ",".join(f"{k}={v}" for k, v in scram(password).items())
    env = {**os.environ, "EVENTFOLD_STACK_DIR": str(tmp_path / "stack"),
           "EVENTFOLD_KAFKA_CONFIG": client, "EVENTFOLD_APP": "examples.inventory:app",
           "EVENTFOLD_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    stack = Settings.from_env(env).local_stack()
    server: subprocess.Popen | None = None
    try:
        up = eventfold("stack", "up", env=env)
        assert up.returncode == 0, up.stderr[-3000:]
        assert f"broker: SASL_PLAINTEXT, SCRAM-SHA-256 user {USER}" in up.stdout
        assert password not in up.stdout + up.stderr
        endpoints = stack.endpoints()
        assert endpoints is not None
        bootstrap = endpoints.kafka_bootstrap

        refused(bootstrap, {})  # no credentials
        assert "Authentication failed" in refused(bootstrap, scram("not-the-password"))

        require_password_for(stack, endpoints.database_url, CDC_ROLE, db_password)
        secrets_file = tmp_path / "connect-secrets.properties"
        secrets_file.write_text(f"database.password={db_password}\n")
        connect_url = make_url(endpoints.database_url).set(username=CDC_ROLE,
                                                           password=db_password)
        env |= {"EVENTFOLD_CONNECT_DATABASE_URL": connect_url.render_as_string(
                    hide_password=False),
                "EVENTFOLD_CONNECT_DATABASE_PASSWORD":
                    f"${{file:{secrets_file}:database.password}}"}
        setup = eventfold("setup", env=env, timeout=300)
        assert setup.returncode == 0, setup.stderr[-3000:]
        diff = eventfold("connector", "diff", env=env)
        assert (diff.returncode, diff.stdout.strip()) == (0, "eventfold-outbox: up to date")
        stored = requests.get(f"{endpoints.connect_url}/connectors/eventfold-outbox/config",
                              timeout=10).json()
        assert stored["database.user"] == CDC_ROLE
        assert stored["database.password"].startswith("${file:")
        for output in (setup.stdout + setup.stderr, diff.stdout, json.dumps(stored)):
            assert db_password not in output and password not in output

        from examples.inventory import ReceiveStock, app, inventory_totals

        settings = Settings.from_env(env).with_local_stack()
        bus = app.command_bus(settings)
        for n in range(5):
            bus.execute(ReceiveStock(product=f"secured-{n}", quantity=n + 1))
        wait_until_in_topic(settings, "Product", "secured-", 5)  # through the SASL worker

        ran = eventfold("projection", "run", "inventory_totals", "--once", env=env,
                        timeout=300)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert password not in ran.stdout + ran.stderr

        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "eventfold.cli", "serve", "reads"],
            env={**env, "EVENTFOLD_READ_API_PORT": str(port)},
            stdout=(tmp_path / "reads.log").open("w"), stderr=subprocess.STDOUT)
        wait_until(lambda: port_is_open(port), what="the read API", timeout_s=60)
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: requests.get(f"{base}/ready", timeout=5).status_code == 200,
                   what="the read API's KTables restored", timeout_s=60)
        for n in range(5):
            entry = requests.get(f"{base}/ktables/inventory_totals/entries/secured-{n}",
                                 timeout=10)
            assert entry.status_code == 200, entry.text
            assert entry.json()["value"]["quantity"] == n + 1
            row = requests.get(f"{base}/read-models/inventory_totals/rows/secured-{n}",
                               timeout=10).json()
            assert row["row"]["quantity"] == n + 1
        stop_pid(server.pid, what="serve reads")
        server = None

        # The broker's SCRAM user lives in its metadata: starting it without credentials
        # is refused, not silently unsecured; with them it comes back with its data.
        assert eventfold("stack", "down", env=env).returncode == 0
        unsecured = eventfold("stack", "up", env={k: v for k, v in env.items()
                                                  if k != "EVENTFOLD_KAFKA_CONFIG"})
        assert unsecured.returncode == 1
        assert "eventfold stack reset" in unsecured.stderr, unsecured.stderr[-2000:]
        assert eventfold("stack", "up", env=env).returncode == 0
        ktable = read_table(settings.kafka, inventory_totals.ktable_topic_for(1))
        assert {k: v["quantity"] for k, v in ktable.items()} == {
            f"secured-{n}": n + 1 for n in range(5)}
    finally:
        if server is not None:
            stop_pid(server.pid, what="serve reads")
        stack.down()
