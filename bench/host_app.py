"""The app of bench/host.py: ``EVENTFOLD_BENCH_PROJECTIONS`` copies of the projection
benchmark's fold over the same topic, named ``bench_totals_<EVENTFOLD_BENCH_SUFFIX>_<n>`` (one
suffix per phase, so that each phase folds from the start); and the same fold over a topic of
its own (``BACKLOG_SOURCE``), ``bench_backlog_<suffix>``, which the benchmark gives a backlog
to catch up while the others stay live."""

from __future__ import annotations

import dataclasses
import os

from bench.projections import bench_totals, renamed
from eventfold import Eventfold

BACKLOG_SOURCE = "BenchBacklog"

SUFFIX = os.environ.get("EVENTFOLD_BENCH_SUFFIX", "x")

app = Eventfold("bench_host")
for n in range(int(os.environ.get("EVENTFOLD_BENCH_PROJECTIONS", "10"))):
    app.projections.add(renamed(bench_totals, f"{SUFFIX}_{n}"))
app.projections.add(dataclasses.replace(bench_totals, name=f"bench_backlog_{SUFFIX}",
                                        sources=(BACKLOG_SOURCE,), table="", ktable_topic=""))
