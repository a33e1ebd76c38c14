"""A small HTTP/1.1 client for reads forwarded between read API instances: keep-alive
connections per instance, each an asyncio protocol whose responses are parsed by
``httptools`` (uvicorn's parser) as the bytes arrive. A general client (httpx) spent several
milliseconds of CPU per forwarded get, more than the get itself (docs/benchmarks.md, "KTable
partitions among instances")."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlencode, urlsplit

import httptools

CONNECT_TIMEOUT_S = 2.0
"""An instance that is down is given up on at once (connection refused comes sooner)."""
READ_TIMEOUT_S = 3.0
"""How long a forwarded read may take beyond any wait for a version it asks for, unless the
instance sets ``EVENTFOLD_READ_FORWARD_TIMEOUT_S``: an instance that stalls (paused,
swapping) is given up on, and the read goes to another replica."""
_IDLE_PER_HOST = 64


class ForwardFailed(Exception):
    """The instance did not answer (down, unreachable, or the connection broke)."""


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[bytes, bytes] = field(default_factory=dict)


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an instance, one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._body: list[bytes] = []
        self._headers: dict[bytes, bytes] = {}
        self._keep_alive = False

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def data_received(self, data: bytes) -> None:
        if self._parser is None:
            return  # bytes nobody asked for: the next request finds the connection closed
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(exc or ConnectionError("the connection closed before the response ended"))

    # -- httptools' callbacks -------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        # Asked now: once the message is complete the parser's state no longer says it.
        self._keep_alive = self._parser is not None and self._parser.should_keep_alive()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- use ------------------------------------------------------------------------------
    async def get(self, request: bytes, timeout_s: float) -> tuple[Answer, bool]:
        """The response, and whether the connection may be used again."""
        if self.closed or self.transport is None:
            raise ConnectionError("the connection has closed")
        self._body, self._headers, self._keep_alive = [], {}, False
        parser = self._parser = httptools.HttpResponseParser(self)
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self.transport.write(request)
        # a plain timer that fails the waiter: all a timeout here has to do, where
        # ``asyncio.timeout`` would also cancel and uncancel the task on every get
        timer = loop.call_later(timeout_s, self._time_out, timeout_s)
        try:
            await self._waiter
        finally:
            timer.cancel()
            self._parser = self._waiter = None
        answer = Answer(parser.get_status_code(), b"".join(self._body), self._headers)
        return answer, self._keep_alive

    def _time_out(self, timeout_s: float) -> None:
        self._fail(TimeoutError(f"no response within {timeout_s:.1f} s"))

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


@functools.lru_cache(maxsize=256)
def _endpoint(base_url: str) -> tuple[tuple[str, int], str, str]:
    """(host, port), the Host header and the path prefix of an instance's URL."""
    url = urlsplit(base_url)
    if url.scheme != "http" or url.hostname is None:
        raise ForwardFailed(f"{base_url}: only http:// instance URLs are supported")
    return (url.hostname, url.port or 80), url.netloc, url.path.rstrip("/")


class Forwarder:
    """GET requests to other instances over connections kept open between them."""

    def __init__(self, read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self.read_timeout_s = read_timeout_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def get(self, base_url: str, path: str, params: Mapping[str, str],
                  headers: Mapping[str, str], waits_s: float = 0.0) -> Answer:
        """``GET base_url + path?params``; raises ``ForwardFailed`` if there is no answer
        within ``read_timeout_s`` (plus ``waits_s``, what the other instance is asked to
        wait for a version)."""
        host, netloc, prefix = _endpoint(base_url)
        target = f"{prefix}{path}" + (f"?{urlencode(params)}" if params else "")
        request = "".join([f"GET {target} HTTP/1.1\r\nHost: {netloc}\r\n",
                           *(f"{k}: {v}\r\n" for k, v in headers.items()), "\r\n"]).encode()
        for attempt in range(2):  # a kept connection the other side closed meanwhile: anew
            reused = bool(self._idle.get(host))
            connection = await self._connection(host)
            try:
                answer, keep = await connection.get(request, self.read_timeout_s + waits_s)
            except (OSError, ConnectionError, httptools.HttpParserError,
                    TimeoutError) as exc:
                connection.close()
                if reused and attempt == 0 and not isinstance(exc, TimeoutError):
                    continue
                raise ForwardFailed(f"{base_url}: {exc or type(exc).__name__}") from exc
            except asyncio.CancelledError:  # the client went away: the response is unread
                connection.close()
                raise
            if keep and len(self._idle.setdefault(host, [])) < _IDLE_PER_HOST:
                self._idle[host].append(connection)
            else:
                connection.close()
            return answer
        raise ForwardFailed(f"{base_url}: no answer")  # not reached: the loop returns or raises

    async def _connection(self, host: tuple[str, int]) -> _Connection:
        idle = self._idle.get(host)
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, connection = await asyncio.get_running_loop().create_connection(
                    _Connection, *host)
        except (OSError, TimeoutError) as exc:
            raise ForwardFailed(f"{host[0]}:{host[1]}: {exc or type(exc).__name__}") from exc
        return connection

    async def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                with contextlib.suppress(Exception):
                    connection.close()
        self._idle.clear()
