"""Serving ASGI apps with uvicorn: in the foreground (CLI) or in a background thread (demo)."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI


class BackgroundServer:
    """An ASGI app on a uvicorn server in a thread; ``stop`` lets in-flight requests finish."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        self.server = uvicorn.Server(uvicorn.Config(
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


def serve_forever(app: FastAPI, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM; uvicorn finishes in-flight requests before exiting."""
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=20)
