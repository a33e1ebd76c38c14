"""Which HTTP worker of a read API instance does the instance's background work.

``serve reads`` with several HTTP workers runs them as processes of one instance. What is
about the instance rather than a request (polling the projection registry, checkpoints and
end offsets for freshness, and the membership heartbeat) is done by one of them, the lead:
the worker holding the lock in the directory the workers share. The lead publishes what it
found there, one file per kind, each replaced atomically; the other workers read those
files instead of asking Postgres and Kafka themselves. When the lead dies its lock goes with
it, and the next worker to try takes it over.

A worker alone (no shared directory) always leads and publishes nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import IO

from eventfold.read_api.state.locks import try_exclusive

log = logging.getLogger(__name__)

FOLLOW_S = 0.2
"""How often a worker that does not lead reads what the lead published (and tries to lead)."""


class WorkerLead:
    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._handle: IO[bytes] | None = None
        self._seen: dict[str, tuple[int, int]] = {}

    @property
    def alone(self) -> bool:
        return self.directory is None

    def leads(self) -> bool:
        """Whether this worker leads, taking the lead if no worker holds it."""
        if self.directory is None:
            return True
        with self._lock:
            if self._handle is None:
                handle = try_exclusive(self.directory / "lead.lock")
                if handle is None:
                    return False
                self._handle = handle  # held until this process exits
                log.info("this worker (pid %d) leads the instance's background work",
                         os.getpid())
            return True

    def publish(self, kind: str, body: bytes) -> None:
        """The lead: replace what the other workers read of ``kind``."""
        if self.directory is None:
            return
        path = self.directory / f"{kind}.json"
        staged = path.with_name(f".{kind}.{os.getpid()}.{threading.get_ident()}")
        staged.write_bytes(body)
        os.replace(staged, path)

    def withdraw(self, kind: str) -> None:
        """Delete what was published of ``kind``."""
        if self.directory is not None:
            (self.directory / f"{kind}.json").unlink(missing_ok=True)

    def every(self, prefix: str) -> dict[str, bytes]:
        """Everything published whose kind starts with ``prefix``, by kind."""
        if self.directory is None:
            return {}
        found = {}
        for path in self.directory.glob(f"{prefix}*.json"):
            try:
                found[path.name.removesuffix(".json")] = path.read_bytes()
            except FileNotFoundError:
                continue  # withdrawn since the listing
        return found

    def latest(self, kind: str) -> bytes | None:
        """What the lead last published of ``kind``, if it changed since this worker last
        read it; else None."""
        if self.directory is None:
            return None
        path = self.directory / f"{kind}.json"
        try:
            with path.open("rb") as published:
                stat = os.fstat(published.fileno())
                version = (stat.st_ino, stat.st_mtime_ns)
                if self._seen.get(kind) == version:
                    return None
                body = published.read()
        except FileNotFoundError:
            return None
        self._seen[kind] = version
        return body
