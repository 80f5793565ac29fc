#!/usr/bin/env bash
# Build the Go tools the project uses, at pinned versions, from the Go module
# proxy into a cache under the repository (gitignored), only when missing:
#   grpcurl             runs the commands of docs/any-language.md (and their test)
#   protoc-gen-go       Go messages, run by `python -m grpc_tools.protoc --go_out`
#   protoc-gen-go-grpc  Go stubs, run by `--go-grpc_out`
# Usage: tools/go-tools.sh [BIN_DIR]   (default: .cache/go-bin); prints BIN_DIR.
# Exits 3 with a message on stderr when `go` is not installed (callers skip).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath -m "${1:-.cache/go-bin}")

# name  package@version. Change a version here and the next run rebuilds that tool.
tools=(
  "grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4"
  "protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.11"
  "protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2"
)

if ! command -v go >/dev/null 2>&1; then
  echo "go-tools: 'go' is not installed (needed to build grpcurl and the Go protoc plugins)" >&2
  exit 3
fi
mkdir -p "$bin"
for entry in "${tools[@]}"; do
  read -r name pkg <<<"$entry"
  # A stamp beside each binary records the version it was built at.
  if [ -x "$bin/$name" ] && [ "$(cat "$bin/.$name.version" 2>/dev/null)" = "$pkg" ]; then
    continue
  fi
  echo "go-tools: building $pkg (once; cached in $bin)" >&2
  # Low priority: the first build of grpcurl takes minutes on a shared 2-core machine.
  GOBIN="$bin" nice -n 10 go install "$pkg" >&2
  echo "$pkg" >"$bin/.$name.version"
done
echo "$bin"
