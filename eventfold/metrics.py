"""Prometheus metrics: the HTTP middleware both APIs share, the ``/metrics`` exposition (of one
process, or of every worker of ``EVENTFOLD_HTTP_WORKERS``), and the small HTTP server of
processes that serve no API (``projection run``).

Each layer declares its own metrics beside what it measures (``write_model.metrics``,
``outbox.metrics``, ``projections.metrics``, ``read_api.metrics``); this module only counts
requests and serves what is registered.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventfold.supervisor import read_restarts

log = logging.getLogger(__name__)

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"
"""Where worker processes write their samples (prometheus_client's multiprocess mode), set by
the HTTP supervisor for its workers."""

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0)

HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
REQUESTS = Counter("eventfold_http_requests", "HTTP requests answered, by API, route template "
                   "(unmatched: no route), method and status", ["api", "route", "method", "status"])
IN_PROGRESS = Gauge("eventfold_http_requests_in_progress",
                    "Requests received and not yet answered, by API (this scrape included)",
                    ["api"], multiprocess_mode="livesum")
REQUEST_SECONDS = Histogram("eventfold_http_request_duration_seconds",
                            "Time from a request's arrival to the end of its response",
                            ["api", "route"], buckets=LATENCY_BUCKETS)


class HttpMetrics:
    """ASGI middleware: every request counted by route template (bounded: a path that matched
    no route counts as ``unmatched``) and timed. A plain ASGI middleware, as ``RequestLog``."""

    def __init__(self, app: ASGIApp, api: str) -> None:
        self.app = app
        self.api = api
        # each request's series, looked up once: ``labels`` takes a lock and builds its key
        self._in_progress = IN_PROGRESS.labels(api)
        self._requests: dict[tuple[str, str, int], Counter] = {}
        self._seconds: dict[str, Histogram] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        in_progress = self._in_progress
        in_progress.inc()

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            in_progress.dec()
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            # A client picks the method: only the standard ones become label values, so that
            # made-up methods cannot grow the series without bound.
            method = scope["method"] if scope["method"] in HTTP_METHODS else "other"
            answered = self._requests.get((route, method, status))
            if answered is None:
                answered = self._requests[route, method, status] = REQUESTS.labels(
                    self.api, route, method, str(status))
            answered.inc()
            seconds = self._seconds.get(route)
            if seconds is None:
                seconds = self._seconds[route] = REQUEST_SECONDS.labels(self.api, route)
            seconds.observe(time.perf_counter() - started)


class WorkerRestarts(Collector):
    """The HTTP supervisor's tally of workers started in the place of one that died (it
    writes a file in the directory its workers share; any worker reports it)."""

    def __init__(self, shared: Path) -> None:
        self.shared = shared

    def collect(self) -> Iterator[CounterMetricFamily]:
        restarts = CounterMetricFamily(
            "eventfold_http_worker_restarts", "HTTP workers started in the place of one that "
            "died, by how it died (an exit code, or the signal that killed it)",
            labels=["exit"])
        for died, count in sorted(read_restarts(self.shared).items()):
            restarts.add_metric([died], count)
        yield restarts


PROCESS_COLLECTORS = CollectorRegistry(auto_describe=True)
"""Collectors computed when scraped from this process's own state (KTable stores, a
projection's lag, the connector's status). With several HTTP workers, the worker that answers
the scrape reports its own, labelled by instance."""


def exposition() -> bytes:
    """Every metric in Prometheus's text format: counters and histograms of this process (in
    multiprocess mode, summed over the workers' files), then the process's collectors."""
    if os.environ.get(MULTIPROCESS_DIR):
        registry = CollectorRegistry()
        prometheus_multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry = REGISTRY
    return generate_latest(registry) + generate_latest(PROCESS_COLLECTORS)


async def metrics_endpoint(_: Request) -> Response:
    return Response(exposition(), media_type=CONTENT_TYPE_LATEST)


class MetricsServer:
    """``/metrics`` and ``/health`` on a port of their own, for a process that serves no API.
    ``health`` answers (healthy, detail); unhealthy is a 503."""

    def __init__(self, host: str, port: int, health: Callable[[], tuple[bool, str]]) -> None:
        handler = type("Handler", (_Handler,), {"health": staticmethod(health)})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="metrics-server", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics on %s/metrics, health on %s/health", self.url, self.url)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    health: Callable[[], tuple[bool, str]]

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._answer(200, exposition(), CONTENT_TYPE_LATEST)
        elif self.path == "/health":
            healthy, detail = self.health()
            self._answer(200 if healthy else 503, detail.encode(), "text/plain; charset=utf-8")
        else:
            self._answer(404, b"not found: /metrics or /health", "text/plain; charset=utf-8")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("metrics server: " + format, *args)
