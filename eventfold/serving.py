"""Serving ASGI apps with uvicorn: in the foreground (CLI), in worker processes (under
``eventfold.supervisor``), or in a background thread (demo, tests)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, cast

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from eventfold.config import Settings
from eventfold.logs import configure_logging
from eventfold.metrics import MULTIPROCESS_DIR, PROCESS_COLLECTORS, WorkerRestarts

log = logging.getLogger(__name__)


class CoalescedWrites:
    """A connection's transport whose writes in one turn of the event loop leave in one
    send, at the end of the turn.

    Why: uvicorn writes a response's head and its body separately, so a small response
    cost two sends, and the client two wake-ups to read it; where a system call is dear,
    that was a good part of a KTable get, and of both hops of a forwarded one
    (docs/benchmarks.md, "One send a response").
    Everything but writing is the transport's own."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def close(self) -> None:
        self._flush()  # what was written goes before the close
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, its writes coalesced (``CoalescedWrites``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(cast(asyncio.Transport, CoalescedWrites(transport, self.loop)))


def uvicorn_config(app: FastAPI, **options: Any) -> uvicorn.Config:
    """The configuration every server of an Eventfold app runs with."""
    return uvicorn.Config(app, http=HttpProtocol, **options)


class BackgroundServer:
    """An ASGI app on a uvicorn server in a thread; ``stop`` lets in-flight requests finish."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        self.server = uvicorn.Server(uvicorn_config(
            app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=10))
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self.server.run, name=f"uvicorn-{port}",
                                        daemon=True)

    def start(self, timeout_s: float = 30) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"HTTP server at {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)


def serve_forever(factory: str, host: str, port: int, workers: int = 1) -> None:
    """Serve the app that ``factory`` ("module:function") builds until SIGINT/SIGTERM;
    in-flight requests finish first. ``workers`` > 1 runs that many processes, each with its
    own SO_REUSEPORT listening socket (the kernel spreads connections over them), under
    ``eventfold.supervisor``, which this process becomes (it does not return then)."""
    if workers > 1:
        _become_supervisor(factory, host, port, workers)
    _return_after_stop_signal()
    serve_worker(factory, host, port)
    log.info("HTTP server on %s:%d stopped cleanly", host, port)


def _become_supervisor(factory: str, host: str, port: int, workers: int) -> NoReturn:
    shared = [tempfile.mkdtemp(prefix="eventfold-workers-")]
    os.environ[WORKERS_DIR] = shared[0]
    # Each worker writes its metric samples to files there; /metrics on any worker sums them.
    if not os.environ.get(MULTIPROCESS_DIR):
        shared.append(tempfile.mkdtemp(prefix="eventfold-metrics-"))
        os.environ[MULTIPROCESS_DIR] = shared[1]
    settings = Settings.from_env()
    logging.shutdown()  # flushed: exec keeps no buffer
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "eventfold.supervisor", factory, host,
                              str(port), str(workers), settings.log_level,
                              settings.log_format, *shared])


def _return_after_stop_signal() -> None:
    # uvicorn re-raises the stop signal once it has drained; with the default handler that
    # would kill the process (exit -15) after a clean shutdown, so note it and return instead.
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, _note_stop_signal)


def _note_stop_signal(signum: int, _: FrameType | None) -> None:
    log.info("signal %d received", signum)


def serve_worker(factory: str, host: str, port: int | str) -> None:
    """One HTTP worker (the only one, or one of ``eventfold.supervisor``'s)."""
    _return_after_stop_signal()
    settings = Settings.from_env()  # a worker of the supervisor configures its own logging
    configure_logging(settings.log_level, settings.log_format)
    module_name, _, function = factory.partition(":")
    app = getattr(importlib.import_module(module_name), function)()
    shared = workers_dir()
    if shared is not None:
        PROCESS_COLLECTORS.register(WorkerRestarts(shared))
    # A socket made in this process: asyncio then sets TCP_NODELAY on accepted connections
    # (with a socket inherited from a parent it may not, and every response waits ~40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, int(port)))
    # uvicorn's own loggers go through ours (text or JSON), not a config of its own.
    config = uvicorn_config(app, log_config=None, log_level="info",
                            timeout_graceful_shutdown=20, access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


WORKERS_DIR = "EVENTFOLD_WORKERS_DIR"
"""Set by ``serve_forever`` for its workers: a directory of their own that they share (the
read API's workers elect their lead there, ``read_api.workers``). Not a setting."""


def workers_dir() -> Path | None:
    """The directory this process shares with the other workers of its server, if any."""
    shared = os.environ.get(WORKERS_DIR)
    return Path(shared) if shared else None


