"""Eventfold: the composition root that wires the pipeline's packages into one application.

Owns: the configuration object (environment variables), the ``Eventfold`` application entry
point, and the ``eventfold`` CLI.

May import: every other package (write_model, outbox, projections, read_api, migrations,
local_stack). No other package imports it, so the one-way data flow
write_model -> outbox -> (Kafka) -> projections -> read_api stays intact.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Eventfold", "Settings"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `import eventfold.config` does not pull in Spark and FastAPI.
    if name == "Eventfold":
        from eventfold.app import Eventfold

        return Eventfold
    if name == "Settings":
        from eventfold.config import Settings

        return Settings
    raise AttributeError(name)
