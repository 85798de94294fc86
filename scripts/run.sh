#!/usr/bin/env bash
# One command: set up a fresh machine and run the main job — the gateway serving the
# samples (a real ONNX model and a Python processor) with every sample client calling it.
#   bash scripts/run.sh            run the demo and stop
#   bash scripts/run.sh --serve    leave the gateway running on the port in samples/services.yaml;
#                                  Ctrl-C or kill (SIGINT, SIGTERM) stops it with its workers
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python samples/run_demo.py "$@"
