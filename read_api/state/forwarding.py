"""A small HTTP/1.1 client for reads forwarded between read API instances: keep-alive
connections per instance, requests written and responses parsed (``httptools``, uvicorn's
parser) on asyncio streams. A general client (httpx) spent several milliseconds of CPU per
forwarded get, more than the get itself (docs/benchmarks.md, "KTable partitions among
instances")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit

import httptools

CONNECT_TIMEOUT_S = 2.0
"""An instance that is down is given up on at once (connection refused comes sooner)."""
READ_TIMEOUT_S = 40.0
"""A forwarded read may wait for a version (at most 30 s of it)."""
_IDLE_PER_HOST = 64


class ForwardFailed(Exception):
    """The instance did not answer (down, unreachable, or the connection broke)."""


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[bytes, bytes] = field(default_factory=dict)


class _Parsed:
    """httptools' callbacks, collecting one response."""

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.headers: dict[bytes, bytes] = {}
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def get(self, request: bytes) -> tuple[Answer, bool]:
        """The response, and whether the connection may be used again."""
        self.writer.write(request)
        parsed = _Parsed()
        parser = httptools.HttpResponseParser(parsed)
        while not parsed.complete:
            chunk = await self.reader.read(65536)
            if not chunk:
                raise ConnectionError("the connection closed before the response ended")
            parser.feed_data(chunk)
        answer = Answer(parser.get_status_code(), b"".join(parsed.body), parsed.headers)
        return answer, parser.should_keep_alive()

    def close(self) -> None:
        self.writer.close()


class Forwarder:
    """GET requests to other instances over connections kept open between them."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def get(self, base_url: str, path: str, params: Mapping[str, str],
                  headers: Mapping[str, str]) -> Answer:
        """``GET base_url + path?params``; raises ``ForwardFailed`` if there is no answer."""
        url = urlsplit(base_url)
        if url.scheme != "http" or url.hostname is None:
            raise ForwardFailed(f"{base_url}: only http:// instance URLs are supported")
        host = (url.hostname, url.port or 80)
        target = f"{url.path.rstrip('/')}{path}" + (f"?{urlencode(params)}" if params else "")
        request = "".join([f"GET {target} HTTP/1.1\r\nHost: {url.netloc}\r\n",
                           *(f"{k}: {v}\r\n" for k, v in headers.items()), "\r\n"]).encode()
        for attempt in range(2):  # a kept connection the other side closed meanwhile: anew
            reused = bool(self._idle.get(host))
            connection = await self._connection(host)
            try:
                answer, keep = await asyncio.wait_for(connection.get(request), READ_TIMEOUT_S)
            except (OSError, ConnectionError, httptools.HttpParserError,
                    TimeoutError) as exc:
                connection.close()
                if reused and attempt == 0 and not isinstance(exc, TimeoutError):
                    continue
                raise ForwardFailed(f"{base_url}: {exc or type(exc).__name__}") from exc
            if keep and len(self._idle.setdefault(host, [])) < _IDLE_PER_HOST:
                self._idle[host].append(connection)
            else:
                connection.close()
            return answer
        raise ForwardFailed(f"{base_url}: no answer")  # not reached: the loop returns or raises

    async def _connection(self, host: tuple[str, int]) -> _Connection:
        idle = self._idle.get(host)
        if idle:
            return idle.pop()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*host),
                                                    CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise ForwardFailed(f"{host[0]}:{host[1]}: {exc or type(exc).__name__}") from exc
        return _Connection(reader, writer)

    async def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                with contextlib.suppress(Exception):
                    connection.close()
        self._idle.clear()
