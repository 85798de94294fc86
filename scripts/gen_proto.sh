#!/usr/bin/env bash
# Regenerate eas_sdk/_proto/*_pb2.py and .pyi from proto/ with the pinned protoc.
# Usage: scripts/gen_proto.sh [OUTPUT_ROOT]   (default: the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.}"
py=".venv-codegen/bin/python"
[[ -x "$py" ]] || bash scripts/setup.sh
mkdir -p "$out/eas_sdk/_proto"
"$py" -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" proto/eas_sdk/_proto/*.proto
