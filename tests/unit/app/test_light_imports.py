"""An app module is imported by every CLI command; most (verify-log, dlq, status, stack) run
no Spark and no read API, so importing an app must not load them (about 100 MB a process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.packaging import ROOT

HEAVY = ("pyspark.sql", "pyarrow", "pandas", "eventfold.projections.runner",
         "eventfold.read_api")


def test_importing_an_app_loads_neither_spark_nor_pandas_nor_the_read_api() -> None:
    probe = ("import json, sys; import examples.inventory, examples.sales; "
             f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=ROOT, check=True)
    assert json.loads(loaded.stdout) == []


def test_a_read_api_worker_loads_neither_alembic_nor_spark() -> None:
    """Every HTTP worker of every read API instance builds this app: what it imports, each
    worker holds (Alembic and Mako alone are ~11 MB a process)."""
    probe = ("import json, sys; from eventfold.asgi import read_api; read_api(); "
             "print(json.dumps([m for m in ('alembic', 'mako', 'pyspark', 'pandas') "
             "if m in sys.modules]))")
    nowhere = {"EVENTFOLD_APP": "examples.inventory:app",
               "EVENTFOLD_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:9/none",
               "EVENTFOLD_KAFKA_BOOTSTRAP": "127.0.0.1:9",
               "EVENTFOLD_CONNECT_URL": "http://127.0.0.1:9"}
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=ROOT, check=True, env={**os.environ, **nowhere})
    assert json.loads(loaded.stdout) == []
