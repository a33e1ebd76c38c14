"""Identifiers: time-ordered UUIDs for events.

An event id is a UUID version 7 (RFC 9562): 48 bits of Unix milliseconds, then random bits.
Ids made later sort later, so each insert lands at the right edge of the unique indexes on
``events.event_id`` and ``outbox.id`` instead of at a random page, and the ids still need no
coordination between processes.
"""

from __future__ import annotations

import os
import time
import uuid

_RANDOM_62 = (1 << 62) - 1


def uuid7() -> uuid.UUID:
    millis = time.time_ns() // 1_000_000
    random = int.from_bytes(os.urandom(10), "big")
    value = ((millis & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | (random >> 68) << 64
             | 0b10 << 62 | random & _RANDOM_62)
    return uuid.UUID(int=value)
