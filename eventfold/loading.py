"""Finding the application's code, as uvicorn finds an ASGI app.

``EVENTFOLD_APP`` names ``module:attribute``. The module is imported from the working
directory, from ``--app-dir`` / ``EVENTFOLD_APP_DIR`` when given (searched first), then from
the installed packages: a console script such as ``.venv/bin/eventfold`` does not have the
working directory on ``sys.path`` by itself, unlike ``python -m``. The same directories reach
every process that imports the app's code: HTTP workers (spawned children inherit
``sys.path``) and Spark's Python workers and executors (``spark.executorEnv.PYTHONPATH``).

Importing nothing heavy: the CLI asks for the search path before it loads Spark or FastAPI.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType


class AppNotFound(ImportError):
    """The application's module cannot be imported: the message names where it looked."""


def app_directories(app_dir: str | Path = "") -> list[Path]:
    """Where the application's module is searched before the installed packages: the
    configured directory (if any), then the working directory."""
    directories = [Path(app_dir).resolve()] if str(app_dir) else []
    working = Path.cwd().resolve()
    if working not in directories:
        directories.append(working)
    return directories


def add_to_path(directories: list[Path]) -> None:
    """Put ``directories`` first on ``sys.path`` (in their order), once each."""
    for directory in reversed(directories):
        entry = str(directory)
        if entry in sys.path:
            sys.path.remove(entry)
        sys.path.insert(0, entry)


def python_path(directories: list[Path], existing: str | None = None) -> str:
    """A ``PYTHONPATH`` holding ``directories`` before what ``existing`` holds."""
    entries = [str(d) for d in directories]
    entries += [e for e in (existing or "").split(os.pathsep) if e and e not in entries]
    return os.pathsep.join(entries)


def import_app_module(spec: str, app_dir: str | Path = "") -> tuple[ModuleType, str]:
    """The module ``spec`` (``module:attribute``) names, imported from the app directories
    first, and the attribute's name (``app`` when the spec names none)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name:
        raise AppNotFound(f"EVENTFOLD_APP={spec!r} names no module; write module:attribute, "
                          "e.g. myapp:app")
    directories = app_directories(app_dir)
    add_to_path(directories)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not _is_prefix(exc.name, module_name):
            raise  # the app's own module failed to import one of its dependencies
        searched = ", ".join(str(d) for d in directories)
        raise AppNotFound(
            f"no module named {exc.name!r} in {searched} or the installed packages (searched "
            f"for EVENTFOLD_APP={spec!r}); run from the directory that holds it, or name "
            "that directory with --app-dir or EVENTFOLD_APP_DIR") from None
    return module, attribute or "app"


def _is_prefix(missing: str, module_name: str) -> bool:
    """Whether the missing module is ``module_name`` or one of its parent packages."""
    return module_name == missing or module_name.startswith(missing + ".")
