"""Running the same action from several threads at once."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_together(action: Callable[[], None], threads: int) -> None:
    """Start ``threads`` threads that each run ``action`` after a common barrier; join them."""
    barrier = threading.Barrier(threads)

    def run() -> None:
        barrier.wait()
        action()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
