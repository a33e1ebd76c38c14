"""A takeover, as an operator meets it, on a stack of its own: `eventfold projection run
sales_totals` writing, a second one started with `--standby` beside it, then the writer frozen
(SIGSTOP, a VM pause) while a backlog of ``--backlog`` sales is recorded. Measures, on the
database's clock, how long after the writer's lease ended the standby committed its first
batch; then how long a mistaken third `projection run` (no --standby) takes to be refused.
Prints figures, then one JSON line.

    .venv/bin/python -m bench.takeover [--backlog 10000] [--lease-s 10]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import psycopg

from bench.common import own_stack
from eventfold.config import Settings
from eventfold.contract import libpq_url
from eventfold.local_stack.process import stop_pid
from examples import sales

NAME = "sales_totals"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=10_000)
    parser.add_argument("--lease-s", type=float, default=10.0)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="eventfold-takeover-"))
    with own_stack("eventfold-takeover-") as (settings, root):
        sales.app.runtime(settings).setup()
        env = {**os.environ, "EVENTFOLD_APP": "examples.sales:app",
               "EVENTFOLD_DATABASE_URL": settings.database_url,
               "EVENTFOLD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
               "EVENTFOLD_CONNECT_URL": settings.connect_url,
               "EVENTFOLD_STATE_DIR": str(root / "state"),
               "EVENTFOLD_WRITER_LEASE_S": str(args.lease_s)}
        bus = sales.app.runtime(settings).command_bus()
        writer = _run(env, logs / "writer.log")
        standby = None
        try:
            bus.execute(sales.RecordSale(product="warm-0", value=1))
            _wait(lambda: _committed(settings) > 0, "the writer's first batch", 300)
            standby = _run(env, logs / "standby.log", "--standby")
            _wait(lambda: "standby warm" in (logs / "standby.log").read_text(),
                  "the standby to stand by, warm", 300)
            writer.send_signal(signal.SIGSTOP)
            frozen = time.monotonic()
            time.sleep(0.5)  # a renewal the writer had sent lands
            [ended] = _query(settings, "SELECT writer_renewed_at + make_interval(secs => "
                                       "writer_lease_s) FROM projection_versions WHERE "
                                       "projection = %s")
            for n in range(args.backlog):
                bus.execute(sales.RecordSale(product=f"p-{n % 1_000}", value=n + 1))
            recorded_s = time.monotonic() - frozen
            first = _wait(lambda: _standbys_first_commit(settings, ended),
                          "the standby's first batch", 300)
            after_lease_s = (first - ended).total_seconds()
            _wait(lambda: _folded(settings) >= args.backlog + 1, "the standby to fold it all",
                  600)
            refused_s, code = _mistaken_runner(env, logs / "mistaken.log")
        finally:
            if writer.poll() is None:
                writer.send_signal(signal.SIGCONT)
            stop_pid(writer.pid, what="the writer")
            if standby is not None:
                stop_pid(standby.pid, what="the standby")
    print(f"backlog of {args.backlog:,} sales recorded in {recorded_s:.1f} s while the "
          f"writer was frozen (lease {args.lease_s:g} s)")
    print(f"standby's first batch committed {after_lease_s:.1f} s after the writer's lease "
          "ended (database clock)")
    print(f"a mistaken `projection run` refused in {refused_s:.1f} s (exit code {code})")
    print(f"logs: {logs}")
    print(json.dumps({"backlog_events": args.backlog, "lease_s": args.lease_s,
                      "standby_first_write_after_lease_s": round(after_lease_s, 2),
                      "mistaken_runner_refused_s": round(refused_s, 2)}))


def _run(env: dict[str, str], log: Path, *flags: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run", NAME,
                             *flags], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _mistaken_runner(env: dict[str, str], log: Path) -> tuple[float, int]:
    started = time.monotonic()
    mistaken = _run(env, log)
    code = mistaken.wait(timeout=300)
    return time.monotonic() - started, code


def _query(settings: Settings, sql: str) -> tuple:  # type: ignore[type-arg]
    with psycopg.connect(libpq_url(settings.database_url)) as conn:
        row = conn.execute(sql, (NAME,)).fetchone()
    return tuple(row) if row else ()


def _committed(settings: Settings) -> int:
    found = _query(settings, "SELECT events_applied FROM projection_checkpoints WHERE "
                             "projection = %s")
    return int(found[0]) if found else 0


def _folded(settings: Settings) -> int:
    return _committed(settings)


def _standbys_first_commit(settings: Settings, lease_ended: datetime) -> datetime | None:
    """When the standby's first batch committed (the database's clock), once it has."""
    found = _query(settings, """
        SELECT v.writer_epoch, c.updated_at FROM projection_versions v
        JOIN projection_checkpoints c ON c.projection = v.projection
         AND c.version = v.active_version WHERE v.projection = %s""")
    if not found or found[0] < 2 or found[1] <= lease_ended:
        return None
    return found[1]  # type: ignore[no-any-return]


T = TypeVar("T")


def _wait(condition: Callable[[], T | None], what: str, timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (found := condition()):
            return found
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


if __name__ == "__main__":
    main()
