#!/usr/bin/env bash
# Build (or refresh) the project's virtual environments from pinned versions.
#   .venv          the project: eas_sdk + gateway + dev tools      (requirements/constraints.txt;
#                  dev brings every light extra, OpenCV's headless wheel (images-cv) included),
#                  and the model runtimes' extras (torch, tensorflow, pmml)
#   .venv-py312    the same on Python 3.12, and .venv-py313 on 3.13 (the suite runs on each
#                  Python that requires-python allows; same constraints file)
#   .venv-eas      the public eas-prediction 0.36 client, for compatibility tests
#   .venv-codegen  protoc for regenerating eas_sdk/_proto
#   .venv-clients  tritonclient[http,grpc] and kserve, for compatibility tests
#   .venv-mlserver MLServer's V2 types, for compatibility tests, and its scikit-learn, XGBoost
#                  and LightGBM runtimes, for benchmarks/bench_runtimes.py
#   .venv-bigdl    the public bigdl-serving 2.4.0 client (Cluster Serving on Redis), for compatibility tests
#   .venv-paddle   Paddle Serving's PipelineClient (paddle-serving-server 0.9.0), for compatibility tests
#   .venv-deploy   kubernetes-validate, for checking deploy/kubernetes/ against the schemas offline
# It also installs redis-server (the queue's Redis backend is tested against a real one)
# from the distribution's packages when it is missing.
# Each is rebuilt only when its pin files change (a stamp holds their hash).
set -euo pipefail
cd "$(dirname "$0")/.."

export PIP_DISABLE_PIP_VERSION_CHECK=1

# find_python X.Y: print an interpreter that really is Python X.Y, or nothing.
# $PYTHON<XY> (PYTHON312=...) wins; then pyenv's versions folder (newest patch release
# first), then PATH. Each candidate is run, because a pyenv shim is on PATH even for
# a version that is not installed.
find_python() {
  local want="$1" override cand
  override="PYTHON${want/./}"
  local -a cands=()
  [[ -n "${!override:-}" ]] && cands+=("${!override}")
  local root="${PYENV_ROOT:-$HOME/.pyenv}"
  if [[ -d "$root/versions" ]]; then
    while IFS= read -r cand; do
      cands+=("$cand")
    done < <(find "$root/versions" -mindepth 3 -maxdepth 3 -path "*/bin/python$want" 2>/dev/null | sort -rV)
  fi
  cands+=("python$want")
  for cand in "${cands[@]}"; do
    if "$cand" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$want'.split('.'))))" \
      >/dev/null 2>&1; then
      printf '%s\n' "$cand"
      return 0
    fi
  done
}

PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  for cand in python3.11 python3.12 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY="$cand"; break; fi
  done
fi

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

build_venv() {  # dir, stamp, install-args...  (with the interpreter in $PY)
  local dir="$1" stamp="$2"; shift 2
  if [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$stamp" ]]; then
    return 0
  fi
  echo "setup: building $dir with $PY" >&2
  local started=$SECONDS
  rm -rf "$dir"
  "$PY" -m venv "$dir"
  "$dir/bin/python" -m pip install -q "$@" 2> >(grep -v "^WARNING: Location" >&2)
  echo "$stamp" > "$dir/.stamp"
  echo "setup: built $dir in $((SECONDS - started)) s" >&2
}

build_venv .venv "$(stamp_of requirements/constraints.txt pyproject.toml)" \
  -c requirements/constraints.txt -e ".[dev]"

# The project again on every other Python that requires-python allows (scripts/test.sh
# runs the suite on each). The interpreter's full version is part of the stamp, so a
# new patch release rebuilds. EXTRA_PYTHONS="" skips them on a machine without them.
for minor in ${EXTRA_PYTHONS-3.12 3.13}; do
  dir=".venv-py${minor/./}"
  extra_py="$(find_python "$minor")"
  if [[ -z "$extra_py" ]]; then
    echo "setup: no Python $minor found (pyenv, PATH or PYTHON${minor/./}); $dir not built" >&2
    continue
  fi
  PY="$extra_py" build_venv "$dir" \
    "$(stamp_of requirements/constraints.txt pyproject.toml <("$extra_py" -VV))" \
    -c requirements/constraints.txt -e ".[dev]"
done
# The model runtimes' extras (torch, tensorflow, pmml) in .venv only: torch's pinned CPU build
# is a wheel for Python 3.11 on this machine's wheel store (on another Python pip would fetch a
# CUDA build of several GB), and tensorflow-cpu is about 1.3 GB. Their tests skip where absent,
# but under CI (CI set; .ci/run sets it) one missing from .venv fails them: it is installed
# here. On .venv-py312 and .venv-py313 they skip, under CI too (tests/runtime_libraries.py).
runtimes_stamp="$(stamp_of requirements/constraints.txt pyproject.toml)"
if [[ "$(cat .venv/.stamp-runtimes 2>/dev/null)" != "$runtimes_stamp" ]]; then
  echo "setup: installing the model runtimes (torch, tensorflow, pmml) in .venv" >&2
  started=$SECONDS
  .venv/bin/python -m pip install -q -c requirements/constraints.txt -e ".[torch,tensorflow,pmml]" \
    2> >(grep -v "^WARNING: Location" >&2)
  echo "$runtimes_stamp" > .venv/.stamp-runtimes
  echo "setup: installed the model runtimes in $((SECONDS - started)) s" >&2
fi

build_venv .venv-eas "$(stamp_of requirements/eas-reference.txt)" \
  -r requirements/eas-reference.txt
build_venv .venv-codegen "$(stamp_of requirements/codegen.txt)" \
  -r requirements/codegen.txt
build_venv .venv-clients "$(stamp_of requirements/clients.txt)" \
  -r requirements/clients.txt
build_venv .venv-mlserver "$(stamp_of requirements/mlserver.txt requirements/mlserver-runtimes.txt)" \
  -r requirements/mlserver.txt
# MLServer's runtimes for scikit-learn, XGBoost and LightGBM without their dependencies:
# mlserver-xgboost asks for the xgboost wheel (NCCL for GPUs, hundreds of MB); mlserver.txt has
# XGBoost's CPU build, which is the same module.
if ! .venv-mlserver/bin/python -c "import mlserver_sklearn, mlserver_xgboost, mlserver_lightgbm" 2>/dev/null; then
  .venv-mlserver/bin/python -m pip install -q --no-deps -r requirements/mlserver-runtimes.txt \
    2> >(grep -v "^WARNING: Location" >&2)
fi
build_venv .venv-bigdl "$(stamp_of requirements/bigdl.txt)" \
  -r requirements/bigdl.txt
# Without dependencies: requirements/paddle.txt pins every one (the package's own bounds
# have no builds for this Python).
build_venv .venv-paddle "$(stamp_of requirements/paddle.txt)" \
  --no-deps -r requirements/paddle.txt
build_venv .venv-deploy "$(stamp_of requirements/deploy.txt)" \
  -r requirements/deploy.txt

if ! command -v redis-server >/dev/null 2>&1; then
  echo "setup: installing redis-server" >&2
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq && $sudo_cmd apt-get install -y -qq redis-server >/dev/null
fi

# The fault suite across hosts (tests/faults) makes network namespaces, nft rules and tc
# qdiscs, and steps a gateway's clock with libfaketime: iproute2, nftables and faketime
# from the distribution's packages, when missing.
if ! command -v nft >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1 \
  || ! ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1; then
  echo "setup: installing iproute2, nftables and faketime" >&2
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq && $sudo_cmd apt-get install -y -qq iproute2 nftables faketime >/dev/null
fi
