#!/usr/bin/env bash
# One command: set up a fresh machine and run lint plus the test suite on every Python
# that requires-python allows: the whole suite on 3.11 (.venv), then a subset of it on
# 3.12 and 3.13 (.venv-py312, .venv-py313; built by scripts/setup.sh). Arguments given
# here replace the suite and the subset: they go to pytest on each Python. Every run
# happens even when an earlier one fails; the closing lines say how each went, and the
# exit status is non-zero when any failed.
#   EXTRA_PYTHONS="3.12"   the Pythons to run besides 3.11 ("" for none)
#   EXTRA_WHOLE=1          the whole suite on them too
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The status page is tested in a real browser: Debian's chromium and its driver.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  { $sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium chromium-driver >/dev/null; } \
    || echo "test.sh: could not install chromium; the browser test will be skipped" >&2
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .

# The subset for 3.12 and 3.13. The whole suite three times took 39 minutes on a busy
# 2-core machine (about 8 to 15 minutes a Python, plus 4 for the environments), too close
# to CI's target; this takes about 60% of the whole. What differs between Pythons is the
# interpreter under our code (asyncio, ssl, sqlite3, the compiled wheels), so it keeps
# every unit test, the predict, direct, fault, gRPC and KServe paths end to end, the whole
# queue end to end (disconnects included) and the wheel's install. It leaves out the
# reference clients' runs (compat: they run in their own 3.11 environments, the same on
# every pass), the slow and load runs, and the end-to-end runs of pipelines, samples, the
# CLI and service management, which exercise the same interpreter paths again.
SUBSET=(
  -m "not slow and not load and not compat"
  tests/sdk tests/gateway tests/e2e/queue
  tests/e2e/test_predict_e2e.py tests/e2e/test_direct_e2e.py tests/e2e/test_faults_e2e.py
  tests/e2e/test_grpc_e2e.py tests/e2e/test_kserve_e2e.py
  tests/test_packaging.py
)

results=()
failed=0
run_suite() {  # label, python, pytest-args...
  local label="$1" python="$2"; shift 2
  local started=$SECONDS rc=0
  echo "test.sh: ===== $label ====="
  "$python" -m pytest "$@" || rc=$?
  local took=$((SECONDS - started))
  if [[ $rc -eq 0 ]]; then
    results+=("passed  $label, ${took} s")
  else
    results+=("FAILED  $label, ${took} s (pytest exit status $rc)")
    failed=1
  fi
}

if [[ $# -gt 0 ]]; then
  run_suite "Python 3.11: pytest $*" .venv/bin/python "$@"
else
  run_suite "Python 3.11: whole suite" .venv/bin/python
fi
for minor in ${EXTRA_PYTHONS-3.12 3.13}; do
  venv=".venv-py${minor/./}"
  if [[ ! -x "$venv/bin/python" ]]; then
    results+=("FAILED  Python $minor: no $venv (scripts/setup.sh found no Python $minor; EXTRA_PYTHONS=\"\" skips it)")
    failed=1
  elif [[ $# -gt 0 ]]; then
    run_suite "Python $minor: pytest $*" "$venv/bin/python" "$@"
  elif [[ -n "${EXTRA_WHOLE:-}" ]]; then
    run_suite "Python $minor: whole suite" "$venv/bin/python"
  else
    run_suite "Python $minor: subset (see scripts/test.sh)" "$venv/bin/python" "${SUBSET[@]}"
  fi
done

# The last pytest summary speaks for its own run only: this says how every run went.
echo "test.sh: ===== results ====="
printf 'test.sh: %s\n' "${results[@]}"
if [[ $failed -ne 0 ]]; then
  echo "test.sh: FAILED: $(printf '%s\n' "${results[@]}" | grep -c '^FAILED') of ${#results[@]} runs failed"
  exit 1
fi
echo "test.sh: passed: all ${#results[@]} runs"
