"""The process that runs an API's HTTP workers: it starts them, passes SIGTERM/SIGINT on
and waits for them to drain, then removes the directories they shared.

``serve_forever`` replaces its own process with this one (exec) once it has checked the
app, so the process that stays up beside the workers imports almost nothing: it holds a few
MB, where the CLI that loaded the app held an app's worth (docs/benchmarks.md). Run as
``python -m eventfold.supervisor FACTORY HOST PORT WORKERS LOG_LEVEL LOG_FORMAT [SHARED...]``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from types import FrameType

from eventfold.logs import configure_logging

log = logging.getLogger("eventfold.serving")

_WORKER = "import sys; from eventfold.serving import serve_worker; serve_worker(*sys.argv[1:])"


def main(argv: list[str]) -> int:
    factory, host, port, workers, level, log_format, *shared = argv
    configure_logging(level, log_format)
    try:
        return supervise(factory, host, int(port), int(workers))
    finally:
        for directory in shared:
            shutil.rmtree(directory, ignore_errors=True)


def supervise(factory: str, host: str, port: int, workers: int) -> int:
    # A worker imports what this process could (the app's directory, say), as a child
    # spawned by multiprocessing would.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    processes = [subprocess.Popen([sys.executable, "-c", _WORKER, factory, host, str(port)],
                                  env=env) for _ in range(workers)]
    stopping = False

    def forward(signum: int, _: FrameType | None) -> None:
        nonlocal stopping
        log.info("signal %d received", signum)
        stopping = True
        for process in processes:
            if process.poll() is None:
                process.terminate()  # SIGTERM: each worker drains its in-flight requests

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [process.wait() for process in processes]
    if not stopping:
        log.error("HTTP workers exited on their own: %s", codes)
        return 1
    log.info("HTTP server on %s:%d stopped cleanly", host, port)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
