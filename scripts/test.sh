#!/usr/bin/env bash
# Sets everything up, checks the code (ruff, mypy --strict on the package), then runs the
# whole test suite (unit and integration on the real stack).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
bash scripts/typecheck.sh
exec .venv/bin/python -m pytest "$@"
