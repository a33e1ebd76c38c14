"""Read API benchmark on a stack of its own.

A 100,000-row read model and a 100,000-key KTable, both built by the real pipeline (events ->
Debezium -> broker -> Spark fold), served by ``eventfold serve reads`` in its own process.
wrk drives 50 concurrent connections at random keys: get-by-key on the read model and on the
KTable, and a filtered, sorted list page. KTable restore is the served instance's own
measurement (records read / time to restored). Prints figures, then one JSON line.

    .venv/bin/python -m bench.read_api [--keys 100000] [--seconds 15] [--workers 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import requests

from bench.common import WrkResult, own_stack, run_wrk
from eventfold.config import Settings
from eventfold.contract import libpq_url
from eventfold.local_stack.process import free_port, stop_pid
from eventfold.projections.execution.spark import spark_session
from eventfold.projections.run_settings import RunnerSettings
from eventfold.projections.runner import ProjectionRunner
from eventfold.write_model import EventStore, StreamAppend
from eventfold.write_model.persistence.store import NewEvent
from examples.inventory import app, inventory_totals

log = logging.getLogger("bench.read_api")
CONNECTIONS = 50
TARGET_REQ_PER_S = 2_000
TARGET_P99_MS = 50
TARGET_RESTORE_PER_S = 100_000
PAGE = "/read-models/inventory_totals/rows?sort=-quantity&limit=50"
DEEP_PAGE = 1_000
LUA = """
math.randomseed(os.time())
request = function()
  return wrk.format("GET", string.format("{path}", math.random(0, {last})))
end
"""


def write_products(settings: Settings, keys: int, per_transaction: int = 500) -> None:
    """One StockReceived per product, ``per_transaction`` streams per unit of work."""
    store = EventStore.from_url(settings.database_url)
    rng = random.Random(11)

    def one(start: int) -> None:
        store.append_many([
            StreamAppend("Product", f"rb-{i:06d}", 0, [NewEvent(
                "StockReceived", {"product": f"rb-{i:06d}", "quantity": rng.randint(1, 100)})])
            for i in range(start, min(start + per_transaction, keys))])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(0, keys, per_transaction)))


def build_read_model(settings: Settings, keys: int) -> None:
    """Catch the projection up until every product has its row (CDC is asynchronous)."""
    spark = spark_session("local[2]", app_name="bench-read-api")
    deadline = time.monotonic() + 600
    try:
        while rows(settings) < keys:
            if time.monotonic() > deadline:
                raise RuntimeError(f"read model has {rows(settings)} of {keys} rows")
            runner = ProjectionRunner(spark, inventory_totals, RunnerSettings(
                kafka=settings.kafka, database_url=settings.database_url,
                trigger_interval="1 second"))
            try:
                runner.catch_up(timeout_s=300)
            finally:
                runner.close()
    finally:
        spark.stop()


def rows(settings: Settings) -> int:
    with psycopg.connect(libpq_url(settings.database_url)) as conn:
        found = conn.execute("SELECT to_regclass('inventory_totals')").fetchone()
        if found is None or found[0] is None:
            return 0
        return int(conn.execute("SELECT count(*) FROM inventory_totals").fetchone()[0])


def start_read_api(settings: Settings, workers: int, log_path: Path) -> tuple[int, str]:
    port = free_port()
    env = {**os.environ, "EVENTFOLD_APP": "examples.inventory:app",
           "EVENTFOLD_DATABASE_URL": settings.database_url,
           "EVENTFOLD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "EVENTFOLD_CONNECT_URL": settings.connect_url,
           "EVENTFOLD_READ_API_PORT": str(port), "EVENTFOLD_HTTP_WORKERS": str(workers),
           "EVENTFOLD_REQUEST_LOG": "false", "EVENTFOLD_READ_POOL_SIZE": "4",
           "EVENTFOLD_STATE_DIR": str(log_path.parent / "state")}
    with log_path.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "serve", "reads"],
                                   env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    return process.pid, f"http://127.0.0.1:{port}"


def wait_ready(url: str, pid: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):
            pass  # not listening yet, or a worker too busy restoring to answer in time
        if not Path(f"/proc/{pid}").exists():
            raise RuntimeError("the read API exited; see its log")
        time.sleep(0.05)
    raise RuntimeError("the read API did not become ready")


def restored_figures(url: str) -> dict[str, float]:
    """The restore figures of a worker that has restored (with several workers, another may
    still be restoring when the first says ready)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        restore = requests.get(f"{url}/ktables", timeout=10).json()["ktables"][0]["restore"]
        if restore["restored"]:
            return restore
        time.sleep(0.1)
    raise RuntimeError("no worker finished restoring its KTable")


def wrk(url: str, path: str, last_key: int, seconds: int, workdir: Path) -> WrkResult:
    """``path`` may hold a %06d that wrk fills with a random key index."""
    return run_wrk(url, LUA.replace("{path}", path).replace("{last}", str(last_key)),
                   CONNECTIONS, seconds, workdir)


def cursor_at_depth(url: str, depth: int) -> str:
    """The cursor of page ``depth + 1`` of ``PAGE`` over every row, walked there."""
    cursor = ""
    for _ in range(depth):
        response = requests.get(f"{url}{PAGE}&quantity.gte=0{cursor and '&cursor=' + cursor}",
                                timeout=60)
        response.raise_for_status()
        cursor = response.json()["next_cursor"]
        if cursor is None:
            raise RuntimeError(f"fewer than {depth} pages: use more --keys")
    return cursor


def report(name: str, result: WrkResult) -> None:
    print(f"{name}: {result.requests_per_s:,.0f} req/s "
          f"({result.requests_per_s / TARGET_REQ_PER_S:.2f}x of {TARGET_REQ_PER_S:,}), "
          f"p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms "
          f"(target <= {TARGET_P99_MS}), non-2xx {result.errors}")


def run(settings: Settings, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    app.runtime(settings).setup()
    started = time.perf_counter()
    write_products(settings, args.keys)
    print(f"wrote {args.keys:,} events in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    build_read_model(settings, args.keys)
    print(f"read model and KTable built by the pipeline in {time.perf_counter() - started:.1f} s")
    pid, url = start_read_api(settings, args.workers, workdir / "read-api.log")
    try:
        wait_ready(url, pid)
        restore = restored_figures(url)
        print(f"KTable restore: {restore['records']:,} records in {restore['seconds']:.2f} s = "
              f"{restore['records_per_s']:,} records/s "
              f"({restore['records_per_s'] / TARGET_RESTORE_PER_S:.2f}x of 100,000)")
        last = args.keys - 1
        wrk(url, "/read-models/inventory_totals/rows/rb-%06d", last, 3, workdir)  # warm-up
        by_key = wrk(url, "/read-models/inventory_totals/rows/rb-%06d", last, args.seconds,
                     workdir)
        report("read model get-by-key", by_key)
        ktable = wrk(url, "/ktables/inventory_totals/entries/rb-%06d", last, args.seconds,
                     workdir)
        report("KTable get-by-key", ktable)
        page = wrk(url, f"{PAGE}&quantity.gte=%d", 99, args.seconds, workdir)
        report("filtered, sorted list page (50 rows)", page)
        deep = wrk(url, f"{PAGE}&quantity.gte=0&cursor={cursor_at_depth(url, DEEP_PAGE)}", 0,
                   args.seconds, workdir)
        report(f"the same page at depth {DEEP_PAGE:,}", deep)
        print(f"depth {DEEP_PAGE:,} p99 / depth 1 p99: {deep.p99_ms / page.p99_ms:.2f} "
              "(target <= 1.5)")
        count = wrk(url, "/read-models/inventory_totals/count?quantity.gte=%d", 99,
                    args.seconds, workdir)
        report("filtered count", count)
    finally:
        stop_pid(pid, what="read API")
    return {
        "keys": args.keys, "connections": CONNECTIONS, "http_workers": args.workers,
        "get_by_key_req_per_s": round(by_key.requests_per_s),
        "get_by_key_p50_ms": by_key.p50_ms, "get_by_key_p99_ms": by_key.p99_ms,
        "ktable_get_req_per_s": round(ktable.requests_per_s),
        "ktable_get_p50_ms": ktable.p50_ms, "ktable_get_p99_ms": ktable.p99_ms,
        "list_page_req_per_s": round(page.requests_per_s), "list_page_p99_ms": page.p99_ms,
        "list_page_deep_req_per_s": round(deep.requests_per_s),
        "list_page_deep_p99_ms": deep.p99_ms,
        "count_req_per_s": round(count.requests_per_s), "count_p99_ms": count.p99_ms,
        "ktable_restore_records_per_s": restore["records_per_s"],
        "non_2xx_responses": by_key.errors + ktable.errors + page.errors + deep.errors
        + count.errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--workers", type=int, default=2, help="read API processes (each "
                        "holds the whole KTable); 2 on our 2-core machines")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with own_stack("eventfold-read-bench-") as (settings, root):
        figures = run(settings, args, root)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
