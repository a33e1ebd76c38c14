"""The process that runs an API's HTTP workers: it starts them, starts another in the place
of one that dies, passes SIGTERM/SIGINT on and waits for them to drain, then removes the
directories they shared.

``serve_forever`` replaces its own process with this one (exec) once it has checked the
app, so the process that stays up beside the workers imports almost nothing: it holds a few
MB, where the CLI that loaded the app held an app's worth (docs/benchmarks.md). Run as
``python -m eventfold.supervisor FACTORY HOST PORT WORKERS LOG_LEVEL LOG_FORMAT [SHARED...]``.

A worker that dies (killed, or out of memory) is replaced at once and the death is logged
and counted (``eventfold_http_worker_restarts_total``, on every worker's ``/metrics``: the
tally is a file in the directory the workers share, so that this process need not load a
metrics library). A
worker that dies soon after it started is replaced after a pause that doubles each time
(an app that cannot start must not spin); after ``GIVE_UP_AFTER`` such deaths in a row the
supervisor stops the others and exits 1.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from eventfold.contract.backoff import doubled
from eventfold.logs import configure_logging

log = logging.getLogger("eventfold.serving")

_WORKER = ("import sys; from eventfold.supervisor import stop_with_the_supervisor; "
           "stop_with_the_supervisor(int(sys.argv[1])); "
           "from eventfold.serving import serve_worker; serve_worker(*sys.argv[2:])")
_WATCH_S = 0.2
SETTLED_S = 10.0
"""A worker that lived this long had started: its death is not the app failing to start."""
FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 10.0
GIVE_UP_AFTER = 6
"""Workers dead within ``SETTLED_S`` of their start, in a row, before the supervisor stops."""

RESTARTS_FILE = "worker_restarts.json"
"""In the workers' shared directory: workers started in the place of one that died, by how
it died (an exit code, or the signal that killed it)."""


def read_restarts(shared: Path) -> dict[str, int]:
    """The tally in ``shared`` (empty: no worker has died)."""
    try:
        return {str(k): int(v) for k, v in json.loads((shared / RESTARTS_FILE).read_text())
                .items()}
    except (FileNotFoundError, ValueError):
        return {}


def main(argv: list[str]) -> int:
    factory, host, port, workers, level, log_format, *shared = argv
    configure_logging(level, log_format)
    try:
        return supervise(factory, host, int(port), int(workers),
                         Path(shared[0]) if shared else None)
    finally:
        for directory in shared:
            shutil.rmtree(directory, ignore_errors=True)


@dataclass
class _Slot:
    """One worker's place: the process in it, when it started, and its recent failures."""

    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    quick_deaths: int = 0
    restart_at: float = 0.0


class Supervisor:
    def __init__(self, factory: str, host: str, port: int, workers: int,
                 shared: Path | None = None) -> None:
        self.command = [sys.executable, "-c", _WORKER, str(os.getpid()), factory, host,
                        str(port)]
        # A worker imports what this process could (the app's directory, say), as a child
        # spawned by multiprocessing would.
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.slots = [_Slot() for _ in range(workers)]
        self.stopping = threading.Event()
        self.shared = shared
        self.restarts: dict[str, int] = {}

    def run(self) -> int:
        """Until a stop signal (0 once every worker has drained), or until workers cannot
        start (1)."""
        for slot in self.slots:
            self._start(slot)
        while not self.stopping.wait(_WATCH_S):
            if not self._watch():
                self._stop_all()
                return 1
        self._stop_all()
        return 0

    def _watch(self) -> bool:
        """One look at every worker: a dead one's place is filled (now, or after its pause);
        False when workers cannot start."""
        for number, slot in enumerate(self.slots):
            if slot.process is None:
                if time.monotonic() >= slot.restart_at:
                    self._start(slot)
                continue
            code = slot.process.poll()
            if code is not None and not self.stopping.is_set() and not self._replace(
                    number, slot, code):
                return False
        return True

    def stop(self, signum: int, _: FrameType | None = None) -> None:
        log.info("signal %d received", signum)
        self.stopping.set()
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                slot.process.terminate()  # SIGTERM: each worker drains its in-flight requests

    def _start(self, slot: _Slot) -> None:
        # No preexec_fn: with one, Python forks (not vfork) and runs Python code in the child
        # before exec, which in a process with threads (a library's) can crash the child.
        slot.process = subprocess.Popen(self.command, env=self.env)
        slot.started_at = time.monotonic()

    def _replace(self, number: int, slot: _Slot, code: int) -> bool:
        """Note a worker's death and when its place is filled again; False to give up."""
        assert slot.process is not None
        died = f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
        lived_s = time.monotonic() - slot.started_at
        _forget_samples_of(slot.process.pid)
        self._count(died)
        slot.process = None
        slot.quick_deaths = slot.quick_deaths + 1 if lived_s < SETTLED_S else 0
        if slot.quick_deaths >= GIVE_UP_AFTER:
            log.error("HTTP worker %d died %d times within %.0f s of starting (last: %s); "
                      "stopping", number, slot.quick_deaths, SETTLED_S, died)
            return False
        pause = doubled(FIRST_PAUSE_S, slot.quick_deaths, MAX_PAUSE_S)
        slot.restart_at = time.monotonic() + pause
        log.error("HTTP worker %d exited (%s) after %.1f s; starting another%s", number, died,
                  lived_s, f" in {pause:.1f} s" if pause else "")
        return True

    def _count(self, died: str) -> None:
        self.restarts[died] = self.restarts.get(died, 0) + 1
        if self.shared is not None:
            staged = self.shared / f".{RESTARTS_FILE}"
            staged.write_text(json.dumps(self.restarts))
            os.replace(staged, self.shared / RESTARTS_FILE)

    def _stop_all(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                slot.process.terminate()
        for slot in self.slots:
            if slot.process is not None:
                slot.process.wait()


_PR_SET_PDEATHSIG = 1


def stop_with_the_supervisor(supervisor_pid: int) -> None:
    """First thing in a worker (Linux): SIGTERM when the supervisor dies, however it dies, so
    that no worker is left holding the port with nobody to stop it. A supervisor that died
    before the worker asked has already left it to another parent: the worker stops now."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != supervisor_pid:
        os.kill(os.getpid(), signal.SIGTERM)


def _forget_samples_of(pid: int) -> None:
    """A dead worker's live gauges (requests in progress) leave the sums: its files of them
    go, as prometheus_client's ``mark_process_dead`` does."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        for path in Path(directory).glob(f"gauge_live*_{pid}.db"):
            path.unlink(missing_ok=True)


def supervise(factory: str, host: str, port: int, workers: int,
              shared: Path | None = None) -> int:
    supervisor = Supervisor(factory, host, port, workers, shared)
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    code = supervisor.run()
    if code == 0:
        log.info("HTTP server on %s:%d stopped cleanly", host, port)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
