"""Write-side benchmark: single-event commands per second through the Python API and over
HTTP, with 1 and 8 clients, beside pgbench's single-row insert TPS on the same Postgres (our
stack's own cluster, default durability), and beside pgbench calling the append function
itself with one single-event command per transaction (what the database does per command,
with no Python and no group commit), and beside ``eventsourcing`` 9.5 running the same commands
on the same Postgres (bench/eventsourcing_reference.py). Then the load time of a 1,000-event
aggregate with a snapshot. pgbench runs before and after the clients at each count; the
baseline is the mean, and a spread over 25% is flagged (the machine was not steady). Prints
figures, then one JSON line.

Python API clients are concurrent callers in one service process: asyncio tasks on the
``AsyncCommandBus`` (the headline figure) and threads on the blocking ``CommandBus``. HTTP
clients post to ``eventfold serve commands``: the headline figure comes from wrk's connections
(a C load generator, like pgbench, so the clients leave the two cores to the server), and a
second from as many Python client processes (http.client), which take CPU from the server.
Each client sends commands to 200 products of its own, and touches them all once before the
clock starts, so the figures are steady state (aggregates cached, as in a running service).

    .venv/bin/python -m bench.append [--seconds 10] [--outbox-design events_table|outbox_table]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import PRODUCTS_PER_CLIENT, WrkResult, run_wrk, threaded_round
from bench.eventsourcing_reference import eventsourcing_threads
from eventfold import migrations
from eventfold.local_stack import postgres
from eventfold.local_stack.process import free_port, stop_pid, wait_until
from eventfold.outbox.design import DEFAULT_OUTBOX_DESIGN, OutboxDesign
from eventfold.outbox.switch import switch_design

UNSTEADY_SPREAD = 0.25


SINGLE_ROW_INSERT = "INSERT INTO bench_insert (v) VALUES (1);\n"
# One single-event command per transaction through the function our appends call: what the
# database alone does per command, with no Python and no group commit.
APPEND_FUNCTION_CALL = """SELECT eventfold_append_units(jsonb_build_array(jsonb_build_object(
  'c', NULL, 'p', jsonb_build_array(jsonb_build_object(
    's', 'pgbench-' || gen_random_uuid(), 't', 'Product', 'e', 0,
    'v', jsonb_build_array(jsonb_build_object(
      'i', gen_random_uuid(), 'y', 'StockReceived', 'sv', 1,
      'd', '{"product": "pgbench", "quantity": 1}'::jsonb,
      'm', jsonb_build_object('command', 'ReceiveStock', 'causation_id', gen_random_uuid(),
                              'correlation_id', gen_random_uuid()))))))));
"""


def pgbench_tps(dsn: str, clients: int, seconds: int, work_dir: Path,
                script_text: str = SINGLE_ROW_INSERT) -> float:
    # Flushed first, so that pgbench never pays for the dirty pages of the runs before it.
    subprocess.run([str(postgres.find_bin_dir() / "psql"), dsn, "-qc", "CHECKPOINT"], check=True)
    script = work_dir / "pgbench.sql"
    script.write_text(script_text)
    run = subprocess.run(
        [str(postgres.find_bin_dir() / "pgbench"), "-n", "-c", str(clients), "-j",
         str(min(clients, 2)), "-T", str(seconds), "-f", str(script), dsn],
        capture_output=True, text=True, check=False)
    match = re.search(r"^tps = ([\d.]+)", run.stdout, re.M)
    if run.returncode != 0 or match is None:
        raise RuntimeError(f"pgbench failed:\n{run.stderr}{run.stdout}")
    return float(match.group(1))


def python_async(database_url: str, clients: int, seconds: float, counts: mp.Queue) -> None:
    import asyncio

    from eventfold.write_model import AsyncCommandBus, AsyncEventStore, AsyncRepository
    from examples.inventory import ReceiveStock, app

    async def run() -> int:
        async with AsyncEventStore.from_url(database_url, pool_size=4) as store:
            bus = AsyncCommandBus(AsyncRepository(store), app.commands)

            async def client(n: int, until: float | None) -> int:
                done = 0
                while (done < PRODUCTS_PER_CLIENT) if until is None else (
                        time.perf_counter() < until):
                    await bus.execute(ReceiveStock(product=f"as-{n}-{done % PRODUCTS_PER_CLIENT}",
                                                   quantity=1))
                    done += 1
                return done

            await asyncio.gather(*(client(n, None) for n in range(clients)))
            deadline = time.perf_counter() + seconds
            return sum(await asyncio.gather(*(client(n, deadline) for n in range(clients))))

    counts.put(asyncio.run(run()))


def python_threads(database_url: str, clients: int, seconds: float, counts: mp.Queue) -> None:
    from eventfold.write_model import CommandBus, EventStore, Repository
    from examples.inventory import ReceiveStock, app

    bus = CommandBus(Repository(EventStore.from_url(database_url, pool_size=clients + 2)),
                     app.commands)

    def receive(n: int, done: int) -> None:
        bus.execute(ReceiveStock(product=f"th-{n}-{done % PRODUCTS_PER_CLIENT}", quantity=1))

    threaded_round(receive, clients, None)
    counts.put(threaded_round(receive, clients, time.perf_counter() + seconds))


def in_process(target, database_url: str, clients: int, seconds: float) -> float:  # noqa: ANN001
    """Commands/s of ``clients`` concurrent callers inside one fresh process."""
    context = mp.get_context("spawn")
    counts: mp.Queue = context.Queue()
    process = context.Process(target=target, args=(database_url, clients, seconds, counts))
    process.start()
    total = counts.get(timeout=seconds + 300)
    process.join()
    return total / seconds


def http_client(port: int, client: int, seconds: float, counts: mp.Queue) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"content-type": "application/json"}
    done, deadline = -PRODUCTS_PER_CLIENT, float("inf")  # the first round warms up
    while time.perf_counter() < deadline:
        if done == 0:
            deadline = time.perf_counter() + seconds
        body = json.dumps({"product": f"http-{client}-{done % PRODUCTS_PER_CLIENT}",
                           "quantity": 1})
        connection.request("POST", "/commands/ReceiveStock", body, headers)
        response = connection.getresponse()
        response.read()
        assert response.status == 201, response.status
        done += 1
    counts.put(done)


# Each wrk thread posts to its connections' products in turn: 200 per connection, as above.
HTTP_LUA = """
local threads = 0
setup = function(thread)
  threads = threads + 1
  thread:set("id", threads)
end
sent = 0
request = function()
  sent = sent + 1
  return wrk.format("POST", "/commands/ReceiveStock", {["Content-Type"] = "application/json"},
                    string.format('{"product": "wrk-%d-%d", "quantity": 1}', id,
                                  sent % PRODUCTS))
end
"""


def http_wrk(port: int, clients: int, seconds: int, work_dir: Path) -> WrkResult:
    """``clients`` wrk connections; a first run touches every product."""
    threads = min(clients, 2)
    lua = HTTP_LUA.replace("PRODUCTS", str(PRODUCTS_PER_CLIENT * clients // threads))
    url = f"http://127.0.0.1:{port}"
    run_wrk(url, lua, clients, 3, work_dir, threads)
    result = run_wrk(url, lua, clients, seconds, work_dir, threads)
    assert result.errors == 0, f"{result.errors} HTTP commands failed"
    return result


def run_clients(target, args: tuple, clients: int, seconds: float) -> float:  # noqa: ANN001
    context = mp.get_context("spawn")
    counts: mp.Queue = context.Queue()
    processes = [context.Process(target=target, args=(*args, n, seconds, counts))
                 for n in range(clients)]
    for process in processes:
        process.start()
    total = sum(counts.get(timeout=seconds + 120) for _ in processes)
    for process in processes:
        process.join()
    return total / seconds


def start_command_api(database_url: str, workers: int,
                      metrics: bool = True) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "EVENTFOLD_DATABASE_URL": database_url,
           "EVENTFOLD_METRICS": str(metrics).lower(),
           "EVENTFOLD_KAFKA_BOOTSTRAP": "127.0.0.1:1", "EVENTFOLD_CONNECT_URL": "http://x",
           "EVENTFOLD_COMMAND_API_PORT": str(port), "EVENTFOLD_HTTP_WORKERS": str(workers),
           "EVENTFOLD_LOG_LEVEL": "WARNING"}
    server = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "serve", "commands"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready() -> bool:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            connection.request("GET", "/ready")
            return connection.getresponse().status == 200
        except OSError:
            return False

    wait_until(ready, what="command API", timeout_s=60, pid=server.pid)
    return server, port


def metrics_overhead(database_url: str, args: argparse.Namespace, work_dir: Path,
                     clients: int = 8, rounds: int = 2) -> tuple[float, float]:
    """HTTP commands/s with Prometheus metrics on and off (``EVENTFOLD_METRICS``), in
    alternating rounds so that a drifting machine weighs on both alike."""
    totals = {True: 0.0, False: 0.0}
    for _ in range(rounds):
        for metrics in (False, True):
            server, port = start_command_api(database_url, args.http_workers, metrics)
            try:
                totals[metrics] += http_wrk(port, clients, args.seconds,
                                            work_dir).requests_per_s
            finally:
                stop_pid(server.pid, what="command API")
    return totals[True] / rounds, totals[False] / rounds


def metrics_middleware_us(requests: int = 100_000) -> float:
    """What the metrics middleware adds to one request, in process: a bare ASGI app timed with
    and without it (the end-to-end on/off figures above move more than this between runs)."""
    from starlette.routing import Route

    from eventfold.metrics import HttpMetrics

    async def bare(scope: dict[str, Any], receive: object,
                   send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def sent(message: dict[str, Any]) -> None:
        return None

    route = Route("/commands/ReceiveStock", bare, methods=["POST"])
    scope = {"type": "http", "method": "POST", "path": "/commands/ReceiveStock",
             "route": route}

    async def timed(app: Any) -> float:
        started = time.perf_counter()
        for _ in range(requests):
            await app(dict(scope), None, sent)
        return time.perf_counter() - started

    plain = min(asyncio.run(timed(bare)) for _ in range(3))
    measured = min(asyncio.run(timed(HttpMetrics(bare, api="bench"))) for _ in range(3))
    return (measured - plain) / requests * 1e6


def load_time_ms(database_url: str) -> tuple[float, float]:
    """Median load of a 1,000-event Product: with its snapshot, and by full replay."""
    from eventfold.write_model import EventStore, Repository
    from eventfold.write_model.domain.events import NewEvent
    from examples.inventory import Product

    store = EventStore.from_url(database_url)
    for batch in range(10):
        store.append("Product", "big", batch * 100, [
            NewEvent("StockReceived", {"product": "big", "quantity": 1}) for _ in range(100)])
    repository = Repository(store, cache_size=0)
    full = repository.load(Product, "big")
    store.save_snapshot("big", "Product", Product.state_version, full.version,
                        full.snapshot_state())

    def median_ms(load) -> float:  # noqa: ANN001
        samples = []
        for _ in range(50):
            started = time.perf_counter()
            aggregate = load()
            samples.append((time.perf_counter() - started) * 1000)
            assert aggregate.on_hand == 1000 and aggregate.version == 1000
        return statistics.median(samples)

    with_snapshot = median_ms(lambda: repository.load(Product, "big"))
    replay = median_ms(lambda: Product.replay("big", [
        repository.registry.decode(e.event_type, e.data, e.schema_version)
        for e in store.load("big")[1]]))
    return with_snapshot, replay


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--http-workers", type=int, default=1,
                        help="command API processes (the product default: 1)")
    parser.add_argument("--outbox-design", choices=list(OutboxDesign),
                        default=DEFAULT_OUTBOX_DESIGN.value,
                        help="the append function's design: the events table captured "
                             "directly, or an outbox row per event")
    args = parser.parse_args()
    work_dir = Path(tempfile.mkdtemp(prefix="eventfold-append-"))
    port = free_port()
    postgres.init_cluster(work_dir / "pg", work_dir / "pg.log")
    pg_pid = postgres.start(work_dir / "pg", port, work_dir / "pg.log")
    try:
        run(postgres.dsn(port), args, work_dir)
    finally:
        stop_pid(pg_pid, what="postgres", sig=signal.SIGINT)


def run(dsn: str, args: argparse.Namespace, work_dir: Path) -> None:
    database_url = dsn.replace("postgresql://", "postgresql+psycopg://")
    migrations.upgrade(database_url)
    switch_design(database_url, OutboxDesign(args.outbox_design))
    subprocess.run([str(postgres.find_bin_dir() / "psql"), dsn, "-qc",
                    "CREATE TABLE bench_insert (id BIGINT GENERATED ALWAYS AS IDENTITY "
                    "PRIMARY KEY, v INT)"], check=True)
    figures: dict[int, dict[str, float]] = {}
    for clients in (1, 8):
        # pgbench before and after our runs: a machine whose disk or CPU share changes in
        # between (seen here: 778 to 21,746 TPS at 8 clients within an hour) shows as a
        # spread, and the ratios then say little.
        pg_before = pgbench_tps(dsn, clients, args.seconds, work_dir)
        py = in_process(python_async, database_url, clients, args.seconds)
        reference = in_process(eventsourcing_threads, database_url, clients, args.seconds)
        threads = in_process(python_threads, database_url, clients, args.seconds)
        server, port = start_command_api(database_url, args.http_workers)
        try:
            web = http_wrk(port, clients, args.seconds, work_dir)
            web_python = run_clients(http_client, (port,), clients, args.seconds)
        finally:
            stop_pid(server.pid, what="command API")
        pg_after = pgbench_tps(dsn, clients, args.seconds, work_dir)
        function = pgbench_tps(dsn, clients, args.seconds, work_dir, APPEND_FUNCTION_CALL)
        pg = (pg_before + pg_after) / 2
        spread = abs(pg_before - pg_after) / max(pg_before, pg_after)
        figures[clients] = {"pgbench": pg, "pgbench_function": function, "python": py,
                            "threads": threads, "eventsourcing": reference,
                            "http": web.requests_per_s, "http_p50_ms": web.p50_ms,
                            "http_p99_ms": web.p99_ms, "http_python": web_python,
                            "pgbench_spread": spread}
        print(f"{clients} client(s): pgbench {pg:,.0f} TPS (before {pg_before:,.0f}, after "
              f"{pg_after:,.0f}) | Python API {py:,.0f} commands/s "
              f"({py / pg:.2f}x; blocking API in threads {threads:,.0f}/s, "
              f"{threads / pg:.2f}x) | HTTP {web.requests_per_s:,.0f} commands/s "
              f"({web.requests_per_s / pg:.2f}x, p50 {web.p50_ms:.2f} ms, p99 "
              f"{web.p99_ms:.2f} ms; {args.http_workers} worker(s), wrk), from Python client "
              f"processes {web_python:,.0f}/s ({web_python / pg:.2f}x)", flush=True)
        print(f"  eventsourcing 9.5, same commands, same Postgres, {clients} thread(s): "
              f"{reference:,.0f} commands/s; the Python API does {py / reference:.1f}x that",
              flush=True)
        print(f"  the append function alone (pgbench, one single-event command per "
              f"transaction, no Python, no group commit): {function:,.0f} TPS "
              f"({function / pg:.2f}x)", flush=True)
        if spread > UNSTEADY_SPREAD:
            print(f"  WARNING: pgbench moved {spread:.0%} between before and after: the machine "
                  "was not steady, so these ratios are not a fair comparison", flush=True)
    metrics_on, metrics_off = metrics_overhead(database_url, args, work_dir)
    print(f"HTTP at 8 clients, metrics on / off (alternating rounds): {metrics_on:,.0f} / "
          f"{metrics_off:,.0f} commands/s ({metrics_on / metrics_off:.3f}x)", flush=True)
    with_snapshot, replay = load_time_ms(database_url)
    print(f"load of a 1,000-event aggregate: {with_snapshot:.2f} ms with its snapshot, "
          f"{replay:.2f} ms by full replay")
    eight = figures[8]
    middleware_us = metrics_middleware_us()
    request_us = 1e6 / eight["http"]  # the server's time per command at 8 clients, 1 worker
    print(f"the metrics middleware costs {middleware_us:.1f} us per request in process: "
          f"{middleware_us / request_us:.1%} of a command's {request_us:,.0f} us at 8 clients",
          flush=True)
    print(f"vs eventsourcing 9.5 at 8 clients: Python API "
          f"{eight['python'] / eight['eventsourcing']:.1f}x")
    print(json.dumps({
        "outbox_design": args.outbox_design,
        "python_api_commands_per_s": round(eight["python"]),
        "http_commands_per_s": round(eight["http"]),
        "http_p50_ms": eight["http_p50_ms"], "http_p99_ms": eight["http_p99_ms"],
        "http_python_clients_commands_per_s": round(eight["http_python"]),
        "pgbench_tps": round(eight["pgbench"]),
        "pgbench_append_function_tps": round(eight["pgbench_function"]),
        "python_api_vs_pgbench_ratio": round(eight["python"] / eight["pgbench"], 3),
        "http_vs_pgbench_ratio": round(eight["http"] / eight["pgbench"], 3),
        "http_metrics_on_commands_per_s": round(metrics_on),
        "http_metrics_off_commands_per_s": round(metrics_off),
        "http_metrics_on_vs_off_ratio": round(metrics_on / metrics_off, 3),
        "http_metrics_middleware_us_per_request": round(middleware_us, 2),
        "http_metrics_middleware_share_of_command": round(middleware_us / request_us, 4),
        "eventsourcing_commands_per_s": round(eight["eventsourcing"]),
        "python_api_vs_eventsourcing_ratio": round(eight["python"] / eight["eventsourcing"], 2),
        "load_1000_events_snapshot_ms": round(with_snapshot, 2),
        "load_1000_events_replay_ms": round(replay, 2),
        "python_api_1_client_commands_per_s": round(figures[1]["python"]),
        "eventsourcing_1_client_commands_per_s": round(figures[1]["eventsourcing"]),
        "python_threads_commands_per_s": round(eight["threads"]),
        "python_threads_1_client_commands_per_s": round(figures[1]["threads"]),
        "http_1_client_commands_per_s": round(figures[1]["http"]),
        "http_python_client_1_client_commands_per_s": round(figures[1]["http_python"]),
        "pgbench_1_client_tps": round(figures[1]["pgbench"]),
        "pgbench_append_function_1_client_tps": round(figures[1]["pgbench_function"]),
        "pgbench_before_after_spread_ratio": round(eight["pgbench_spread"], 3),
    }))


if __name__ == "__main__":
    main()
