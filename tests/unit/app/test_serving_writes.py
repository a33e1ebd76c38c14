"""The HTTP servers' writes: a response leaves in one send, a streamed one still streams,
and nothing written is lost to a close."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse
from uvicorn.server import ServerState

from eventfold.serving import CoalescedWrites, HttpProtocol


class _RecordingTransport(asyncio.Transport):
    """What a connection's socket was given, one entry a send."""

    def __init__(self) -> None:
        super().__init__()
        self.sends: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: Any) -> None:
        self.sends.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/small")
    async def small() -> PlainTextResponse:
        return PlainTextResponse("hello")

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            for n in range(3):
                await asyncio.sleep(0.01)  # each line is ready in a later turn of the loop
                yield b"line %d\n" % n

        return StreamingResponse(lines(), media_type="text/plain")

    return app


async def _served(path: str, protocol_class: type[HttpProtocol] = HttpProtocol
                  ) -> _RecordingTransport:
    """Sends ``GET path`` to a connection of the app and returns once the response ended."""
    loop = asyncio.get_running_loop()
    config = uvicorn.Config(_app(), http=protocol_class, log_config=None, lifespan="off")
    config.load()
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={},
                              _loop=loop)
    transport = _RecordingTransport()
    protocol.connection_made(transport)
    protocol.data_received(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    for _ in range(200):
        await asyncio.sleep(0.005)
        if transport.sends and transport.sends[-1].endswith((b"hello", b"0\r\n\r\n")):
            break
    protocol.connection_lost(None)
    return transport


def test_a_response_leaves_in_one_send() -> None:
    transport = asyncio.run(_served("/small"))
    [send] = transport.sends
    assert send.startswith(b"HTTP/1.1 200 OK\r\n")
    assert send.endswith(b"\r\n\r\nhello")


def test_a_streamed_response_still_streams() -> None:
    transport = asyncio.run(_served("/stream"))
    body = b"".join(transport.sends).split(b"\r\n\r\n", 1)[1]
    assert body == b"7\r\nline 0\n\r\n7\r\nline 1\n\r\n7\r\nline 2\n\r\n0\r\n\r\n"
    assert len(transport.sends) >= 3  # the lines left as they came, not at the end


def test_what_was_written_goes_before_a_close() -> None:
    async def test() -> _RecordingTransport:
        transport = _RecordingTransport()
        writes = CoalescedWrites(transport, asyncio.get_running_loop())
        writes.write(b"head ")
        writes.write(memoryview(b"body"))
        assert writes.get_write_buffer_size() == 9
        writes.close()
        await asyncio.sleep(0)  # the turn's flush finds nothing left
        return transport

    transport = asyncio.run(test())
    assert transport.sends == [b"head body"]
    assert transport.closed


def test_an_abort_drops_what_is_pending() -> None:
    async def test() -> _RecordingTransport:
        transport = _RecordingTransport()
        writes = CoalescedWrites(transport, asyncio.get_running_loop())
        writes.write(b"never sent")
        writes.abort()
        await asyncio.sleep(0)
        return transport

    transport = asyncio.run(test())
    assert transport.sends == []
    assert transport.aborted
