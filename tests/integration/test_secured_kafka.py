"""A broker that takes credentials, over TLS: strangers are refused, and the whole pipeline
(CDC through the Connect worker, projections on Spark, KTable reads) works with the credentials
given once, in EVENTFOLD_KAFKA_CONFIG. The Debezium database password reaches Connect through a
config provider and is never printed. Every client trusts the stack's own CA, and a client that
does not is refused at the handshake. (One stack for all of it: a secured stack's start is the
most of the test's time.)"""

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
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from eventfold.config import Settings
from eventfold.local_stack import LocalStack
from eventfold.local_stack.process import free_port, port_is_open, stop_pid, wait_until
from eventfold.outbox.connection import KafkaConnection
from tests.kafka_helpers import read_table
from tests.pipeline_helpers import rows, wait_until_in_topic
from tests.support.cli import eventfold

USER = "eventfold-app"
CDC_ROLE = "cdc_secret"


def scram(password: str, protocol: str = "SASL_PLAINTEXT",
          mechanism: str = "SCRAM-SHA-256") -> dict[str, str]:
    return {"security.protocol": protocol, "sasl.mechanism": mechanism,
            "sasl.username": USER, "sasl.password": password}


def as_config(settings: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in settings.items())


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


def test_a_secured_broker_refuses_strangers_and_carries_the_whole_pipeline(
        tmp_path: Path) -> None:
    """SCRAM-SHA-512 over TLS, with the stack's own CA (made at its first start): strangers,
    a wrong password, a client that does not trust the CA and one without TLS are refused.
    Connect (Debezium's producer, its database password given through a config provider and
    never printed), the command side, the projection's Spark tasks and the read API's KTable
    reader all verify the broker against that CA. The broker's SCRAM user lives in its
    metadata: started again without credentials it is refused, with them it comes back with
    its data."""
    password, db_password = secrets.token_hex(12), secrets.token_hex(12)
    client = scram(password, "SASL_SSL", "SCRAM-SHA-512")
    env = {**os.environ, "EVENTFOLD_STACK_DIR": str(tmp_path / "stack"),
           "EVENTFOLD_KAFKA_CONFIG": as_config(client), "EVENTFOLD_APP": "examples.inventory:app",
           "EVENTFOLD_STATE_DIR": str(tmp_path / "state")}
    stack = Settings.from_env(env).local_stack()
    ca = stack.tls_dir / "ca.pem"
    server: subprocess.Popen | None = None
    try:
        up = eventfold("stack", "up", env=env)
        assert up.returncode == 0, up.stderr[-3000:]
        assert f"broker: SASL_SSL, SCRAM-SHA-512 user {USER}" in up.stdout
        assert f"clients trust the stack's CA: {ca}" in up.stdout
        assert password not in up.stdout + up.stderr
        settings = Settings.from_env(env).with_local_stack()
        assert settings.kafka.client_config()["ssl.ca.location"] == str(ca)
        bootstrap = settings.kafka_bootstrap
        endpoints = stack.endpoints()
        assert endpoints is not None

        trusting = {"ssl.ca.location": str(ca)}
        refused(bootstrap, {"security.protocol": "SSL", **trusting})  # no credentials
        assert "certificate verify failed" in refused(bootstrap, client)  # CA not trusted
        assert "Authentication failed" in refused(
            bootstrap, {**scram("not-the-password", "SASL_SSL", "SCRAM-SHA-512"), **trusting})
        refused(bootstrap, scram(password, "SASL_PLAINTEXT", "SCRAM-SHA-512"))  # no TLS

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

        bus = app.runtime(settings).command_bus()
        for n in range(4):
            bus.execute(ReceiveStock(product=f"tls-{n}", quantity=10 * (n + 1)))
        wait_until_in_topic(settings, "Product", "tls-", 4)  # through Connect, over TLS

        ran = eventfold("projection", "run", "inventory_totals", "--once", env=env,
                        timeout=300)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert password not in ran.stdout + ran.stderr
        expected = {f"tls-{n}": 10 * (n + 1) for n in range(4)}
        engine = create_engine(settings.database_url)
        try:
            assert rows(engine, inventory_totals.table, "tls-", "quantity") == expected
        finally:
            engine.dispose()

        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "eventfold.cli", "serve", "reads"],
            env={**env, "EVENTFOLD_READ_API_PORT": str(port)},
            stdout=(tmp_path / "reads.log").open("w"), stderr=subprocess.STDOUT)
        wait_until(lambda: port_is_open(port), what="the read API", timeout_s=60)
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: requests.get(f"{base}/ready", timeout=5).status_code == 200,
                   what="the read API's KTables restored", timeout_s=60)
        for key, quantity in expected.items():
            entry = requests.get(f"{base}/ktables/inventory_totals/entries/{key}", timeout=10)
            assert entry.status_code == 200, entry.text
            assert entry.json()["value"]["quantity"] == quantity
        stop_pid(server.pid, what="serve reads")
        server = None

        assert eventfold("stack", "down", env=env).returncode == 0
        unsecured = eventfold("stack", "up", env={k: v for k, v in env.items()
                                                  if k != "EVENTFOLD_KAFKA_CONFIG"})
        assert unsecured.returncode == 1
        assert "eventfold stack reset" in unsecured.stderr, unsecured.stderr[-2000:]
        assert eventfold("stack", "up", env=env).returncode == 0
        ktable = read_table(settings.kafka, inventory_totals.ktable_topic_for(1))
        assert {k: v["quantity"] for k, v in ktable.items()} == expected
    finally:
        if server is not None:
            stop_pid(server.pid, what="serve reads")
        stack.down()
