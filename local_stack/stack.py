"""The stack as one unit: ``up`` starts Postgres, the broker and Connect; ``down`` stops them.

State (ports, PIDs) lives in ``<data_dir>/stack.json`` so that another process, such as
``eventfold stack down``, can stop what ``eventfold stack up`` started; the ports stay in
``ports.json`` after ``down``, so the next ``up`` serves the same endpoints.

Data is never removed implicitly: ``up`` starts what is not running (a dead component alone
is restarted, the others keep running) over the data that is there: the Postgres cluster,
the Kafka log directories and, in Kafka, Connect's configs and offsets. Only ``reset``
deletes the data directory.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from eventfold.local_stack import broker, connect, postgres
from eventfold.local_stack.auth import ClientAuth
from eventfold.local_stack.process import (
    StackError,
    free_port,
    pid_alive,
    port_is_open,
    stop_pid,
    wait_port_closed,
)
from eventfold.local_stack.spark_cluster import SparkCluster

log = logging.getLogger(__name__)

STATE_FILE = "stack.json"


@dataclass(frozen=True)
class StackEndpoints:
    """Where the running components listen, and the PIDs that own them."""

    database_url: str
    kafka_bootstrap: str
    connect_url: str
    postgres_pid: int
    broker_pid: int
    connect_pid: int

    def as_env(self) -> dict[str, str]:
        return {
            "EVENTFOLD_DATABASE_URL": self.database_url,
            "EVENTFOLD_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "EVENTFOLD_CONNECT_URL": self.connect_url,
        }


COMPONENTS = ("postgres", "broker", "connect")
PORTS_FILE = "ports.json"


class LocalStack:
    """Postgres + Apache Kafka (KRaft) + Kafka Connect (Debezium) under ``data_dir``, on
    loopback ports."""

    def __init__(self, data_dir: Path, auth: ClientAuth | None = None) -> None:
        self.data_dir = data_dir.resolve()
        self.auth = auth or ClientAuth()
        self.spark = SparkCluster(self.data_dir / "spark")

    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    @property
    def logs(self) -> Path:
        return self.data_dir / "logs"

    def up(self, spark_cluster: bool = False) -> StackEndpoints:
        """Start every component that is not running, keeping all data; with
        ``spark_cluster``, a Spark standalone master and two workers too."""
        endpoints = self._up()
        if spark_cluster:
            self.spark.up()
        return endpoints

    def _up(self) -> StackEndpoints:
        running = self.endpoints()
        if running and self._all_alive(running):
            log.info("stack already running in %s", self.data_dir)
            return running
        self.data_dir.mkdir(parents=True, exist_ok=True)
        dead = [name for name in COMPONENTS if running is None
                or not pid_alive(self._pid(running, name))]
        if running is not None:
            log.warning("stack in %s: %s not running; starting %s again, keeping the data",
                        self.data_dir, ", ".join(dead), "it" if len(dead) == 1 else "them")
        return self._start(running, dead)

    def restart(self, component: str) -> StackEndpoints:
        """Stop ``component`` (if it runs) and start it again on its port, keeping data."""
        if component not in COMPONENTS:
            raise StackError(f"unknown component {component!r}; one of {', '.join(COMPONENTS)}")
        endpoints = self._require_endpoints()
        self._stop(endpoints, component, signal.SIGTERM)
        return self._start(endpoints, [component])

    def _start(self, running: StackEndpoints | None, names: list[str]) -> StackEndpoints:
        ports = self._ports()
        pids = {name: (self._pid(running, name) if running else 0) for name in COMPONENTS}
        started: list[tuple[str, int]] = []
        t0 = time.monotonic()
        try:
            for name in COMPONENTS:
                if name in names:
                    ports[name] = self._usable_port(name, ports.get(name))
                    if name == "broker":
                        ports["controller"] = self._usable_port("controller",
                                                                ports.get("controller"))
                    pids[name] = self._start_component(name, ports)
                    started.append((name, pids[name]))
                    log.info("%s ready on port %d (%.1f s)", name, ports[name],
                             time.monotonic() - t0)
        except BaseException:
            for what, pid in reversed(started):
                stop_pid(pid, what=what)
            raise
        (self.data_dir / PORTS_FILE).write_text(json.dumps(ports))
        return self._save(StackEndpoints(
            database_url=postgres.dsn(ports["postgres"]).replace(
                "postgresql://", "postgresql+psycopg://"),
            kafka_bootstrap=f"127.0.0.1:{ports['broker']}",
            connect_url=f"http://127.0.0.1:{ports['connect']}",
            postgres_pid=pids["postgres"], broker_pid=pids["broker"],
            connect_pid=pids["connect"]))

    def _start_component(self, name: str, ports: dict[str, int]) -> int:
        if name == "postgres":
            data = self.data_dir / "postgres"
            if not (data / "PG_VERSION").exists():
                postgres.init_cluster(data, self.logs / "postgres.log")
            return postgres.start(data, ports["postgres"], self.logs / "postgres.log")
        if name == "broker":
            return broker.start(self.data_dir / "kafka", ports["broker"], ports["controller"],
                                self.logs / "broker.log", self.auth)
        return connect.start(self.data_dir / "connect", f"127.0.0.1:{ports['broker']}",
                             ports["connect"], self.logs / "connect.log", self.auth)

    def _usable_port(self, name: str, port: int | None) -> int:
        if port is None:
            return free_port()
        if port_is_open(port):
            fresh = free_port()
            log.warning("%s's port %d is taken by another process; using %d", name, port, fresh)
            return fresh
        return port

    def _initialized(self) -> bool:
        """Whether this stack ran before (its database exists)."""
        return (self.data_dir / "postgres" / "PG_VERSION").exists()

    def _ports(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in json.loads(
                (self.data_dir / PORTS_FILE).read_text()).items()}
        except FileNotFoundError:
            return {}

    def down(self) -> bool:
        """Stop every component; False if nothing was running. The data stays."""
        self.spark.down()
        endpoints = self.endpoints()
        if endpoints is None:
            log.info("no stack running in %s; nothing to stop", self.data_dir)
            return False
        # Connect first so that Debezium flushes its offsets while broker and database are up.
        for name in reversed(COMPONENTS):
            self._stop(endpoints, name, signal.SIGTERM)
        self.state_path.unlink(missing_ok=True)
        return True

    def reset(self) -> None:
        """Stop everything and delete all data: the database, the broker's, Connect's."""
        if self.endpoints() is not None:
            self.down()
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)

    @staticmethod
    def _stop(endpoints: StackEndpoints | None, name: str, sig: int) -> None:
        if endpoints is None:
            return
        pid = LocalStack._pid(endpoints, name)
        if name == "postgres":
            sig = signal.SIGINT if sig == signal.SIGTERM else sig  # fast shutdown
        stop_pid(pid, what=name, sig=sig, timeout_s=30)

    @staticmethod
    def _pid(endpoints: StackEndpoints, name: str) -> int:
        return int(getattr(endpoints, f"{name}_pid"))

    def status(self) -> dict[str, object]:
        endpoints = self.endpoints()
        if endpoints is None:
            return {"running": False, "data_dir": str(self.data_dir),
                    "data": self._initialized()}
        spark = self.spark.state()
        return {
            **({"spark": {"master_url": spark.master_url, "alive_workers":
                          self.spark.alive_workers(spark), "nodes": {
                              node.name: {"pid": node.pid, "alive": node.alive,
                                          "port": node.port, "web_ui": node.web_port}
                              for node in spark.nodes}}} if spark else {}),
            "running": self._all_alive(endpoints),
            "data_dir": str(self.data_dir),
            "components": {
                name: {"pid": pid, "alive": pid_alive(pid), "endpoint": endpoint}
                for name, pid, endpoint in (
                    ("postgres", endpoints.postgres_pid, endpoints.database_url),
                    ("broker", endpoints.broker_pid, endpoints.kafka_bootstrap),
                    ("connect", endpoints.connect_pid, endpoints.connect_url),
                )
            },
        }

    def restart_connect(self, sig: int = signal.SIGTERM) -> StackEndpoints:
        """Stop the Connect worker with ``sig`` (SIGKILL to simulate a crash) and start it again
        on the same port; its configs and offsets live in Kafka topics and survive."""
        endpoints = self._require_endpoints()
        self._stop(endpoints, "connect", sig)
        wait_port_closed(self._ports()["connect"], "kafka connect")
        return self._start(endpoints, ["connect"])

    def restart_postgres(self) -> StackEndpoints:
        """Fast-shutdown Postgres and start it again on the same port and data directory."""
        endpoints = self._require_endpoints()
        self._stop(endpoints, "postgres", signal.SIGINT)
        wait_port_closed(self._ports()["postgres"], "postgres")
        return self._start(endpoints, ["postgres"])

    def _require_endpoints(self) -> StackEndpoints:
        endpoints = self.endpoints()
        if endpoints is None:
            raise StackError(f"no stack running in {self.data_dir}")
        return endpoints

    def _save(self, endpoints: StackEndpoints) -> StackEndpoints:
        self.state_path.write_text(json.dumps(asdict(endpoints), indent=2))
        return endpoints

    def endpoints(self) -> StackEndpoints | None:
        try:
            return StackEndpoints(**json.loads(self.state_path.read_text()))
        except FileNotFoundError:
            return None

    @staticmethod
    def _all_alive(endpoints: StackEndpoints) -> bool:
        return all(pid_alive(LocalStack._pid(endpoints, name)) for name in COMPONENTS)


__all__ = ["LocalStack", "StackEndpoints", "StackError"]
