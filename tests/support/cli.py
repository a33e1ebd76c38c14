"""Running the ``eventfold`` CLI as people do, in processes of its own, on the test session's
stack; and reading what those processes report (``/metrics``, ``status --json``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from eventfold.local_stack.process import stop_pid

Samples = list[tuple[str, dict[str, str], float]]


def eventfold(*args: str, env: dict[str, str],
              timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eventfold.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def stack_env(settings, tmp_path, **extra: str) -> dict[str, str]:
    """The environment a CLI process needs to use the test session's stack."""
    return {**os.environ, "EVENTFOLD_DATABASE_URL": settings.database_url,
            "EVENTFOLD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "EVENTFOLD_CONNECT_URL": settings.connect_url,
            "EVENTFOLD_STATE_DIR": str(tmp_path / "state"), **extra}


def start_serving(api: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    """``eventfold serve api`` (commands, reads) logging to ``log``; the caller stops it."""
    return subprocess.Popen([sys.executable, "-m", "eventfold.cli", "serve", api], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


@contextmanager
def cli_processes(env: dict[str, str], tmp_path, *commands: list[str]) -> Iterator[list]:
    """``eventfold`` processes running ``commands``, each logging to tmp_path/process<n>.log;
    stopped by PID when the block ends."""
    processes = []
    try:
        for n, args in enumerate(commands):
            log = (tmp_path / f"process{n}.log").open("w")
            processes.append(subprocess.Popen([sys.executable, "-m", "eventfold.cli", *args],
                                              env=env, stdout=log, stderr=subprocess.STDOUT))
        yield processes
    finally:
        for process in processes:
            stop_pid(process.pid, what="eventfold process", timeout_s=90)


def scrape(url: str) -> Samples:
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200, response.text[:500]
    assert response.headers["content-type"].startswith("text/plain")
    return [(s.name, s.labels, s.value)
            for family in text_string_to_metric_families(response.text)
            for s in family.samples]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(value for sample, found, value in samples
               if sample == name and labels.items() <= found.items())


def status_json(env: dict[str, str], *args: str) -> tuple[int, dict]:
    done = eventfold("status", "--json", *args, env=env, timeout=120)
    assert done.returncode in (0, 3, 4, 5), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)
