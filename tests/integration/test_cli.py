"""The CLI as people run it: `eventfold stack up|status|down`, and a streaming projection
that stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from local_stack import LocalStack
from local_stack.process import pid_alive, stop_pid
from projections.status import projection_status


def eventfold(*args: str, env: dict[str, str],
              timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eventfold.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_stack_up_status_down(tmp_path) -> None:
    env = {**os.environ, "EVENTFOLD_STACK_DIR": str(tmp_path / "stack")}
    try:
        up = eventfold("stack", "up", env=env)
        assert up.returncode == 0, up.stderr[-2000:]
        assert "export EVENTFOLD_DATABASE_URL=postgresql+psycopg://" in up.stdout
        status = json.loads(eventfold("stack", "status", env=env).stdout)
        assert status["running"] is True
        pids = [c["pid"] for c in status["components"].values()]
        assert all(pid_alive(pid) for pid in pids)
        down = eventfold("stack", "down", env=env)
        assert down.returncode == 0
        assert not any(pid_alive(pid) for pid in pids)
        assert json.loads(eventfold("stack", "status", env=env).stdout)["running"] is False
    finally:
        LocalStack(tmp_path / "stack").down()  # by PID, whatever happened above


def test_streaming_projection_stops_cleanly_on_sigterm(inventory_app, stack_settings,
                                                       tmp_path, unique) -> None:
    env = {**os.environ, "EVENTFOLD_DATABASE_URL": stack_settings.database_url,
           "EVENTFOLD_KAFKA_BOOTSTRAP": stack_settings.kafka_bootstrap,
           "EVENTFOLD_CONNECT_URL": stack_settings.connect_url,
           "EVENTFOLD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
           "EVENTFOLD_TRIGGER_INTERVAL": "200 milliseconds"}
    from examples.inventory import ReceiveStock, inventory_totals

    inventory_app.command_bus(stack_settings).execute(ReceiveStock(product=unique, quantity=4))
    runner = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run",
                               "inventory_totals"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            status = projection_status(inventory_totals, stack_settings.database_url,
                                       stack_settings.kafka_bootstrap)
            if status.lag == 0 and status.last_batch_at is not None:
                break
            assert runner.poll() is None, runner.stdout.read() if runner.stdout else ""
            time.sleep(0.5)
        assert status.lag == 0
        runner.send_signal(signal.SIGTERM)
        output, _ = runner.communicate(timeout=90)
        assert runner.returncode == 0, output[-3000:]
        assert "stopping after the current batch" in output
        assert "stopped after" in output
    finally:
        stop_pid(runner.pid, what="projection run")
