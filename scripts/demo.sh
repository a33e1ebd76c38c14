#!/usr/bin/env bash
# Sets everything up, then runs the inventory example end to end on the local stack.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/eventfold demo
