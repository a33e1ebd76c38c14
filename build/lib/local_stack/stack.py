"""The stack as one unit: ``up`` starts Postgres, the broker and Connect; ``down`` stops them.

State (ports, PIDs) lives in ``<data_dir>/stack.json`` so that another process, such as
``eventfold stack down``, can stop what ``eventfold stack up`` started.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from local_stack import broker, connect, postgres
from local_stack.process import StackError, free_port, pid_alive, stop_pid, wait_port_closed

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


class LocalStack:
    """Postgres + Tansu + Kafka Connect (Debezium) under ``data_dir``, on free loopback ports."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()

    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    def up(self) -> StackEndpoints:
        running = self.endpoints()
        if running and self._all_alive(running):
            log.info("stack already running in %s", self.data_dir)
            return running
        if running:
            self.down()
        self._reset_data_dir()
        started: list[tuple[str, int]] = []
        try:
            endpoints = self._start_components(started)
        except BaseException:
            for what, pid in reversed(started):
                stop_pid(pid, what=what)
            raise
        return self._save(endpoints)

    def _start_components(self, started: list[tuple[str, int]]) -> StackEndpoints:
        t0 = time.monotonic()
        pg_port, broker_port, connect_port = free_port(), free_port(), free_port()
        logs = self.data_dir / "logs"
        postgres.init_cluster(self.data_dir / "postgres", logs / "postgres.log")
        pg_pid = postgres.start(self.data_dir / "postgres", pg_port, logs / "postgres.log")
        started.append(("postgres", pg_pid))
        log.info("postgres ready on 127.0.0.1:%d (%.1f s)", pg_port, time.monotonic() - t0)
        broker_pid = broker.start(broker_port, logs / "broker.log")
        started.append(("broker", broker_pid))
        bootstrap = f"127.0.0.1:{broker_port}"
        log.info("tansu broker ready on %s (%.1f s)", bootstrap, time.monotonic() - t0)
        connect_pid = connect.start(
            self.data_dir / "connect", bootstrap, connect_port, logs / "connect.log"
        )
        started.append(("kafka connect", connect_pid))
        connect_url = f"http://127.0.0.1:{connect_port}"
        log.info("kafka connect ready at %s (%.1f s)", connect_url, time.monotonic() - t0)
        return StackEndpoints(
            database_url=postgres.dsn(pg_port).replace("postgresql://", "postgresql+psycopg://"),
            kafka_bootstrap=bootstrap,
            connect_url=connect_url,
            postgres_pid=pg_pid,
            broker_pid=broker_pid,
            connect_pid=connect_pid,
        )

    def down(self) -> None:
        endpoints = self.endpoints()
        if endpoints is None:
            log.info("no stack state in %s; nothing to stop", self.data_dir)
            return
        # Connect first so that Debezium flushes its offsets while broker and database are up.
        stop_pid(endpoints.connect_pid, what="kafka connect", timeout_s=30)
        stop_pid(endpoints.broker_pid, what="broker", timeout_s=10)
        stop_pid(endpoints.postgres_pid, what="postgres", sig=signal.SIGINT, timeout_s=30)
        self.state_path.unlink(missing_ok=True)

    def status(self) -> dict[str, object]:
        endpoints = self.endpoints()
        if endpoints is None:
            return {"running": False, "data_dir": str(self.data_dir)}
        return {
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
        stop_pid(endpoints.connect_pid, what="kafka connect", sig=sig, timeout_s=60)
        port = int(endpoints.connect_url.rsplit(":", 1)[1])
        wait_port_closed(port, "kafka connect")
        pid = connect.start(self.data_dir / "connect", endpoints.kafka_bootstrap, port,
                            self.data_dir / "logs" / "connect.log")
        return self._save(replace(endpoints, connect_pid=pid))

    def restart_postgres(self) -> StackEndpoints:
        """Fast-shutdown Postgres and start it again on the same port and data directory."""
        endpoints = self._require_endpoints()
        stop_pid(endpoints.postgres_pid, what="postgres", sig=signal.SIGINT, timeout_s=60)
        port = int(endpoints.database_url.rsplit(":", 1)[1].split("/")[0])
        wait_port_closed(port, "postgres")
        pid = postgres.start(self.data_dir / "postgres", port,
                             self.data_dir / "logs" / "postgres.log")
        return self._save(replace(endpoints, postgres_pid=pid))

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
        return all(
            pid_alive(pid)
            for pid in (endpoints.postgres_pid, endpoints.broker_pid, endpoints.connect_pid)
        )

    def _reset_data_dir(self) -> None:
        # The broker keeps topics in memory only; a kept database would hold a replication
        # slot whose Kafka-side offsets are gone. Every `up` therefore starts from empty.
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)
        self.data_dir.mkdir(parents=True)


__all__ = ["LocalStack", "StackEndpoints", "StackError"]
