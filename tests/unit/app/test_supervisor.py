"""The HTTP supervisor replaces a worker that dies, counts it, and gives up on workers that
cannot start, without spinning. Workers here are small Python processes of the test's own
(what a worker runs is not what is tested)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from eventfold import supervisor
from eventfold.local_stack.process import stop_pid
from eventfold.metrics import WorkerRestarts
from eventfold.supervisor import Supervisor, read_restarts


def _supervisor(tmp_path: Path, worker: str, workers: int = 2) -> Supervisor:
    made = Supervisor("unused:app", "127.0.0.1", 0, workers, tmp_path)
    made.command = [sys.executable, "-c", worker]
    return made


def _pids(made: Supervisor) -> list[int]:
    return [slot.process.pid for slot in made.slots if slot.process is not None
            and slot.process.poll() is None]


def _wait(condition, what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_killed_worker_is_replaced_logged_and_counted(tmp_path, caplog) -> None:
    made = _supervisor(tmp_path, "import time; time.sleep(600)")
    runner = threading.Thread(target=made.run)
    runner.start()
    try:
        _wait(lambda: len(_pids(made)) == 2, "two workers")
        victim = _pids(made)[0]
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: len(_pids(made)) == 2 and victim not in _pids(made), "a new worker")
        assert read_restarts(tmp_path) == {"signal SIGKILL": 1}
        assert "exited (signal SIGKILL)" in caplog.text and "starting another" in caplog.text
        samples = [s for family in WorkerRestarts(tmp_path).collect() for s in family.samples]
        assert [(s.name, s.labels, s.value) for s in samples] == [
            ("eventfold_http_worker_restarts_total", {"exit": "signal SIGKILL"}, 1)]
    finally:
        made.stop(signal.SIGTERM)
        runner.join(30)
        for pid in _pids(made):
            stop_pid(pid, what="worker", timeout_s=10)
    assert not runner.is_alive()


def test_workers_that_cannot_start_are_given_up_on_after_pauses(tmp_path, monkeypatch
                                                                ) -> None:
    monkeypatch.setattr(supervisor, "FIRST_PAUSE_S", 0.05)
    made = _supervisor(tmp_path, "import sys; sys.exit(3)", workers=1)
    started = time.monotonic()
    assert made.run() == 1
    # five pauses (0.05, 0.1, 0.2, 0.4, 0.8 s) between six quick deaths, no spinning
    assert time.monotonic() - started >= 1.5
    assert read_restarts(tmp_path) == {"code 3": supervisor.GIVE_UP_AFTER}


def test_sigterm_stops_every_worker_and_returns_0(tmp_path) -> None:
    made = _supervisor(tmp_path, "import time; time.sleep(600)", workers=3)
    runner = threading.Thread(target=lambda: setattr(made, "code", made.run()))
    runner.start()
    _wait(lambda: len(_pids(made)) == 3, "three workers")
    pids = _pids(made)
    made.stop(signal.SIGTERM)
    runner.join(30)
    assert made.code == 0  # type: ignore[attr-defined]
    assert all(slot.process is not None and slot.process.poll() is not None
               for slot in made.slots), pids
    assert read_restarts(tmp_path) == {}


_PARENT = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE)
print(worker.pid, worker.stdout.readline().decode().strip(), flush=True)
time.sleep(600)
"""
_WORKER_OF = """
import os, time
from eventfold.supervisor import stop_with_the_supervisor
stop_with_the_supervisor({supervisor})
print("asked", flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie left to init is gone for this purpose: it holds no port, runs no code
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


def test_a_worker_stops_when_its_supervisor_is_killed(tmp_path) -> None:
    worker = _WORKER_OF.format(supervisor="os.getppid()")
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, worker], stdout=subprocess.PIPE)
    worker_pid = 0
    try:
        assert parent.stdout is not None
        pid_text, said = parent.stdout.readline().decode().split()
        worker_pid = int(pid_text)
        assert said == "asked"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        _wait(lambda: _gone(worker_pid), "the worker to stop with its supervisor", 10)
    finally:
        stop_pid(parent.pid, what="parent", timeout_s=10)
        if worker_pid and not _gone(worker_pid):
            stop_pid(worker_pid, what="worker", timeout_s=10)


def test_a_worker_whose_supervisor_died_before_it_asked_stops_at_once() -> None:
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER_OF.format(supervisor=os.getpid() + 10**6)])
    try:
        assert worker.wait(20) == -signal.SIGTERM
    finally:
        stop_pid(worker.pid, what="worker", timeout_s=10)
