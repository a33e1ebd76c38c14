"""An app module is imported by every CLI command; most (verify-log, dlq, status, stack) run
no Spark and no read API, so importing an app must not load them (about 100 MB a process)."""

from __future__ import annotations

import json
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
