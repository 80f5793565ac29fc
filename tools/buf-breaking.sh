#!/usr/bin/env bash
# Check protos/ for breaking changes against the main branch (buf.yaml says
# which rules). Usage: tools/buf-breaking.sh [BUF]
#
# main's protos are taken with `git archive`, which works the same in a
# worktree (where .git is a file, which buf's own git input cannot read) and in
# a fresh CI clone, where main may be the commit under test (then nothing can
# have changed, and the check passes).
set -euo pipefail
cd "$(dirname "$0")/.."
buf=${1:-.venv/bin/buf}
against=""
for ref in main origin/main; do
  if git rev-parse --verify --quiet "$ref^{commit}" >/dev/null; then against=$ref; break; fi
done
if [ -z "$against" ]; then
  echo "buf-breaking: no 'main' or 'origin/main' branch to compare protos/ with; fetch main first" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! git cat-file -e "$against:protos" 2>/dev/null; then
  echo "buf-breaking: $against has no protos/; nothing to compare"
  exit 0
fi
paths=(protos)
git cat-file -e "$against:buf.yaml" 2>/dev/null && paths+=(buf.yaml)
git archive "$against" "${paths[@]}" | tar -x -C "$tmp"
# main's buf.yaml when it has one (same module layout); else ours.
[ -f "$tmp/buf.yaml" ] || cp buf.yaml "$tmp/buf.yaml"
"$buf" breaking --against "$tmp"
