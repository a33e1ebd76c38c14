"""A KTable entry: a key's value as the projection published it, and the version it wrote."""

from __future__ import annotations

import logging
import struct
from typing import Any, NamedTuple

import orjson

from eventfold.contract import KTABLE_MOVED_HEADER, KTABLE_VERSION_HEADER

log = logging.getLogger(__name__)

_VERSION = struct.Struct(">q")


class KTableEntry(NamedTuple):
    """Decoded when read, not when restored: a restore builds one per record and most are
    never asked for."""

    raw: bytes
    version: int = 0
    """The projection version that wrote the value (its ``eventfold.version`` header)."""

    @property
    def value(self) -> Any:
        try:
            return orjson.loads(self.raw)
        except orjson.JSONDecodeError:
            log.warning("ktable value is not JSON: %r", self.raw[:100])
            return None

    @classmethod
    def of_record(cls, value: bytes | None, headers: list[tuple[str, bytes | None]] | None
                  ) -> KTableEntry | MovedAway | None:
        """The entry of a KTable record; None for a tombstone; ``MovedAway`` for one that
        says where the key went (partitions were added to the topic)."""
        if value is None:
            return _moved_away(headers)
        for name, header in headers or ():
            if name == KTABLE_VERSION_HEADER and header:
                return cls(value, int(header))
        return cls(value)

    def encode(self) -> bytes:
        """As a store keeps it on disk: the version, then the value."""
        return _VERSION.pack(self.version) + self.raw

    @classmethod
    def decode(cls, stored: bytes) -> KTableEntry:
        # tuple.__new__ skips the generated __new__'s argument handling, which a range scan
        # would pay for every record
        return _new_tuple(cls, (stored[_VERSION.size:], _unpack_version(stored)[0]))


_new_tuple = tuple.__new__
_unpack_version = _VERSION.unpack_from


class MovedAway(NamedTuple):
    """A tombstone saying the key was written to another partition: until that partition
    has applied it, the key is moving, not gone."""

    partition: int


def _moved_away(headers: list[tuple[str, bytes | None]] | None) -> MovedAway | None:
    for name, header in headers or ():
        if name == KTABLE_MOVED_HEADER and header:
            return MovedAway(int(header))
    return None
