#!/usr/bin/env bash
# Type-checks the installed namespace with mypy. The repository keeps the design's top-level
# folders and setuptools maps them under eventfold at install time, which a type checker does
# not follow; so mypy reads a tree of links laid out as the wheel is (.eventfold/typecheck).
set -euo pipefail
cd "$(dirname "$0")/.."
tree=.eventfold/typecheck
rm -rf "$tree"
mkdir -p "$tree/eventfold"
for path in eventfold/*; do
  ln -s "$PWD/$path" "$tree/eventfold/"
done
for package in write_model outbox projections read_api reactions migrations local_stack; do
  ln -s "$PWD/$package" "$tree/eventfold/$package"
done
cd "$tree"
exec "$OLDPWD/.venv/bin/mypy" --config-file "$OLDPWD/pyproject.toml" -p eventfold "$@"
