"""Eventfold's wheel, built the way a user builds it, for tests that install or ship it."""

from __future__ import annotations

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
