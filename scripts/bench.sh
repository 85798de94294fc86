#!/usr/bin/env bash
# One command for every benchmark: set up, install the OS tools they compare against
# (wrk, redis-server) when missing, run each, and print their ratio tables.
#   bash scripts/bench.sh            full runs (about 10 minutes on 2 cores)
#   bash scripts/bench.sh --quick    smoke runs (a minute or two)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
need=()
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if ((${#need[@]})); then
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq && $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null
fi
export PYTHONUNBUFFERED=1
for bench in bench_codec bench_gateway bench_worker_hop bench_batching bench_queue bench_async bench_servers bench_grpc bench_kserve bench_pipeline; do
  if [[ -f "benchmarks/$bench.py" ]]; then
    echo; echo "=================== $bench ==================="
    .venv/bin/python "benchmarks/$bench.py" "$@"
  fi
done
