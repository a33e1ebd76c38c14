"""The seeds' threshold notification end to end (``examples/sales_targets.py``): sales flow
while ``projection run --all`` (the ``sales_totals`` projection and the
``notify_target_reached`` reaction in one process) dies after a reaction batch's commands
went out and before its positions were saved, and is SIGKILLed from outside once; then the
event store is read back: one notification per crossing, a delisted product's second
crossing notified too."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import text

from eventfold.local_stack.process import stop_pid
from tests.pipeline_helpers import wait_for
from tests.support.cli import eventfold, stack_env

PRODUCTS = 12
SALES_EACH = 20
SALE_VALUE = 250
"""With the example's target of 2,000, a product crosses at its 8th sale."""
DELISTED_AFTER = 10
"""The first four products are delisted after their 10th sale and cross again by their 20th."""
RELISTED = 4


def _host(env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run",
                             "--all"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _log_matches(log: Path, pattern: str) -> bool:
    return log.exists() and re.search(pattern, log.read_text(errors="replace")) is not None


def _notices(engine, unique: str) -> dict[str, list[int]]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT stream_id, (data->>'total')::int FROM events WHERE event_type = "
            "'TargetNotified' AND stream_id LIKE :p ORDER BY stream_id, stream_version"),
            {"p": f"{unique}-%"}).all()
    found: dict[str, list[int]] = {}
    for stream, total in rows:
        found.setdefault(str(stream).removesuffix("/notices"), []).append(int(total))
    return found


def _sell(settings, products: list[str]) -> threading.Thread:
    from examples import sales

    def sell() -> None:
        bus = sales.app.runtime(settings).command_bus()
        for n in range(SALES_EACH):
            for index, product in enumerate(products):
                if n == DELISTED_AFTER and index < RELISTED:
                    bus.execute(sales.DelistProduct(product=product))
                bus.execute(sales.RecordSale(product=product, value=SALE_VALUE))
                time.sleep(0.1)

    selling = threading.Thread(target=sell, daemon=True)
    selling.start()
    return selling


def test_a_crossing_is_notified_once_through_crashes(stack_settings, engine, tmp_path,
                                                     unique) -> None:
    from examples import sales_targets

    sales_targets.app.runtime(stack_settings).setup()
    products = [f"{unique}-product{n}" for n in range(PRODUCTS)]
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="examples.sales_targets:app",
                    EVENTFOLD_REACTION_BATCH_MAX_EVENTS="2")
    # Other tests' sales cross too, into the same topic: this drill acts on its own alone.
    skipped = eventfold("reaction", "reset", "notify_target_reached", "--to-end", env=env)
    assert skipped.returncode == 0, skipped.stderr
    logs = [tmp_path / f"host{n}.log" for n in range(3)]
    host = _host({**env, "EVENTFOLD_CRASH_AT": "reaction.sent",
                  "EVENTFOLD_CRASH_ONCE": str(tmp_path / "crashed")}, logs[0])
    try:
        wait_for(lambda: _log_matches(logs[0], r"reaction notify_target_reached: reading")
                 and _log_matches(logs[0], r"sales_totals v\d+: streaming from"),
                 "the host to stream and react", timeout_s=180)
        selling = _sell(stack_settings, products)
        # 1: dies after a reaction batch's commands went out, its positions not saved.
        assert host.wait(timeout=120) == 86, logs[0].read_text()[-3000:]
        notified = sum(map(len, _notices(engine, unique).values()))
        host = _host(env, logs[1])
        # 2: SIGKILLed from outside once it has notified again.
        wait_for(lambda: sum(map(len, _notices(engine, unique).values())) > notified,
                 "the second host to notify", timeout_s=180)
        host.send_signal(signal.SIGKILL)
        host.wait(timeout=30)
        host = _host(env, logs[2])
        selling.join(timeout=120)
        expected = {p: 2 if n < RELISTED else 1 for n, p in enumerate(products)}
        wait_for(lambda: all(len(_notices(engine, unique).get(p, ())) >= n
                             for p, n in expected.items()),
                 "every crossing to be notified", timeout_s=240)
        time.sleep(3)  # a crossing notified twice would land now
        notices = _notices(engine, unique)
        assert {p: len(t) for p, t in notices.items()} == expected
        assert all(total >= 2000 for totals in notices.values() for total in totals)
        assert any(_log_matches(log, "answered from the command log") for log in logs[1:]), (
            "the batch the first host sent and did not save was sent again and answered from "
            "the command log")
    finally:
        stop_pid(host.pid, what="a projection host")
