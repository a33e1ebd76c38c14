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
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eventfold.local_stack import broker, connect, postgres
from eventfold.local_stack.auth import ClientAuth
from eventfold.local_stack.java import class_data_options
from eventfold.local_stack.process import (
    StackError,
    free_port,
    pid_alive,
    port_is_open,
    stop_pid,
    wait_port_closed,
)
from eventfold.local_stack.spark_cluster import SparkCluster
from eventfold.local_stack.tls import CA_FILE, BrokerTls

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
    more_pids: dict[str, int] = field(default_factory=dict)
    """The other nodes of a cluster stack: ``broker-2``, ``broker-3``, ``connect-2``."""
    kafka_ca_location: str = ""
    """The CA certificate (PEM) Kafka clients trust when the broker takes SASL_SSL."""

    def as_env(self) -> dict[str, str]:
        return {
            "EVENTFOLD_DATABASE_URL": self.database_url,
            "EVENTFOLD_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "EVENTFOLD_CONNECT_URL": self.connect_url,
        }


PORTS_FILE = "ports.json"
SHAPE_FILE = "shape.json"


@dataclass(frozen=True)
class Shape:
    """How many brokers and Connect workers the stack runs: fixed when its data is made."""

    brokers: int = 1
    connect_workers: int = 1

    @property
    def brokers_names(self) -> list[str]:
        return _numbered("broker", self.brokers)

    @property
    def nodes(self) -> list[str]:
        """Every process, in start order."""
        return ["postgres", *self.brokers_names, *_numbered("connect", self.connect_workers)]


CLUSTER = Shape(brokers=3, connect_workers=2)
"""``stack up --cluster``: three brokers (replication factor 3, ``min.insync.replicas=2``)
and two Connect workers in one group."""


def _numbered(kind: str, count: int) -> list[str]:
    """``broker``, ``broker-2``, ...: the first node keeps the one-node stack's name."""
    return [kind if index == 1 else f"{kind}-{index}" for index in range(1, count + 1)]


class LocalStack:
    """Postgres + Apache Kafka (KRaft) + Kafka Connect (Debezium) under ``data_dir``, on
    loopback ports."""

    def __init__(self, data_dir: Path, auth: ClientAuth | None = None,
                 record_classes: bool = False) -> None:
        """``record_classes``: the broker and Connect JVMs write the classes they loaded as
        they stop (``class_data.build_stack_archives``), instead of mapping their archives."""
        self.data_dir = data_dir.resolve()
        self.record_classes = record_classes
        self.tls_dir = self.data_dir / "tls"
        auth = auth or ClientAuth()
        self.auth = auth.trusting(self.tls_dir / CA_FILE) if auth.tls else auth
        self.ca_location = str(self.tls_dir / CA_FILE) if self.auth.tls else ""
        self.spark = SparkCluster(self.data_dir / "spark")
        path = self.data_dir / SHAPE_FILE
        self.shape = Shape(**json.loads(path.read_text())) if path.exists() else Shape()

    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    @property
    def logs(self) -> Path:
        return self.data_dir / "logs"

    def up(self, shape: Shape | None = None, spark_cluster: bool = False) -> StackEndpoints:
        """Start every component that is not running, keeping all data. ``shape`` (default:
        the one the data was made with, else one broker and one worker) cannot change once
        the data exists; ``spark_cluster`` adds a Spark standalone master and two workers."""
        self.shape = self._fix_shape(shape)
        endpoints = self._up()
        if spark_cluster:
            self.spark.up()
        return endpoints

    def _fix_shape(self, wanted: Shape | None) -> Shape:
        path = self.data_dir / SHAPE_FILE
        recorded = Shape(**json.loads(path.read_text())) if path.exists() else (
            Shape() if self._initialized() else None)
        if recorded is not None and wanted is not None and recorded != wanted:
            raise StackError(
                f"the stack in {self.data_dir} was made with {recorded.brokers} broker(s) and "
                f"{recorded.connect_workers} Connect worker(s); `eventfold stack reset` it (its "
                "data goes) or use another EVENTFOLD_STACK_DIR for a cluster stack")
        shape = recorded or wanted or Shape()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(shape)))
        return shape

    def _up(self) -> StackEndpoints:
        running = self.endpoints()
        if running and self._all_alive(running):
            log.info("stack already running in %s", self.data_dir)
            return running
        dead = [name for name in self.shape.nodes if running is None
                or not pid_alive(self._pid(running, name))]
        if running is not None:
            log.warning("stack in %s: %s not running; starting %s again, keeping the data",
                        self.data_dir, ", ".join(dead), "it" if len(dead) == 1 else "them")
        return self._start(running, dead)

    def restart(self, component: str) -> StackEndpoints:
        """Stop ``component`` (if it runs) and start it again on its port, keeping data."""
        if component not in self.shape.nodes:
            raise StackError(f"unknown component {component!r}; one of "
                             f"{', '.join(self.shape.nodes)}")
        endpoints = self._require_endpoints()
        self._stop(endpoints, component, signal.SIGTERM)
        return self._start(endpoints, [component])

    def _start(self, running: StackEndpoints | None, names: list[str]) -> StackEndpoints:
        ports = self._ports()
        pids = {name: (self._pid(running, name) if running else 0) for name in self.shape.nodes}
        started: list[tuple[str, int]] = []
        t0 = time.monotonic()
        try:
            for name in names:
                ports[name] = self._usable_port(name, ports)
                if name.startswith("broker"):
                    ports[_controller_key(name)] = self._usable_port(_controller_key(name), ports)
            if "postgres" in names:
                pids["postgres"] = self._start_postgres(ports["postgres"])
                started.append(("postgres", pids["postgres"]))
                self._ready("postgres", ports, t0)
            brokers = [name for name in self.shape.brokers_names if name in names]
            for name, pid in self._start_brokers(brokers, ports, started).items():
                pids[name] = pid
                self._ready(name, ports, t0)
            for name in names:
                if name.startswith("connect"):
                    pids[name] = self._start_connect(name, ports)
                    started.append((name, pids[name]))
                    self._ready(name, ports, t0)
        except BaseException:
            for what, pid in reversed(started):
                stop_pid(pid, what=what)
            raise
        (self.data_dir / PORTS_FILE).write_text(json.dumps(ports))
        first = {"postgres", "broker", "connect"}
        return self._save(StackEndpoints(
            database_url=postgres.dsn(ports["postgres"]).replace(
                "postgresql://", "postgresql+psycopg://"),
            kafka_bootstrap=self._bootstrap(ports),
            connect_url=f"http://127.0.0.1:{ports['connect']}",
            postgres_pid=pids["postgres"], broker_pid=pids["broker"],
            connect_pid=pids["connect"],
            more_pids={name: pid for name, pid in pids.items() if name not in first},
            kafka_ca_location=self.ca_location))

    @staticmethod
    def _ready(name: str, ports: dict[str, int], t0: float) -> None:
        log.info("%s ready on port %d (%.1f s)", name, ports[name], time.monotonic() - t0)

    def _bootstrap(self, ports: dict[str, int]) -> str:
        return ",".join(f"127.0.0.1:{ports[name]}" for name in self.shape.brokers_names)

    def _start_postgres(self, port: int) -> int:
        data = self.data_dir / "postgres"
        if not (data / "PG_VERSION").exists():
            postgres.init_cluster(data, self.logs / "postgres.log")
        return postgres.start(data, port, self.logs / "postgres.log")

    def _start_brokers(self, names: list[str], ports: dict[str, int],
                       started: list[tuple[str, int]]) -> dict[str, int]:
        """Start the brokers ``names`` together (a cluster's nodes serve only once a quorum
        of controllers runs), then wait for each."""
        nodes = [broker.Node(index, ports[name], ports[_controller_key(name)])
                 for index, name in enumerate(self.shape.brokers_names, start=1)]
        cluster_id = broker.new_cluster_id()  # used by nodes whose storage is not formatted
        tls = BrokerTls.ensure(self.tls_dir) if self.auth.tls and names else None
        starting = {}
        for name in names:
            node = nodes[self.shape.brokers_names.index(name)]
            starting[name] = broker.start(self.data_dir / _kafka_dir(name), node, nodes,
                                          cluster_id, self.logs / f"{name}.log", self.auth,
                                          tls, class_data_options("broker", self.record_classes))
            started.append((name, starting[name].process.pid))
        return {name: process.wait() for name, process in starting.items()}

    def _start_connect(self, name: str, ports: dict[str, int]) -> int:
        return connect.start(self.data_dir / name, self._bootstrap(ports), ports[name],
                             self.logs / f"{name}.log", self.auth,
                             replication=min(self.shape.brokers, 3),
                             java_options=class_data_options("connect", self.record_classes))

    @staticmethod
    def _usable_port(name: str, ports: dict[str, int]) -> int:
        """``name``'s saved port if nothing listens there, else a fresh one that no other
        component of this stack has saved (it may be down now, and start later)."""
        port = ports.get(name)
        others = {saved for other, saved in ports.items() if other != name}
        if port is not None and not port_is_open(port) and port not in others:
            return port
        fresh = free_port(avoid=others)
        if port is not None:
            log.warning("%s's port %d is taken by another process; using %d", name, port, fresh)
        return fresh

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
        # The nodes of one kind stop together: a broker stopped after the others has lost its
        # controller quorum and cannot shut down cleanly, and waits for its SIGKILL.
        for kind in ("connect", "broker", "postgres"):
            group = [name for name in self.shape.nodes if name.split("-")[0] == kind]
            stoppers = [threading.Thread(target=self._stop, args=(endpoints, name,
                                                                  signal.SIGTERM))
                        for name in group]
            for stopper in stoppers:
                stopper.start()
            for stopper in stoppers:
                stopper.join()
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
        if name in endpoints.more_pids:
            return endpoints.more_pids[name]
        return int(getattr(endpoints, f"{name}_pid", 0))

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
                name: {"pid": self._pid(endpoints, name),
                       "alive": pid_alive(self._pid(endpoints, name)),
                       "endpoint": self._endpoint(endpoints, name)}
                for name in self.shape.nodes
            },
        }

    def pid_of(self, name: str) -> int:
        """The PID of node ``name`` (``broker-2``...), for tests that kill it."""
        return self._pid(self._require_endpoints(), name)

    def node_listening_on(self, port: int) -> str:
        """The node whose (client or REST) port is ``port``."""
        ports = self._ports()
        return next(name for name in self.shape.nodes if ports.get(name) == port)

    def _endpoint(self, endpoints: StackEndpoints, name: str) -> str:
        if name == "postgres":
            return endpoints.database_url
        port = self._ports().get(name, 0)
        return f"http://127.0.0.1:{port}" if name.startswith("connect") else f"127.0.0.1:{port}"

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

    def _all_alive(self, endpoints: StackEndpoints) -> bool:
        return all(pid_alive(self._pid(endpoints, name)) for name in self.shape.nodes)



def _controller_key(broker_name: str) -> str:
    """The ports file's name of a broker's controller port (``controller`` for the first)."""
    return broker_name.replace("broker", "controller")


def _kafka_dir(broker_name: str) -> str:
    return broker_name.replace("broker", "kafka")


__all__ = ["CLUSTER", "LocalStack", "Shape", "StackEndpoints", "StackError"]
