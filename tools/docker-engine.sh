#!/usr/bin/env bash
# A Docker engine for `make images` and tests/containers, on a machine that has none running.
#
#   tools/docker-engine.sh start   use the engine that answers ($DOCKER_HOST when set, else
#                                  ours, else the default socket), else install docker.io with
#                                  apt (as root, when dockerd is missing) and start our own;
#                                  prints the DOCKER_HOST to use on stdout. Installs debootstrap
#                                  too when missing (tools/images.py needs it).
#   tools/docker-engine.sh stop    stop the engine that `start` started (by its PID), if any
#   tools/docker-engine.sh host    print the DOCKER_HOST of a running engine; exit 3 if none
#
# Our engine runs without a bridge, NAT or iptables rules (`--bridge=none --iptables=false
# --ip-masq=false`): containers use host networking only, so no traffic ever goes to a
# private-range address. It has its own socket, pidfile and exec root under $STATE (so it
# never collides with a system dockerd), and its data root (images, build cache) under
# ~/.cache/tidelog/docker, so images built once are there for the next run.
# Exits 3 with the reason on stderr when no engine can be had (callers skip).
set -euo pipefail

STATE=${TIDELOG_DOCKER_STATE:-/run/tidelog-docker}
DATA_ROOT=${TIDELOG_DOCKER_DATA_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/tidelog/docker}
SOCKET="$STATE/docker.sock"
PIDFILE="$STATE/docker.pid"
LOG="$STATE/dockerd.log"
OUR_HOST="unix://$SOCKET"
READY_TIMEOUT_S=30

say() { echo "docker-engine: $*" >&2; }
cannot() { say "$*"; exit 3; }

answers() {  # answers HOST: the engine at HOST replies to the API
  DOCKER_HOST="$1" timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

running_host() {  # the engine to use: $DOCKER_HOST when set, else ours, else the default socket
  if [ -n "${DOCKER_HOST:-}" ]; then
    answers "$DOCKER_HOST" && echo "$DOCKER_HOST"
    return
  fi
  if ours_answers; then echo "$OUR_HOST"; return 0; fi
  if answers unix:///var/run/docker.sock; then echo unix:///var/run/docker.sock; return 0; fi
  return 1
}

install_packages() {  # install_packages PACKAGE...: with apt, as root
  [ "$(id -u)" = 0 ] || { say "installing $* needs root (apt-get install $*)"; return 1; }
  command -v apt-get >/dev/null || { say "no apt-get to install $* with"; return 1; }
  say "installing $* with apt (once)"
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

ours_answers() { [ -S "$SOCKET" ] && answers "$OUR_HOST"; }

start() {
  local host
  # tools/images.py makes the local base image with debootstrap (without it, the container
  # tests are skipped saying so).
  command -v debootstrap >/dev/null || install_packages debootstrap || true
  if host=$(running_host); then echo "$host"; return 0; fi
  if ours_answers; then echo "$OUR_HOST"; return 0; fi  # $DOCKER_HOST is set but dead
  if ! command -v docker >/dev/null || ! command -v dockerd >/dev/null; then
    install_packages docker.io || cannot "no Docker engine answers and docker.io could not be installed"
  fi
  [ "$(id -u)" = 0 ] || cannot "no Docker engine answers and starting one needs root (sudo $0 start)"
  mkdir -p "$STATE" "$DATA_ROOT"
  # One starter at a time (two test runs may start together).
  exec 9>"$STATE/lock"
  flock 9
  if ours_answers; then echo "$OUR_HOST"; return 0; fi
  rm -f "$SOCKET" "$PIDFILE"
  say "starting dockerd (data root $DATA_ROOT, log $LOG)"
  # setsid: the engine outlives this script, not a Ctrl-C of the shell that called it.
  setsid dockerd \
    --bridge=none --iptables=false --ip-masq=false --ip6tables=false \
    --host "$OUR_HOST" --pidfile "$PIDFILE" \
    --data-root "$DATA_ROOT" --exec-root "$STATE/exec" \
    >"$LOG" 2>&1 </dev/null 9>&- &
  local pid=$! deadline=$((SECONDS + READY_TIMEOUT_S))
  until answers "$OUR_HOST"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$LOG" >&2
      cannot "dockerd exited while starting; see $LOG"
    fi
    if [ $SECONDS -ge $deadline ]; then
      kill "$pid" 2>/dev/null || true
      cannot "dockerd did not answer on $SOCKET within ${READY_TIMEOUT_S} s; see $LOG"
    fi
    sleep 0.2
  done
  echo "$OUR_HOST"
}

stop() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid=$(cat "$PIDFILE")
  # Only the dockerd that start() launched: the pidfile is ours, the command line says so.
  if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--pidfile $PIDFILE"; then
    say "stopping dockerd (pid $pid)"
    kill -TERM "$pid"
    # dockerd stops its containers (10 s each at most) and its containerd first.
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      say "dockerd (pid $pid) did not stop in 30 s: SIGKILL"
      kill -KILL "$pid"
    fi
    # dockerd leaves its default network namespace mounted in its exec root.
    for ns in "$STATE"/exec/netns/*; do
      if mountpoint -q "$ns" 2>/dev/null; then umount "$ns" || true; fi
    done
  fi
  rm -f "$PIDFILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  host) running_host || cannot "no Docker engine answers (start one: tools/docker-engine.sh start)" ;;
  *) echo "usage: $0 start|stop|host" >&2; exit 2 ;;
esac
