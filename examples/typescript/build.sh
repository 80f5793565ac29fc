#!/usr/bin/env bash
# Build the TypeScript example: `npm ci` (@grpc/grpc-js, @grpc/proto-loader and
# the TypeScript compiler from the npm registry, pinned by package-lock.json;
# node_modules kept beside it, npm's download cache in ~/.npm), then `tsc`.
# The protos are not compiled ahead: proto-loader reads protos/tidelog/v1 when
# the program starts. Each step is skipped when its output is newer than its
# inputs, so a run with nothing changed costs no npm or tsc start.
# Usage: examples/typescript/build.sh   (prints the path of the program to run with node)
# Exits 3 with a message on stderr when node (20 or later) or npm is not installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "typescript example: '$tool' is not installed (needed to build and run the TypeScript example: Node.js 20 or later with npm)" >&2
    exit 3
  fi
done
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "typescript example: node $(node --version) is too old (Node.js 20 or later is needed)" >&2
  exit 3
fi
dir=examples/typescript
stamp=$dir/node_modules/.package-lock.json
if [ ! -f "$stamp" ] || [ "$dir/package-lock.json" -nt "$stamp" ]; then
  (cd "$dir" && npm ci --no-audit --no-fund >&2)
fi
out=$dir/dist/main.js
if [ ! -f "$out" ] || [ -n "$(find "$dir/src" "$dir/tsconfig.json" "$stamp" -newer "$out" -type f | head -1)" ]; then
  (cd "$dir" && ./node_modules/.bin/tsc -p . >&2)
fi
realpath "$out"
