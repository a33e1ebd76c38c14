"""The layout the design promises: one installed namespace, data flowing one way."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("write_model", "outbox", "projections", "read_api", "migrations", "local_stack")
SHARED = {"contract"}
ALLOWED = {
    "write_model": SHARED,
    "outbox": SHARED | {"write_model"},
    "projections": SHARED | {"outbox"},
    "read_api": SHARED | {"projections", "outbox"},
    "migrations": SHARED | {"write_model"},
    "local_stack": set(),
}
"""What each package may import of the others (its docstring says the same); every layer
shares ``eventfold.contract``, and nothing but the composition root imports the rest of
``eventfold``."""


def _imports_of(package: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "eventfold" and len(parts) > 1:
                    found.add(parts[1])
                elif parts[0] in PACKAGES:
                    found.add(f"top-level {parts[0]}")
    return found - {package}


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_what_its_docstring_allows(package: str) -> None:
    imported = _imports_of(package)
    assert imported <= ALLOWED[package], (
        f"{package} imports {sorted(imported - ALLOWED[package])}")


def test_the_packages_load_under_the_eventfold_namespace_only() -> None:
    code = ("import sys, eventfold.app, eventfold.cli, eventfold.read_api.http, "
            "eventfold.projections.runner, eventfold.local_stack, eventfold.migrations; "
            f"print(sorted(n for n in sys.modules if n.split('.')[0] in {PACKAGES!r}))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=ROOT).stdout.strip()
    assert loaded == "[]"


def test_the_wheel_holds_one_namespace_and_its_data(tmp_path: Path) -> None:
    # Built from a copy: setuptools leaves build/ and egg-info beside the sources it builds.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".eventfold", "jars", "build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(source)], check=True, capture_output=True)
    [wheel] = tmp_path.glob("eventfold-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    version = wheel.name.split("-")[1]
    assert {n.split("/")[0] for n in names} == {"eventfold", f"eventfold-{version}.dist-info"}
    for expected in ("eventfold/py.typed", "eventfold/migrations/script.py.mako",
                     "eventfold/migrations/versions/0001_event_store.py",
                     "eventfold/local_stack/pom.xml", "eventfold/outbox/__init__.py"):
        assert expected in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
