#!/usr/bin/env bash
# Build the Go example: Go code generated from protos/tidelog/v1 (by the
# grpcio-tools protoc in .venv with protoc-gen-go and protoc-gen-go-grpc from
# tools/go-tools.sh), then `go build`. The generated code is not committed:
# it is made here on every build (a second or so), and Go's build cache makes
# the rest quick when nothing changed.
# Usage: examples/go/build.sh [OUT_BINARY]   (default: .cache/examples/tidelog-go-example)
# Exits 3 with a message on stderr when `go` is not installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:-.cache/examples/tidelog-go-example}")
py=${PYTHON:-.venv/bin/python}
gobin=$(tools/go-tools.sh)

# The protos carry no go_package: map each file to the example's package.
pkg="tidelogexamples/tidelog/v1;tidelogv1"
mapfile -t protos < <(cd protos && ls tidelog/v1/*.proto)
opts=()
for p in "${protos[@]}"; do opts+=("--go_opt=M$p=$pkg" "--go-grpc_opt=M$p=$pkg"); done
gen=examples/go/tidelog/v1
rm -rf "$gen" && mkdir -p "$gen"
PATH="$gobin:$PATH" "$py" -m grpc_tools.protoc -I protos \
  --go_out=examples/go --go_opt=paths=source_relative \
  --go-grpc_out=examples/go --go-grpc_opt=paths=source_relative \
  "${opts[@]}" "${protos[@]}"
mkdir -p "$(dirname "$out")"
(cd examples/go && go build -o "$out" .)
echo "$out"
