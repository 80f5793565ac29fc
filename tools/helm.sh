#!/usr/bin/env bash
# Build helm (the Kubernetes package manager the chart in deploy/k8s/tidelog is
# checked with) from the Go module proxy, once per version, into a cache outside
# the clone so that every worktree and every later run reuses it:
#   ~/.cache/tidelog/go-bin/helm-<version>
# The first build takes ~10 minutes at low priority on a 2-core machine and
# gives a ~110 MB binary; later runs only print the path.
#
# Usage: tools/helm.sh [--background]
#   prints the binary's path on stdout when it is built (exit 0), building it
#   first, or waiting for a build under way (a lock file serialises builds);
#   --background starts the build detached (nice, log beside the binary) and
#     returns at once; exit 0 if already built, 4 if a build is now under way.
# Exits 3 with a message on stderr when `go` is not installed (callers skip).
# Override the cache with TIDELOG_CACHE (default ~/.cache/tidelog).
set -euo pipefail
version=v3.22.0
cache="${TIDELOG_CACHE:-$HOME/.cache/tidelog}/go-bin"
bin="$cache/helm-$version"
log="$bin.log"
lock="$bin.lock"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "helm.sh: 'go' is not installed; helm $version is built with" \
    "'go install helm.sh/helm/v3/cmd/helm@$version' (install Go 1.22+)" >&2
  exit 3
fi
mkdir -p "$cache"

build() {
  # One build at a time across worktrees and xdist workers: flock on a lock
  # file; whoever waits finds the binary built when it gets the lock.
  exec 9>"$lock"
  flock 9
  if [ -x "$bin" ]; then
    return 0
  fi
  tmpbin=$(mktemp -d "$cache/.helm-build.XXXXXX")
  echo "helm.sh: building helm $version (once; cached as $bin)" >&2
  # Low priority: tests run beside it on a shared 2-core machine.
  if GOBIN="$tmpbin" nice -n 15 go install "helm.sh/helm/v3/cmd/helm@$version" >&2; then
    # Rename is atomic: a reader never sees a half-written binary.
    mv "$tmpbin/helm" "$bin"
    rmdir "$tmpbin"
  else
    rm -rf "$tmpbin"
    echo "helm.sh: building helm $version failed (see above)" >&2
    return 1
  fi
}

if [ "${1:-}" = "--background" ]; then
  : >>"$lock"
  if ! flock -n "$lock" true; then
    echo "helm.sh: helm $version is already being built (log: $log)" >&2
    exit 4
  fi
  # setsid + nohup: the build outlives the caller (e.g. a pytest session that
  # skips the chart tests this time and finds helm built the next time).
  nohup setsid bash "$0" >"$log" 2>&1 </dev/null &
  echo "helm.sh: building helm $version in the background (log: $log)" >&2
  exit 4
fi
build
echo "$bin"
