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


def readme_commands() -> list[str]:
    """The commands the README begins with (its first code block, comments dropped): set up
    and run the demo, then run the tests."""
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
