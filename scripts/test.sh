#!/usr/bin/env bash
# Sets everything up, checks the code (ruff, mypy --strict on the package), then runs the
# test suite on the real stack, in three workers (pytest-xdist: each with a stack of its own,
# a test module's tests on one worker). Every tier by default (unit, stack, drill:
# docs/testing.md); --fast runs unit and stack only. Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
tiers=()
args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then tiers=(-m "not drill"); else args+=("$arg"); fi
done
bash scripts/setup.sh
.venv/bin/ruff check .
bash scripts/typecheck.sh
exec .venv/bin/python -m pytest -n "${EVENTFOLD_TEST_WORKERS:-3}" --dist loadfile \
  "${tiers[@]}" "${args[@]}"
