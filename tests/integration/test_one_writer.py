"""One writer per projection, as operators meet it: CLI hosts of one projection while sales
flow. A rolling deploy (a second host started with ``--standby`` beside the first, which is
SIGTERMed after a while, and a third started by mistake, refused); a zombie (the writer
frozen with SIGSTOP while a task of it is inside its Kafka commit, past its lease, while the
standby takes over, then SIGCONTed); a commit held by an operator's row lock for 60 s. Each
ends by reading the KTable topic back to its end: every key's version rises record after
record, and the read model and the KTable hold exactly the sales the store holds (nothing
lost, nothing applied twice)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg

from eventfold.contract import libpq_url
from eventfold.local_stack.process import free_port, stop_pid
from tests.pipeline_helpers import (
    folded_total,
    ktable_totals,
    log_says,
    rows,
    sales_totals_of_the_store,
    selling,
    stop_processes,
    wait_for,
    wait_for_more,
)
from tests.support.campaign.checkers import read_ktable
from tests.support.cli import eventfold, scrape, stack_env, total

LEASE_S = 5


def _host(env: dict[str, str], name: str, log: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run", name,
                             *flags], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _exact_at_the_end(settings, engine, name: str, unique: str, sent: int) -> None:
    expected = sales_totals_of_the_store(engine, unique)
    assert sum(expected.values()) == sent * (sent + 1) // 2
    wait_for(lambda: folded_total(engine, name, unique) == sum(expected.values()),
             "the read model to hold every sale", timeout_s=120)
    assert {k: int(v) for k, v in rows(engine, name, unique, "total").items()} == expected
    wait_for(lambda: ktable_totals(settings, name, unique) == expected,
             "the KTable to hold every sale", timeout_s=60)
    # Read to each partition's end (or fail): every key's version rises record after record.
    assert read_ktable(settings.kafka, f"eventfold.ktable.{name}").went_back == []


def _drill(stack_settings, tmp_path: Path, unique: str, **extra: str
           ) -> tuple[str, dict[str, str]]:
    """The sales app set up; the drill's projection and the environment of its hosts."""
    from examples import sales

    sales.app.runtime(stack_settings).setup()
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="tests.host_app:app",
                    EVENTFOLD_TEST_PROJECTION=unique, EVENTFOLD_WRITER_LEASE_S=str(LEASE_S),
                    EVENTFOLD_TRIGGER_INTERVAL="200 milliseconds", **extra)
    return f"sales_totals_{unique}", env


def _standby_beside(engine, env: dict[str, str], name: str, unique: str, log: Path
                    ) -> subprocess.Popen:
    """Once the first host folds, a second one started with ``--standby``, standing by."""
    wait_for(lambda: folded_total(engine, name, unique) > 0, "the first host to fold",
             timeout_s=180)
    standby = _host(env, name, log, "--standby")
    wait_for(lambda: log_says(log, "standing by while"), "the second host to stand by",
             timeout_s=180)
    return standby


def test_a_rolling_deploy_hands_the_projection_over_and_a_second_writer_is_refused(
        stack_settings, engine, tmp_path, unique) -> None:
    name, env = _drill(stack_settings, tmp_path, unique)
    old_log, new_log = tmp_path / "old.log", tmp_path / "new.log"
    old = _host(env, name, old_log)
    new: subprocess.Popen | None = None
    try:
        with selling(stack_settings, unique) as sent:
            new = _standby_beside(engine, env, name, unique, new_log)
            refused = eventfold("projection", "run", name, env=env)
            assert refused.returncode == 1, refused.stdout + refused.stderr
            assert f"projection {name} is written by" in refused.stderr
            assert "--standby" in refused.stderr
            folded_before = folded_total(engine, name, unique)
            wait_for(lambda: folded_total(engine, name, unique) > folded_before,
                     "the writer to fold on beside its standby", timeout_s=60)
            stopped_at = time.monotonic()
            stop_pid(old.pid, what="the old host")
            wait_for(lambda: log_says(new_log, "v1: streaming from"),
                     "the standby to take the projection over and stream", timeout_s=30)
            handover_s = time.monotonic() - stopped_at
            assert handover_s <= 10, f"handover took {handover_s:.1f} s"
            folded_after = folded_total(engine, name, unique)
            wait_for(lambda: folded_total(engine, name, unique) > folded_after,
                     "the new host to fold what keeps coming", timeout_s=60)
        _exact_at_the_end(stack_settings, engine, name, unique, sent())
        assert log_says(old_log, "writer lease let go")
    finally:
        stop_processes((old, new), what="a projection host")


def test_a_zombie_writer_is_fenced_and_stands_by(
        stack_settings, engine, tmp_path, unique) -> None:
    """The writer's process frozen while one of its Spark tasks is inside its Kafka commit
    (its task paused at ``task.committing``, then the driver SIGSTOPped: a VM pause): the
    standby takes over once the server ended the frozen task's session, fences every slot
    the writer's tasks said they use (the writer runs four tasks a batch, the standby one,
    so only the fencing reaches the frozen task's slot), and writes. Woken, the writer's
    task finds its transaction aborted, and the writer stands by. No key's version goes
    back in the KTable; everything is exact."""
    name, env = _drill(stack_settings, tmp_path, unique, EVENTFOLD_DRIVER_BATCH_MAX_ROWS="0")
    zombie_log, standby_log = tmp_path / "zombie.log", tmp_path / "standby.log"
    pause = tmp_path / "pause-a-task"
    zombie = _host({**env, "EVENTFOLD_SPARK_MASTER": "local[4]",
                    "EVENTFOLD_PAUSE_AT": "task.committing", "EVENTFOLD_PAUSE_WHEN": str(pause)},
                   name, zombie_log)
    standby: subprocess.Popen | None = None
    try:
        with selling(stack_settings, unique) as sent:
            standby = _standby_beside(engine, {**env, "EVENTFOLD_SPARK_MASTER": "local[1]"},
                                      name, unique, standby_log)
            pause.touch()
            wait_for(lambda: not pause.exists(), "a task of the writer to pause in its commit",
                     timeout_s=60)
            zombie.send_signal(signal.SIGSTOP)
            try:
                wait_for(lambda: log_says(standby_log, "this runner writes it"),
                         "the standby to take over from the frozen writer", timeout_s=60)
                taken = folded_total(engine, name, unique)
                wait_for(lambda: folded_total(engine, name, unique) > taken,
                         "the standby to fold", timeout_s=60)
            finally:
                for pid in (zombie.pid, *descendants(zombie.pid)):
                    os.kill(pid, signal.SIGCONT)
            wait_for(lambda: log_says(zombie_log, "lost its writer lease"),
                     "the zombie to find itself fenced", timeout_s=60)
            wait_for(lambda: log_says(zombie_log, "standing by to take it over again"),
                     "the zombie to stand by", timeout_s=60)
            wait_for_more(sent, 100, "after the zombie woke")
        _exact_at_the_end(stack_settings, engine, name, unique, sent())
        assert zombie.poll() is None, "the fenced host stands by, it does not exit"
    finally:
        stop_processes((zombie, standby), what="a projection host")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a driver's JVM, its Python workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_a_commit_held_by_a_row_lock_is_noticed_and_the_projection_recovers(
        stack_settings, engine, tmp_path, unique) -> None:
    """Drill (c): an operator's session holds the projection's checkpoint row, past the
    host's stall bound and again past its doubled bound. The host notices within its stall
    bound (log, ``eventfold_projection_stalled``), starts the projection again, and once the
    lock goes it folds on: exact, nothing back in time."""
    metrics_port = free_port()
    name, env = _drill(stack_settings, tmp_path, unique, EVENTFOLD_PROJECTION_STALL_S="3",
                       EVENTFOLD_METRICS_PORT=str(metrics_port))
    log = tmp_path / "host.log"
    host = _host(env, name, log)
    metrics = f"http://127.0.0.1:{metrics_port}"

    def stalled() -> float:
        try:
            return total(scrape(metrics), "eventfold_projection_stalled", projection=name)
        except httpx.TransportError:
            return -1

    try:
        with selling(stack_settings, unique) as sent:
            wait_for(lambda: folded_total(engine, name, unique) > 0, "the host to fold",
                     timeout_s=180)
            with psycopg.connect(libpq_url(stack_settings.database_url)) as operator:
                operator.execute("SELECT 1 FROM projection_checkpoints WHERE projection = %s "
                                 "FOR UPDATE", (name,))
                locked_at = time.monotonic()
                wait_for(lambda: stalled() == 1, "the host to report the stall", timeout_s=45)
                noticed_s = time.monotonic() - locked_at
                assert noticed_s <= 40, f"the stall was noticed after {noticed_s:.0f} s"
                assert log_says(log, f"projection {name} stalled")
                # Held on past the next run's bound (twice the first): it stalls again.
                wait_for(lambda: log_says(log, "stalled: its batch or look has gone on")
                         and (log.read_text().count(f"projection {name} stalled") >= 2),
                         "the next run to stall on the lock too", timeout_s=60)
                operator.rollback()
            released_at = time.monotonic()
            behind = folded_total(engine, name, unique)
            wait_for(lambda: folded_total(engine, name, unique) > behind and stalled() == 0,
                     "the projection to fold again", timeout_s=60)
            recovered_s = time.monotonic() - released_at
            assert recovered_s <= 60, f"recovered {recovered_s:.0f} s after the lock went"
        _exact_at_the_end(stack_settings, engine, name, unique, sent())
    finally:
        stop_pid(host.pid, what="a projection host")
