"""An exclusive lock on a file that one process of an instance holds until it exits.

The HTTP workers of one read API instance agree on who writes a store and who leads the
instance's background work this way: the kernel lets go of a ``flock`` when its process
dies, however it dies, so the next worker to try takes over without any timeout.
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO


def try_exclusive(path: Path) -> IO[bytes] | None:
    """The open lock file if this process now holds ``path``'s lock; None if another does.

    Keep the handle open for as long as the lock should hold: closing it lets go."""
    handle = path.open("ab")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle
