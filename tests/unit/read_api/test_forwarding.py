"""The client that forwards KTable reads between instances keeps its connections open, opens
another when the instance closed one, and fails fast when the instance is down."""

from __future__ import annotations

import asyncio

import pytest

from eventfold.local_stack.process import free_port
from eventfold.read_api.state.forwarding import Forwarder, ForwardFailed


class _Instance:
    """A tiny HTTP/1.1 server: answers each GET with its path, counts connections, and
    closes a connection after ``close_after`` responses on it."""

    def __init__(self, close_after: int = 0) -> None:
        self.close_after = close_after
        self.connections = 0
        self.port = free_port()

    async def start(self) -> asyncio.Server:
        return await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = 0
        while head := await reader.readuntil(b"\r\n\r\n"):
            target = head.split(b" ", 2)[1]
            answered += 1
            closing = answered == self.close_after
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (
                len(target), b"Connection: close\r\n" if closing else b"", target))
            await writer.drain()
            if closing:
                break
        writer.close()


def _run(test) -> None:
    asyncio.run(test())


def test_gets_reuse_one_connection() -> None:
    async def test() -> None:
        instance = _Instance()
        async with await instance.start():
            forwarder = Forwarder()
            for n in range(50):
                answer = await forwarder.get(f"http://127.0.0.1:{instance.port}",
                                             "/ktables/t/entries/k", {"n": str(n)}, {})
                assert (answer.status, answer.body) == (200, f"/ktables/t/entries/k?n={n}".encode())
            await forwarder.close()
        assert instance.connections == 1

    _run(test)


def test_a_connection_the_instance_closed_is_replaced() -> None:
    async def test() -> None:
        instance = _Instance(close_after=3)
        async with await instance.start():
            forwarder = Forwarder()
            bodies = [(await forwarder.get(f"http://127.0.0.1:{instance.port}", f"/{n}", {},
                                           {})).body for n in range(9)]
            await forwarder.close()
        assert bodies == [f"/{n}".encode() for n in range(9)]
        assert instance.connections == 3

    _run(test)


def test_an_instance_that_is_down_fails_at_once() -> None:
    async def test() -> None:
        forwarder = Forwarder()
        with pytest.raises(ForwardFailed, match=r"127\.0\.0\.1"):
            await asyncio.wait_for(forwarder.get(f"http://127.0.0.1:{free_port()}", "/", {}, {}),
                                   5)

    _run(test)


def test_an_instance_that_never_answers_fails_after_the_read_timeout() -> None:
    async def test() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)  # reads nothing, answers nothing

        port = free_port()
        async with await asyncio.start_server(silent, "127.0.0.1", port):
            forwarder = Forwarder(read_timeout_s=0.2)  # EVENTFOLD_READ_FORWARD_TIMEOUT_S
            started = asyncio.get_running_loop().time()
            with pytest.raises(ForwardFailed, match="no response within"):
                await asyncio.wait_for(forwarder.get(f"http://127.0.0.1:{port}", "/", {}, {}),
                                       5)
            assert asyncio.get_running_loop().time() - started < 2
            assert forwarder._idle.get(("127.0.0.1", port), []) == []  # not kept for reuse
            for writer in accepted:
                writer.close()

    _run(test)
