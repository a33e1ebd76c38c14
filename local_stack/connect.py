"""A Kafka Connect worker in distributed mode running Debezium's Postgres connector.

The Connect runtime (Apache Kafka 4.1.1) and Debezium 3.3.2 are the jars
``local_stack.java`` finds; the worker keeps its configs, offsets and status in Kafka topics,
so a connector survives a worker restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import requests

from eventfold.local_stack.auth import ClientAuth
from eventfold.local_stack.java import classpath, java_binary, log4j_config
from eventfold.local_stack.process import StackError, port_is_open, spawn, wait_until

WORKER_MAIN = "org.apache.kafka.connect.cli.ConnectDistributed"
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"


def worker_properties(bootstrap: str, rest_port: int, group_id: str,
                      auth: ClientAuth, replication: int = 1) -> dict[str, str]:
    return {
        **auth.worker_config(),
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "listeners": f"http://127.0.0.1:{rest_port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(rest_port),
        "plugin.discovery": "service_load",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "config.storage.topic": f"{group_id}-configs",
        "offset.storage.topic": f"{group_id}-offsets",
        "status.storage.topic": f"{group_id}-status",
        "config.storage.replication.factor": str(replication),
        "offset.storage.replication.factor": str(replication),
        "status.storage.replication.factor": str(replication),
        "offset.storage.partitions": "1",
        "status.storage.partitions": "1",
        "offset.flush.interval.ms": "1000",
        # Exactly-once source connectors (KIP-618): a task's records and its offsets commit in
        # one transaction per poll batch (transaction.boundary=poll, the default).
        "exactly.once.source.support": "enabled",
        "session.timeout.ms": "6000",
        "heartbeat.interval.ms": "1000",
        "rebalance.timeout.ms": "20000",
        "scheduled.rebalance.max.delay.ms": "0",
        "producer.linger.ms": "5",
        "producer.batch.size": "524288",
        "task.shutdown.graceful.timeout.ms": "10000",
        # The worker's admin and consumers, above all its reads of the offsets topic to the
        # end, give up on a dead partition leader after this and ask again with fresh
        # metadata; at the default (60 s) a broker's death stalled the outbox task a minute.
        "default.api.timeout.ms": "15000",
        "request.timeout.ms": "10000",  # an admin client's must not exceed the above
        # Connector configs may name secrets instead of holding them:
        # ${file:/path/secrets.properties:key} or ${env:VARIABLE}, resolved by the worker.
        "config.providers": "file,env",
        "config.providers.file.class":
            "org.apache.kafka.common.config.provider.FileConfigProvider",
        "config.providers.env.class":
            "org.apache.kafka.common.config.provider.EnvVarConfigProvider",
    }


def start(
    work_dir: Path, bootstrap: str, rest_port: int, log_path: Path, auth: ClientAuth,
    replication: int = 1, timeout_s: float = 120, java_options: Sequence[str] = (),
) -> int:
    if port_is_open(rest_port):
        raise StackError(f"port {rest_port} is already in use; cannot start Kafka Connect there")
    work_dir.mkdir(parents=True, exist_ok=True)
    props_path = work_dir / "worker.properties"
    # A fixed group: its configs and offsets topics are found again whatever port it gets.
    props = worker_properties(bootstrap, rest_port, "eventfold-connect", auth, replication)
    props_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    log4j_path = log4j_config(work_dir / "log4j2.properties",
                              {"connect": "org.apache.kafka.connect", "debezium": "io.debezium"})
    process = spawn(
        [java_binary(), "-Xmx768m", "-XX:+UseSerialGC", "-Djava.awt.headless=true", *java_options,
         f"-Dlog4j2.configurationFile={log4j_path}", "-cp", classpath(), WORKER_MAIN,
         str(props_path)],
        log_path,
        cwd=work_dir,
    )
    url = f"http://127.0.0.1:{rest_port}"
    wait_until(
        lambda: _serves_postgres_plugin(url), what=f"Kafka Connect worker at {url}",
        timeout_s=timeout_s, pid=process.pid, log_path=log_path, interval_s=0.5,
    )
    return process.pid


def _serves_postgres_plugin(url: str) -> bool:
    try:
        plugins = requests.get(f"{url}/connector-plugins", timeout=2)
        connectors = requests.get(f"{url}/connectors", timeout=2)
    except requests.RequestException:
        return False
    if plugins.status_code != 200 or connectors.status_code != 200:
        return False
    return any(p.get("class") == POSTGRES_CONNECTOR for p in plugins.json())
