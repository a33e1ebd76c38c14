"""Class-data archives for the stack's JVMs, recorded once at set-up.

A broker and a Connect worker each load and verify thousands of classes from the jars before
they serve; with an archive of them (Java's application class-data sharing) they map it
instead and start sooner, which tests and drills that start stacks or restart nodes feel
most. ``build_stack_archives`` records them on a throwaway stack; ``java.class_data_options``
hands them to every later start.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from eventfold.contract.class_data import (
    clear_abandoned_recordings,
    keep_recording,
    recording_of,
)
from eventfold.local_stack.java import STACK_ROLES, class_archive
from eventfold.local_stack.stack import LocalStack

log = logging.getLogger(__name__)


def build_stack_archives(force: bool = False) -> tuple[list[Path], float | None]:
    """The archives of the broker and the Connect worker, recorded unless present (or
    ``force``): a stack started in a temporary directory whose JVMs write, as they stop, the
    classes they loaded. With the seconds it took, None when they were present."""
    archives = [class_archive(role) for role in STACK_ROLES]
    if all(archive.is_file() for archive in archives) and not force:
        return archives, None
    for archive in archives:
        clear_abandoned_recordings(archive)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="eventfold-class-data-") as scratch:
        stack = LocalStack(Path(scratch) / "stack", record_classes=True)
        try:
            stack.up()
        finally:
            stack.down()  # SIGTERM: each JVM writes its recording as it exits
    for archive in archives:
        keep_recording(recording_of(archive), archive)
    log.info("class-data archives of the broker and Connect recorded")
    return archives, time.monotonic() - started
