#!/usr/bin/env bash
# Sets everything up, checks the code with ruff, then runs the whole test suite (unit and
# integration on the real stack).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
