"""One merge of sorted parts: a KTable's partitions, each read in key order, merged into one
key order (no key is in two parts). A store merges its partitions' iterators, an instance
merges the pages other instances sent, and an export merges streams of pages: all three
through ``_take``.

A merge round takes, from what every part has delivered so far, everything up to the least
last key among the parts not yet ended (every part has been read past it, or to its end) and
sorts it at once, in C: a Python heap that compared record by record cost more a record than
reading it from RocksDB did.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
Key = Callable[[T], Any]

CHUNK = 1024
"""Items read from each part at a time when a merge has no limit."""


def _take(buffers: list[list[T]], ended: Sequence[bool], key: Key[T]) -> list[T]:
    """Of what the parts have delivered (``buffers``), every item no later part can precede,
    in key order; they leave their buffers. Every part not ended must have items buffered."""
    open_ends = [key(buffer[-1]) for buffer, done in zip(buffers, ended, strict=True)
                 if not done]
    if not open_ends:
        taken = list(itertools.chain.from_iterable(buffers))
        for buffer in buffers:
            buffer.clear()
    else:
        reached = min(open_ends)
        taken = []
        for buffer in buffers:
            cut = bisect.bisect_right(buffer, reached, key=key)
            taken.extend(buffer[:cut])
            del buffer[:cut]
    taken.sort(key=key)
    return taken


def merge_sorted(parts: Sequence[Iterator[T]], key: Key[T], limit: int | None = None
                 ) -> list[T]:
    """The first ``limit`` items of ``parts`` (each in key order) in key order; each part is
    read a chunk at a time."""
    chunk = CHUNK if limit is None else limit // max(len(parts), 1) + 16
    buffers: list[list[T]] = [[] for _ in parts]
    ended = [False] * len(parts)
    found: list[T] = []
    while (limit is None or len(found) < limit) and not (all(ended) and not any(buffers)):
        for n, part in enumerate(parts):
            if not buffers[n] and not ended[n]:
                buffers[n] = list(itertools.islice(part, chunk))
                ended[n] = len(buffers[n]) < chunk
        found.extend(_take(buffers, ended, key))
    return found if limit is None else found[:limit]


async def merge_pages(parts: Sequence[AsyncIterator[list[T]]], key: Key[T], chunk: int
                      ) -> AsyncIterator[list[T]]:
    """The items of ``parts`` (each a stream of pages, in key order) in key order, ``chunk``
    at a time. A part's next page is asked for as soon as its current one arrives, so that
    the merge seldom waits."""
    buffers: list[list[T]] = [[] for _ in parts]
    ended = [False] * len(parts)
    pending = [asyncio.ensure_future(anext(part, None)) for part in parts]
    out: list[T] = []
    try:
        while not (all(ended) and not any(buffers)):
            for n, part in enumerate(parts):
                while not buffers[n] and not ended[n]:
                    page = await pending[n]
                    if page is None:
                        ended[n] = True
                    else:
                        buffers[n] = list(page)
                        pending[n] = asyncio.ensure_future(anext(part, None))
            out.extend(_take(buffers, ended, key))
            while len(out) >= chunk:
                yield out[:chunk]
                del out[:chunk]
        if out:
            yield out
    finally:
        for future in pending:
            future.cancel()
        for part in parts:
            aclose = getattr(part, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
