"""A Spark standalone cluster on loopback: a master and its workers, started from the installed
pyspark's ``spark-class`` (no download), each a process of its own that can fail alone.

State (ports, PIDs) lives in ``<data_dir>/spark.json`` like the stack's own, so ``stack down``
in another process stops what ``stack up --cluster`` started. Sized for a 2-core machine:
each worker offers one core and ``memory`` to executors.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

import requests

from eventfold.local_stack.process import (
    StackError,
    descendants,
    free_port,
    pid_alive,
    port_is_open,
    spawn,
    stop_pid,
    wait_until,
)

log = logging.getLogger(__name__)

STATE_FILE = "spark.json"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


@dataclass(frozen=True)
class SparkNode:
    name: str
    pid: int
    port: int
    web_port: int

    @property
    def alive(self) -> bool:
        return pid_alive(self.pid)


@dataclass(frozen=True)
class SparkClusterState:
    master: SparkNode
    workers: tuple[SparkNode, ...]

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master.port}"

    @property
    def nodes(self) -> tuple[SparkNode, ...]:
        return (self.master, *self.workers)


class SparkCluster:
    """One master and ``workers`` workers under ``data_dir``."""

    def __init__(self, data_dir: Path, workers: int = 2, cores: int = 1,
                 memory: str = "3g") -> None:
        self.data_dir = data_dir.resolve()
        self.worker_count = workers
        self.cores = cores
        self.memory = memory

    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    def state(self) -> SparkClusterState | None:
        try:
            raw = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return None
        return SparkClusterState(SparkNode(**raw["master"]),
                                 tuple(SparkNode(**w) for w in raw["workers"]))

    def up(self) -> SparkClusterState:
        """Start the master and the workers that are not running; wait until every worker
        has registered with the master."""
        state = self.state()
        if state is not None and all(node.alive for node in state.nodes):
            return state
        if state is not None:
            self.down()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        started: list[SparkNode] = []
        try:
            master = self._start_master()
            started.append(master)
            for index in range(self.worker_count):
                started.append(self._start_worker(index, master))
            state = SparkClusterState(master, tuple(started[1:]))
            self._wait_registered(state)
        except BaseException:
            for node in reversed(started):
                stop_pid(node.pid, what=f"spark {node.name}")
            raise
        self.state_path.write_text(json.dumps(asdict(state), indent=2))
        log.info("spark cluster ready: %s, %d workers of %d core(s) and %s each",
                 state.master_url, len(state.workers), self.cores, self.memory)
        return state

    def down(self) -> None:
        state = self.state()
        if state is None:
            return
        for node in reversed(state.nodes):
            stop_pid(node.pid, what=f"spark {node.name}", timeout_s=30)
        self.state_path.unlink(missing_ok=True)

    def kill_worker(self, index: int, sig: int = signal.SIGKILL) -> SparkNode:
        """Stop worker ``index`` with ``sig`` (SIGKILL: a crashed machine) and its executors,
        which run in processes of their own."""
        state = self.state()
        if state is None:
            raise StackError(f"no Spark cluster running in {self.data_dir}")
        worker = state.workers[index]
        for child in descendants(worker.pid):
            _signal(child, sig)
        _signal(worker.pid, sig)
        return worker

    def restart_worker(self, index: int) -> SparkClusterState:
        """Start worker ``index`` again (after ``kill_worker``) and wait until it registered."""
        state = self.state()
        if state is None:
            raise StackError(f"no Spark cluster running in {self.data_dir}")
        workers = list(state.workers)
        workers[index] = self._start_worker(index, state.master)
        state = SparkClusterState(state.master, tuple(workers))
        self._wait_registered(state)
        self.state_path.write_text(json.dumps(asdict(state), indent=2))
        return state

    def alive_workers(self, state: SparkClusterState) -> int:
        """Workers the master sees ALIVE (from its web UI's JSON)."""
        try:
            reply = requests.get(f"http://127.0.0.1:{state.master.web_port}/json/", timeout=5)
            return sum(1 for w in reply.json().get("workers", []) if w.get("state") == "ALIVE")
        except (requests.RequestException, ValueError):
            return 0

    def _start_master(self) -> SparkNode:
        port, web_port = free_port(), free_port()
        pid = self._spawn("master", [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port),
                                     "--webui-port", str(web_port)])
        log_path = self._log("master")
        wait_until(lambda: port_is_open(port), what="spark master", timeout_s=60, pid=pid,
                   log_path=log_path)
        return SparkNode("master", pid, port, web_port)

    def _start_worker(self, index: int, master: SparkNode) -> SparkNode:
        name = f"worker-{index + 1}"
        port, web_port = free_port(), free_port()
        work_dir = self.data_dir / name
        work_dir.mkdir(parents=True, exist_ok=True)
        pid = self._spawn(name, [
            WORKER_CLASS, f"spark://127.0.0.1:{master.port}", "--host", "127.0.0.1",
            "--port", str(port), "--webui-port", str(web_port), "--cores", str(self.cores),
            "--memory", self.memory, "--work-dir", str(work_dir)])
        wait_until(lambda: port_is_open(port), what=f"spark {name}", timeout_s=60, pid=pid,
                   log_path=self._log(name))
        return SparkNode(name, pid, port, web_port)

    def _wait_registered(self, state: SparkClusterState) -> None:
        wait_until(lambda: self.alive_workers(state) >= len(state.workers),
                   what=f"{len(state.workers)} spark workers to register", timeout_s=60,
                   pid=state.master.pid, log_path=self._log("master"))

    def _spawn(self, name: str, arguments: list[str]) -> int:
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
               "SPARK_LOG_DIR": str(self.data_dir / "logs")}
        process = spawn([str(spark_home() / "bin" / "spark-class"), *arguments], self._log(name),
                        env=env, cwd=self.data_dir)
        return process.pid

    def _log(self, name: str) -> Path:
        return self.data_dir / "logs" / f"spark-{name}.log"


def spark_home() -> Path:
    """The installed pyspark's Spark home (its ``bin/spark-class`` and jars)."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
