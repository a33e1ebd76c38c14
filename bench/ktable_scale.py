"""KTables at millions of keys: a read API instance (2 HTTP workers) serving one KTable from
RocksDB state stores, beside the same instance with ``EVENTFOLD_KTABLE_STORE=memory`` (every
worker holding the whole table), in the same run.

The KTable topic is written through the projection's own sink (``TopicSink``: the records the
pipeline publishes, version headers included), N keys of small values, so that the benchmark
spends its time on the read side. For each store it prints the RSS of the instance (its
process tree, peak while restoring and after), the time from start to ready on a first start
and on a restart, get-by-key req/s with p50 and p99 (wrk, 50 connections, random keys) and
the records/s of a range scan (the whole table as NDJSON).

Not measured yet: gets forwarded to another instance and the time to serve a killed
instance's keys, which need partitions owned by instances (issue 34, items 2 and 3); their
JSON keys are null.

    .venv/bin/python -m bench.ktable_scale [--keys 5000000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests
from eventfold.local_stack.process import free_port, stop_pid
from eventfold.projections.outcome import KeyState
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.store import ReadModelStore
from eventfold.projections.state.topics import TopicSink

from bench.common import in_a_process, own_stack, tree_rss
from bench.read_api import restored_figures, wait_ready, wrk
from eventfold import migrations
from eventfold.config import Settings
from examples.inventory import inventory_totals

log = logging.getLogger("bench.ktable_scale")

KEY = "kt-%07d"
ENTRY = "/ktables/inventory_totals/entries/"
CHUNK = 50_000


def publish(settings: Settings, keys: int) -> None:
    """``keys`` states of inventory_totals v1 on its KTable topic, through its sink, and its
    read model's (empty) table and view, so that the read API is ready once restored."""
    migrations.upgrade(settings.database_url)
    catalog = ProjectionCatalog(settings.database_url)
    catalog.register(inventory_totals.name)
    catalog.close()
    store = ReadModelStore(settings.database_url, inventory_totals, 1)
    sink = TopicSink(settings.kafka, inventory_totals, 1)
    try:
        store.ensure_schema()
        with store.conn.transaction():
            store.publish_view(store.conn)
        sink.ensure_topics()
        for low in range(0, keys, CHUNK):
            sink.output.states((KEY % n, KeyState({"quantity": n % 1000}, version=1,
                                                  position=n))
                               for n in range(low, min(keys, low + CHUNK)))
            sink.output.flush()
    finally:
        sink.close()
        store.close()


class Instance:
    """``eventfold serve reads`` with two workers and a store of the given kind; the peak
    RSS of its process tree sampled while it runs."""

    def __init__(self, settings: Settings, kind: str, state_dir: Path, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "EVENTFOLD_APP": "examples.inventory:app",
               "EVENTFOLD_DATABASE_URL": settings.database_url,
               "EVENTFOLD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
               "EVENTFOLD_CONNECT_URL": settings.connect_url,
               "EVENTFOLD_READ_API_PORT": str(self.port), "EVENTFOLD_HTTP_WORKERS": "2",
               "EVENTFOLD_REQUEST_LOG": "false", "EVENTFOLD_READ_POOL_SIZE": "4",
               "EVENTFOLD_KTABLE_STORE": kind, "EVENTFOLD_STATE_DIR": str(state_dir)}
        self.started = time.monotonic()
        with log_path.open("a") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "eventfold.cli", "serve", "reads"], env=env, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.25):
            self.peak_rss = max(self.peak_rss, self.rss())

    def rss(self) -> int:
        return sum(rss for _, rss in tree_rss(self.process.pid).values())

    def ready_s(self) -> float:
        """Seconds from start until ready with the table restored (on both workers)."""
        wait_ready(self.url, self.process.pid, timeout_s=1800)
        for _ in range(20):  # each request may land on either worker
            restored_figures(self.url)
        return time.monotonic() - self.started

    def stop(self) -> None:
        self._stop.set()
        stop_pid(self.process.pid, what="serve reads", sig=signal.SIGTERM, timeout_s=120)


def range_records_per_s(url: str) -> float:
    started = time.perf_counter()
    with requests.get(f"{url}{ENTRY[:-1]}", params={"format": "ndjson"}, stream=True,
                      timeout=1800) as response:
        lines = sum(1 for line in response.iter_lines() if line)
    return lines / (time.perf_counter() - started)


def measure(settings: Settings, kind: str, keys: int, seconds: int, work_dir: Path
            ) -> dict[str, Any]:
    state_dir = work_dir / f"state-{kind}"
    shutil.rmtree(state_dir, ignore_errors=True)
    log_path = work_dir / f"reads-{kind}.log"
    first = Instance(settings, kind, state_dir, log_path)
    try:
        first_ready = first.ready_s()
        wrk(first.url, ENTRY + KEY, keys - 1, 2, work_dir)  # warm-up
        gets = wrk(first.url, ENTRY + KEY, keys - 1, seconds, work_dir)
        scanned = range_records_per_s(first.url)
        rss_after = first.rss()
        by_process = sorted(rss for _, rss in tree_rss(first.process.pid).values())
        print(f"{kind}: RSS by process once restored (MB): "
              + ", ".join(f"{rss / 1e6:,.0f}" for rss in by_process), flush=True)
    finally:
        first.stop()
    again = Instance(settings, kind, state_dir, log_path)
    try:
        restart_ready = again.ready_s()
    finally:
        again.stop()
    figures = {
        "instance_rss_mb": round(max(first.peak_rss, rss_after) / 1e6),
        "instance_rss_after_restore_mb": round(rss_after / 1e6),
        "first_start_ready_s": round(first_ready, 2),
        "restart_ready_s": round(restart_ready, 2),
        "local_get_req_per_s": round(gets.requests_per_s),
        "local_get_p50_ms": gets.p50_ms, "local_get_p99_ms": gets.p99_ms,
        "range_records_per_s": round(scanned),
    }
    print(f"{kind}: RSS {figures['instance_rss_mb']:,} MB at its peak, "
          f"{figures['instance_rss_after_restore_mb']:,} MB once restored; ready in "
          f"{first_ready:.1f} s on a first start, {restart_ready:.1f} s on a restart; gets "
          f"{gets.requests_per_s:,.0f} req/s, p50 {gets.p50_ms:.1f} ms, p99 {gets.p99_ms:.1f} "
          f"ms ({gets.errors} errors); range scan {scanned:,.0f} records/s", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=5_000_000)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with own_stack("eventfold-ktable-scale-") as (settings, work_dir):
        started = time.monotonic()
        in_a_process(publish, settings, args.keys)
        log.info("%s KTable records published in %.0f s", f"{args.keys:,}",
                 time.monotonic() - started)
        rocksdb = measure(settings, "rocksdb", args.keys, args.seconds, work_dir)
        memory = measure(settings, "memory", args.keys, args.seconds, work_dir)
    print("gets forwarded to another instance and failover: not measured (partitions owned "
          "by instances are not built yet)")
    print(json.dumps({"keys": args.keys, **rocksdb,
                      "forwarded_get_req_per_s": None, "forwarded_get_p99_ms": None,
                      "failover_s": None,
                      **{f"memory_{name}": value for name, value in memory.items()}}))


if __name__ == "__main__":
    main()
