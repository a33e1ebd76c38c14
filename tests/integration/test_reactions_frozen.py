"""A process manager's runners as a deployment meets them: two ``eventfold reaction run``
processes of one process while purchases flow, the first frozen (SIGSTOP, as a long GC pause
or a frozen VM would) at the moment it holds a batch it has read (``EVENTFOLD_PAUSE_AT``, armed
by the test), then woken from outside once the second took its partitions over. Read back
from Postgres: every purchase's process started once, with one timer, whatever the frozen
runner did once awake."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

from tests.pipeline_helpers import frozen, log_says, placing, stop_processes, wait_for
from tests.support.cli import stack_env

PURCHASES = 600
"""Placed over about twelve seconds (before, while and after the first runner is frozen),
none paid within the drill: their deadlines are an hour away."""


def _deadline_runner(env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "eventfold.cli", "reaction", "run",
                             "payment_deadline"], env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)


def _processes(engine, unique: str) -> dict[str, tuple[int, int, int]]:
    """Each of this test's purchases with a process: its state's version, its pending timers
    and the changes its process view recorded."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT s.key, s.version, "
            "(SELECT count(*) FROM process_timers t WHERE t.process = s.process "
            " AND t.key = s.key), "
            "(SELECT count(*) FROM events e WHERE e.stream_id = 'payment_deadline/' || s.key) "
            "FROM process_states s WHERE s.process = 'payment_deadline' AND s.key LIKE :p"),
            {"p": f"{unique}-%"}).all()
    return {str(key): (int(version), int(timers), int(changes))
            for key, version, timers, changes in rows}


def test_a_frozen_runner_woken_after_another_took_over_applies_nothing_twice(
        stack_settings, engine, tmp_path, unique) -> None:
    from examples import fulfilment

    fulfilment.app.runtime(stack_settings).setup()
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="examples.fulfilment:app",
                    EVENTFOLD_REACTION_SESSION_TIMEOUT_S="6",
                    EVENTFOLD_REACTION_BATCH_MAX_EVENTS="20")
    zombie_log, successor_log = tmp_path / "zombie.log", tmp_path / "successor.log"
    pause = tmp_path / "pause-the-runner"
    zombie = _deadline_runner({**env, "EVENTFOLD_PAUSE_AT": "reaction.read",
                               "EVENTFOLD_PAUSE_WHEN": str(pause)}, zombie_log)
    successor: subprocess.Popen | None = None
    try:
        wait_for(lambda: log_says(zombie_log, "reading eventfold.events.Purchase"),
                 "the first runner to start reading", timeout_s=60)
        with placing(stack_settings, [fulfilment.PlacePurchase(
                purchase_id=f"{unique}-z{n}", shelf_id="any", quantity=1, pay_within_s=3600)
                for n in range(PURCHASES)], pause_s=0.02) as placed:
            wait_for(lambda: len(_processes(engine, unique)) >= 20,
                     "the first runner to act", timeout_s=60)
            pause.touch()
            wait_for(lambda: frozen(zombie.pid), "the first runner to freeze holding a batch",
                     timeout_s=30)
            try:
                frozen_at = len(_processes(engine, unique))
                successor = _deadline_runner(env, successor_log)
                # Its group session over, the frozen runner's partitions go to the other,
                # which reads them from the saved positions: the frozen batch's events too.
                wait_for(lambda: len(_processes(engine, unique)) > frozen_at + 100,
                         "the second runner to take the partitions over and act",
                         timeout_s=90)
            finally:
                zombie.send_signal(signal.SIGCONT)
        wait_for(lambda: len(_processes(engine, unique)) == PURCHASES,
                 "every purchase's process to start", timeout_s=120)
        time.sleep(2)  # a batch applied twice would land now
        processes = _processes(engine, unique)
        assert sorted(processes) == sorted(placed)
        twice = {key: counts for key, counts in processes.items() if counts != (1, 1, 1)}
        assert twice == {}, f"{len(twice)} processes changed more than once: " + str(
            dict(list(twice.items())[:5]))
        assert log_says(zombie_log, "another runner saved positions since this batch read "
                                     "from them"), "the woken runner found its batch taken"
        assert zombie.poll() is None, "the woken runner reads on"
    finally:
        stop_processes((zombie, successor), what="a process manager")
