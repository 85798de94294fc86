#!/usr/bin/env bash
# One command: set up a fresh machine and run lint plus the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
