#!/usr/bin/env bash
# Regenerate the protobuf code from proto/ with the pinned protoc:
#   eas_sdk/_proto/*_pb2.py and .pyi    (the EAS wire formats)
#   gateway/_proto/*_pb2.py and .pyi    (the V2 gRPC service, Paddle's pipeline service) and
#                                       their grpc stubs (*_pb2_grpc.py)
# Usage: scripts/gen_proto.sh [OUTPUT_ROOT]   (default: the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.}"
py=".venv-codegen/bin/python"
[[ -x "$py" ]] || bash scripts/setup.sh
mkdir -p "$out/eas_sdk/_proto" "$out/gateway/_proto"
"$py" -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" proto/eas_sdk/_proto/*.proto
# The .proto files import each other by their path under proto/, so the generated code
# imports its siblings from the gateway._proto package.
"$py" -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" proto/gateway/_proto/*.proto
"$py" -m grpc_tools.protoc -Iproto --grpc_python_out="$out" proto/gateway/_proto/grpc_service.proto
# Paddle Serving's pipeline service (its PipelineClient's gRPC calls).
"$py" -m grpc_tools.protoc -Iproto --grpc_python_out="$out" proto/gateway/_proto/pipeline_service.proto
