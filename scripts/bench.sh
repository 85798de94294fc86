#!/usr/bin/env bash
# One command for every benchmark: set up, install the OS tools they compare against
# (wrk, redis-server, valgrind) when missing, run each, and print their ratio tables.
#   bash scripts/bench.sh            full runs (about 10 minutes on 2 cores)
#   bash scripts/bench.sh --quick    smoke runs (a minute or two)
# Every benchmark runs whatever the others show: a missed target (or a failed run) is
# reported in the summary at the end, and only then does the script exit non-zero. Each
# benchmark's output is also kept in benchmarks/results/<name>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
need=()
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v valgrind >/dev/null 2>&1 || need+=(valgrind)  # bench_instructions counts under callgrind
if ((${#need[@]})); then
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq && $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null
fi
export PYTHONUNBUFFERED=1
mkdir -p benchmarks/results
rm -f benchmarks/results/bench_*.json
export EASKIT_BENCH_RESULTS=benchmarks/results  # each benchmark writes its targets there
results=()
failed=0
total=0
for bench in bench_codec bench_gateway bench_worker_hop bench_batching bench_queue bench_async bench_servers bench_grpc bench_kserve bench_pipeline bench_scaleout bench_autoscale bench_runtimes bench_instructions bench_dl_runtimes bench_tls bench_tracing; do
  [[ -f "benchmarks/$bench.py" ]] && total=$((total + 1))
done
n=0
for bench in bench_codec bench_gateway bench_worker_hop bench_batching bench_queue bench_async bench_servers bench_grpc bench_kserve bench_pipeline bench_scaleout bench_autoscale bench_runtimes bench_instructions bench_dl_runtimes bench_tls bench_tracing; do
  if [[ -f "benchmarks/$bench.py" ]]; then
    n=$((n + 1))
    log="benchmarks/results/$bench.log"
    echo; echo "=================== [$n/$total] $bench ($(date +%H:%M:%S)) ==================="
    start=$SECONDS
    .venv/bin/python "benchmarks/$bench.py" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    took=$((SECONDS - start))
    # A missed target: exit status 1, or a row marked MISS (or NO) in the benchmark's table.
    missed=$(grep -E '(^|[[:space:]])(MISS|NO)([[:space:]]|$)' "$log" | head -5 | sed 's/^ *//' | paste -sd ';' -)
    if ((rc != 0 && rc != 1)); then
      results+=("$bench|ERROR (exit $rc)|${took}s|$(tail -n 1 "$log")"); failed=1
    elif [[ -n "$missed" ]]; then
      results+=("$bench|MISS|${took}s|$missed"); failed=1
    elif ((rc == 1)); then
      results+=("$bench|FAIL (exit 1)|${took}s|$(tail -n 1 "$log")"); failed=1
    else
      results+=("$bench|pass|${took}s|")
    fi
  fi
done
echo; echo "=================== targets ==================="
.venv/bin/python benchmarks/summary.py benchmarks/results || failed=1
echo; echo "=================== summary ==================="
printf '%-18s %-16s %-6s %s\n' benchmark result time "missed targets / last line"
for row in "${results[@]}"; do
  IFS='|' read -r name result took detail <<<"$row"
  printf '%-18s %-16s %-6s %s\n' "$name" "$result" "$took" "$detail"
done
if ((failed)); then
  echo "bench.sh: at least one benchmark missed a target or failed (see above and benchmarks/results/)"
  exit 1
fi
echo "bench.sh: every target met"
