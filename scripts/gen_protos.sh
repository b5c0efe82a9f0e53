#!/usr/bin/env bash
# Regenerates brorl/v1/*_pb2*.py from protos/ (committed; tests/unit/test_protos.py checks they are current).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.}
python3 -m grpc_tools.protoc -I protos --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" protos/brorl/v1/*.proto
