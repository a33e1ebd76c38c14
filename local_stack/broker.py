"""Apache Kafka brokers in KRaft mode, each one process that is controller and broker: one
node, or the three of a cluster (a static controller quorum of all three).

A node's log directory lives under the stack's data directory, so topics survive a restart;
the storage is formatted once, on the first start, every node with the cluster's one id. The
jars come from ``local_stack.java``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eventfold.local_stack.auth import ClientAuth
from eventfold.local_stack.java import classpath, java_binary, log4j_config
from eventfold.local_stack.process import StackError, port_is_open, spawn, wait_until
from eventfold.local_stack.tls import BrokerTls

BROKER_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
STARTED_LINE = "Kafka Server started"
HEAP = "-Xmx512m"


AUTH_RECORD = "auth.json"


@dataclass(frozen=True)
class Node:
    """One node of the cluster: its id (from 1), client port and controller port."""

    node_id: int
    port: int
    controller_port: int


def quorum(nodes: Sequence[Node]) -> str:
    return ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in nodes)


def server_properties(data_dir: Path, node: Node, nodes: Sequence[Node],
                      auth: ClientAuth, tls: BrokerTls | None = None) -> dict[str, str]:
    listener = auth.protocol
    port, controller_port = node.port, node.controller_port
    replicas = str(min(len(nodes), 3))
    min_isr = str(max(len(nodes) - 1, 1))
    return {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": quorum(nodes),
        "listeners": f"{listener}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"{listener}://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": listener,
        "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{listener}:{listener}",
        **(_sasl_properties(auth) if auth.sasl else {}),
        **(tls.server_properties() if tls else {}),
        "log.dirs": str(data_dir / "logs"),
        # Internal topics on every node of a cluster (of up to three), one copy may be down.
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "default.replication.factor": replicas,
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
    PLAINTEXT: it is bound to loopback and serves only the KRaft quorum of the stack."""
    mechanism = auth.mechanism
    return {
        "sasl.enabled.mechanisms": mechanism,
        "sasl.mechanism.inter.broker.protocol": mechanism,
        f"listener.name.{auth.protocol.lower()}.{mechanism.lower()}.sasl.jaas.config":
            dict(auth.java_config)["sasl.jaas.config"],
    }


@dataclass(frozen=True)
class StartingBroker:
    """A broker process that has been started; ``wait`` for it to serve. The nodes of a
    cluster start together, as none serves before a quorum of controllers runs."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    log_offset: int

    def wait(self, timeout_s: float = 90) -> int:
        """Wait until the broker serves on its port; its PID."""
        wait_until(lambda: port_is_open(self.port) and _started(self.log_path, self.log_offset),
                   what=f"Kafka broker on port {self.port}", timeout_s=timeout_s,
                   pid=self.process.pid, log_path=self.log_path, interval_s=0.2)
        return self.process.pid


def start(data_dir: Path, node: Node, nodes: Sequence[Node], cluster_id: str, log_path: Path,
          auth: ClientAuth, tls: BrokerTls | None = None,
          java_options: Sequence[str] = ()) -> StartingBroker:
    """Start ``node`` of ``nodes``, formatting its storage for ``cluster_id`` the first time;
    with ``tls``, its listener for clients takes TLS."""
    port = node.port
    for taken in (port, node.controller_port):
        if port_is_open(taken):
            raise StackError(f"port {taken} is already in use; cannot start the broker there")
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    config = data_dir / "server.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in
                              server_properties(data_dir, node, nodes, auth, tls).items()))
    log4j = log4j_config(data_dir / "log4j2.properties",
                         {"server": "kafka.server.KafkaRaftServer"})
    if not (data_dir / "logs" / "meta.properties").exists():
        _format(config, cluster_id, log_path, auth)
        (data_dir / AUTH_RECORD).write_text(json.dumps(auth.describe()))
    auth.check_matches(data_dir / AUTH_RECORD)
    already_logged = log_path.stat().st_size if log_path.exists() else 0
    process = spawn([java_binary(), HEAP, "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                     *java_options, f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath(),
                     BROKER_MAIN, str(config)], log_path, cwd=data_dir)
    return StartingBroker(process, port, log_path, already_logged)


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _format(config: Path, cluster_id: str, log_path: Path, auth: ClientAuth) -> None:
    """Format a node's log directory (KRaft needs the cluster's id), with the SCRAM user if
    clients authenticate (KIP-900: the credential is in the metadata log before the broker
    first starts, so that it can authenticate to itself)."""
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
