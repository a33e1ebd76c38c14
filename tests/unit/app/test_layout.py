"""The layout the design promises: one installed namespace, data flowing one way."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from collections.abc import Container
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("write_model", "outbox", "projections", "read_api", "reactions", "migrations",
            "local_stack")
SHARED = {"contract"}
ALLOWED = {
    "write_model": SHARED,
    "outbox": SHARED | {"write_model"},
    "projections": SHARED | {"outbox"},
    "read_api": SHARED | {"projections", "outbox"},
    "reactions": SHARED | {"write_model", "outbox", "projections"},
    "migrations": SHARED | {"write_model"},
    "local_stack": SHARED,
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


RUNNING = {f"projections.{m}" for m in ("host", "host_wiring", "supervision", "batch",
                                         "replay_requests", "signals", "runner",
                                         "run_settings", "progress",
                                         "retention", "running_query",
                                         "stream_thread", "source_watch", "replay", "status",
                                         "metrics",
                                         "dead_letters", "testing")}
"""What runs a projection (the streaming query, replays, operations): nothing below imports it."""
LAYERS = {
    "write_model/domain": {"write_model.persistence", "write_model.commands", "write_model.http",
                           "write_model.openapi"},
    "write_model/persistence": {"write_model.commands", "write_model.http",
                                "write_model.openapi"},
    # projections: definition <- plan <- outcome <- state <- execution <- running it
    "projections/definition": {"projections.plan", "projections.outcome", "projections.state",
                               "projections.execution", *RUNNING},
    "projections/plan.py": {"projections.outcome", "projections.state", "projections.execution",
                            *RUNNING},
    "projections/outcome.py": {"projections.plan", "projections.state", "projections.execution",
                               *RUNNING},
    "projections/faults.py": {"projections.definition", "projections.plan", "projections.outcome",
                              "projections.state", "projections.execution", *RUNNING},
    "projections/state": {"projections.execution", *RUNNING},
    "projections/execution": RUNNING,
}
"""Inside a package, what a layer must not import: write_model's domain knows nothing of
storage or transport; a projection's definition nothing of how it runs."""


def _modules_imported(path: Path) -> set[str]:
    found: set[str] = set()
    files = path.rglob("*.py") if path.is_dir() else [path]
    for source in files:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module.removeprefix("eventfold."))
    return found


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_inside_packages_import_one_way(layer: str) -> None:
    imported = _modules_imported(ROOT / layer)
    forbidden = {m for m in imported if any(m == f or m.startswith(f"{f}.")
                                            for f in LAYERS[layer])}
    assert not forbidden, f"{layer} imports {sorted(forbidden)}"


def test_the_packages_load_under_the_eventfold_namespace_only() -> None:
    code = ("import sys, eventfold.app, eventfold.cli, eventfold.read_api.http, "
            "eventfold.projections.runner, eventfold.local_stack, eventfold.migrations; "
            f"print(sorted(n for n in sys.modules if n.split('.')[0] in {PACKAGES!r}))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=ROOT).stdout.strip()
    assert loaded == "[]"


def test_the_wheel_holds_one_namespace_and_its_data(eventfold_wheel: Path) -> None:
    wheel = eventfold_wheel
    names = zipfile.ZipFile(wheel).namelist()
    version = wheel.name.split("-")[1]
    assert {n.split("/")[0] for n in names} == {"eventfold", f"eventfold-{version}.dist-info"}
    for expected in ("eventfold/py.typed", "eventfold/dashboard.html",
                     "eventfold/migrations/script.py.mako",
                     "eventfold/migrations/versions/0001_event_store.py",
                     "eventfold/local_stack/pom.xml", "eventfold/outbox/__init__.py",
                     "eventfold/write_model/domain/events.py",
                     "eventfold/write_model/persistence/store.py",
                     "eventfold/projections/definition/aggregates.py"):
        assert expected in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # Every module of the source tree is in it (an editable install finds a package the
    # wheel leaves out; a Spark executor importing the wheel does not).
    for package in ("eventfold", *PACKAGES):
        for module in (ROOT / package).rglob("*.py"):
            inside = module.relative_to(ROOT / package).as_posix()
            assert ("eventfold/" + inside if package == "eventfold"
                    else f"eventfold/{package}/{inside}") in names


def test_a_spark_worker_loads_no_connector_side() -> None:
    """What a projection's Python worker imports leaves out the Connect client and requests:
    seconds of start-up for code it never runs."""
    code = ("import sys, eventfold.projections.execution.engine, "
            "eventfold.projections.execution.kafka_source; "
            "print(sorted(n for n in sys.modules if n == 'requests' "
            "or n.startswith(('eventfold.outbox.connector', 'eventfold.outbox.operations', "
            "'eventfold.write_model.commands', 'eventfold.write_model.http'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=ROOT).stdout.strip()
    assert loaded == "[]"


def _modules() -> dict[str, Path]:
    """Every module of the installed namespace, by its name under ``eventfold``."""
    found: dict[str, Path] = {}
    for base, folder in [("eventfold", ROOT / "eventfold"),
                         *((f"eventfold.{p}", ROOT / p) for p in PACKAGES)]:
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            found[".".join([base, *parts[:-1]] if parts[-1] == "__init__"
                           else [base, *parts])] = path
    return found


def _imports(name: str, path: Path, modules: Container[str]) -> set[str]:
    """The modules of the namespace that ``name`` imports anywhere in it: at the top, in a
    function, or for the type checker only."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([module] if module else [])])
            found.update(f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module
                         for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in modules and m != name}


def test_no_module_imports_itself_round_a_circle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as circle:
        pytest.fail(f"an import circle: {' -> '.join(circle.args[1])}")


MOST_LINES = 500


def test_no_module_of_the_namespace_is_over_500_lines() -> None:
    """A file doing several jobs is split by job; tests and migrations are exempt."""
    long = {str(path.relative_to(ROOT)): lines for path in _modules().values()
            if "migrations" not in path.parts
            and (lines := len(path.read_text().splitlines())) > MOST_LINES}
    assert not long, f"over {MOST_LINES} lines: {long}"


def test_users_import_everything_from_eventfold_and_each_name_loads() -> None:
    import eventfold
    import eventfold.projections

    assert sorted(eventfold.__all__) == sorted(eventfold._EXPORTED_FROM)
    for name in eventfold.__all__:
        assert getattr(eventfold, name) is not None
    engine = {"Plan", "Pipeline", "KeyState", "SourceRecord", "compile_projection"}
    assert not engine & set(eventfold.projections.__all__)
