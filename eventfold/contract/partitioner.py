"""Which partition of a topic holds a key: Kafka's default partitioner for keyed records
(``toPositive(murmur2(key)) % partitions``), which Debezium's and the projections' producers
use (librdkafka's ``murmur2_random``), so that a read API instance finds a key's partition
without reading the topic, and a projection knows where a key was before partitions were
added to its KTable topic."""

from __future__ import annotations

import struct

_WORDS = struct.Struct("<I")
_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``, as an unsigned 32-bit value."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for (k,) in _WORDS.iter_unpack(data[:whole]):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length % 4
    if tail:
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: str, partitions: int) -> int:
    """The partition of ``partitions`` that Kafka's default partitioner gives ``key``."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions
