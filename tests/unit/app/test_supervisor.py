"""The HTTP supervisor replaces a worker that dies, counts it, and gives up on workers that
cannot start, without spinning. Workers here are small Python processes of the test's own
(what a worker runs is not what is tested)."""

from __future__ import annotations

import os
import signal
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
