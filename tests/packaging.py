"""Eventfold's wheel, built the way a user builds it, for tests that install or ship it."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_wheel(out: Path) -> Path:
    """Build the wheel into ``out`` from a copy of the sources: setuptools leaves build/ and
    egg-info beside the sources it builds."""
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".eventfold", "jars", "build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(source)], check=True, capture_output=True,
                   timeout=300)
    shutil.rmtree(source)
    [wheel] = out.glob("eventfold-*.whl")
    return wheel


def wheel_of_this_run(run_dir: Path) -> Path:
    """The wheel, built once for the run whose temporary directory is ``run_dir`` (shared by
    its xdist workers: the first to ask builds it, under a lock, the others wait for it)."""
    out = run_dir / "wheel"
    out.mkdir(exist_ok=True)
    with (run_dir / "wheel.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if found := sorted(out.glob("eventfold-*.whl")):
            return found[0]
        return build_wheel(out)


def run_dir_of(basetemp: Path) -> Path:
    """The temporary directory of the whole run: an xdist worker's basetemp is one of its."""
    return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp


def readme_commands() -> list[str]:
    """The commands the README begins with (its first code block, comments dropped): set up
    and run the demo, then run the tests."""
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
