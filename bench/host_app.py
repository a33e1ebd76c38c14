"""The app of bench/host.py: ``EVENTFOLD_BENCH_PROJECTIONS`` copies of the projection
benchmark's fold over the same topic, named ``bench_totals_<EVENTFOLD_BENCH_SUFFIX>_<n>`` (one
suffix per phase, so that each phase folds from the start)."""

from __future__ import annotations

import os

from bench.projections import bench_totals, renamed
from eventfold import Eventfold

SUFFIX = os.environ.get("EVENTFOLD_BENCH_SUFFIX", "x")

app = Eventfold("bench_host")
for n in range(int(os.environ.get("EVENTFOLD_BENCH_PROJECTIONS", "10"))):
    app.projections.add(renamed(bench_totals, f"{SUFFIX}_{n}"))
