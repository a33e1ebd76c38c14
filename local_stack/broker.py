"""A single-node Apache Kafka broker in KRaft mode (one process, controller and broker).

Its log directory lives under the stack's data directory, so topics survive a restart; the
storage is formatted once, on the first start. The jars come from ``local_stack.java``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from pathlib import Path

from eventfold.local_stack.auth import ClientAuth
from eventfold.local_stack.java import classpath, java_binary, log4j_config
from eventfold.local_stack.process import StackError, port_is_open, spawn, wait_until

BROKER_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
STARTED_LINE = "Kafka Server started"
HEAP = "-Xmx512m"


AUTH_RECORD = "auth.json"


def server_properties(data_dir: Path, port: int, controller_port: int,
                      auth: ClientAuth) -> dict[str, str]:
    listener = auth.protocol
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"{listener}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"{listener}://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": listener,
        "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{listener}:{listener}",
        **(_sasl_properties(auth) if auth.sasl else {}),
        "log.dirs": str(data_dir / "logs"),
        # One broker: every internal topic has one replica.
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.partitions": "1",
        # The log cleaner looks for work every second (the default is 15 s), so that
        # compaction shows up within a test.
        "log.cleaner.backoff.ms": "1000",
        "num.io.threads": "4",
        "num.network.threads": "2",
    }


def _sasl_properties(auth: ClientAuth) -> dict[str, str]:
    """Clients and the broker itself log in over SCRAM. The controller listener stays
    PLAINTEXT: it is bound to loopback and serves only the KRaft quorum of this one node."""
    mechanism = auth.mechanism
    return {
        "sasl.enabled.mechanisms": mechanism,
        "sasl.mechanism.inter.broker.protocol": mechanism,
        f"listener.name.sasl_plaintext.{mechanism.lower()}.sasl.jaas.config":
            dict(auth.java_config)["sasl.jaas.config"],
    }


def start(data_dir: Path, port: int, controller_port: int, log_path: Path,
          auth: ClientAuth, timeout_s: float = 90) -> int:
    for taken in (port, controller_port):
        if port_is_open(taken):
            raise StackError(f"port {taken} is already in use; cannot start the broker there")
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    config = data_dir / "server.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in
                              server_properties(data_dir, port, controller_port, auth).items()))
    log4j = log4j_config(data_dir / "log4j2.properties",
                         {"server": "kafka.server.KafkaRaftServer"})
    if not (data_dir / "logs" / "meta.properties").exists():
        _format(config, log_path, auth)
        (data_dir / AUTH_RECORD).write_text(json.dumps(auth.describe()))
    auth.check_matches(data_dir / AUTH_RECORD)
    already_logged = log_path.stat().st_size if log_path.exists() else 0
    process = spawn([java_binary(), HEAP, "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                     f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath(), BROKER_MAIN,
                     str(config)], log_path, cwd=data_dir)
    wait_until(lambda: port_is_open(port) and _started(log_path, already_logged),
               what=f"Kafka broker on port {port}", timeout_s=timeout_s, pid=process.pid,
               log_path=log_path, interval_s=0.2)
    return process.pid


def _format(config: Path, log_path: Path, auth: ClientAuth) -> None:
    """Format the log directory for a new single-node cluster (KRaft needs a cluster id),
    with the SCRAM user if clients authenticate (KIP-900: the credential is in the metadata
    log before the broker first starts, so that it can authenticate to itself)."""
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    scram = (["--add-scram", f"{auth.mechanism}=[name={auth.username},"
                             f"password={auth.password}]"] if auth.sasl else [])
    # "--cluster-id=" joined: one id in 64 starts with "-", which the tool took for an option.
    result = subprocess.run(
        [java_binary(), "-cp", classpath(), STORAGE_TOOL, "format",
         f"--cluster-id={cluster_id}", "-c", str(config), *scram],
        capture_output=True, text=True, timeout=120, check=False)
    with log_path.open("a") as log:
        log.write(result.stdout + result.stderr)
    if result.returncode != 0:
        raise StackError(f"formatting the Kafka log directory failed ({result.returncode}):\n"
                         f"{(result.stdout + result.stderr)[-2000:]}")


def _started(log_path: Path, offset: int) -> bool:
    try:
        with log_path.open("rb") as log:
            log.seek(offset)
            return STARTED_LINE.encode() in log.read()
    except FileNotFoundError:
        return False
