"""SIGTERM and Ctrl-C as a flag: a long-running command stops at its next step."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

log = logging.getLogger("eventfold")


def stop_on_signal(requested: threading.Event,
                   stopping: str = "stopping after the current batch") -> None:
    """SIGTERM and SIGINT (Ctrl-C) set ``requested``; the caller stops at its next step (a
    projection between batches)."""

    def handle(signum: int, _: FrameType | None) -> None:
        log.info("signal %d: %s", signum, stopping)
        requested.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
