#!/usr/bin/env bash
# Stop `make install` early, naming what is missing, instead of failing later
# with a traceback. Usage: tools/check-prereqs.sh PYTHON
set -uo pipefail
py=${1:-python3}
missing() { echo "make install: $1" >&2; exit 1; }
command -v "$py" >/dev/null || missing "'$py' not found: install Python 3.11+ (Debian/Ubuntu: apt-get install python3 python3-venv), or run 'make PYTHON=/path/to/python3.11'"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  missing "Tidelog needs Python 3.11+, '$py' is $("$py" -c 'import sys; print(sys.version.split()[0])'); run 'make PYTHON=/path/to/python3.11'"
# Debian and Ubuntu ship venv without ensurepip unless python3-venv is installed:
# `python3 -m venv` then fails half-way, leaving a .venv without pip.
"$py" -c 'import ensurepip, venv' 2>/dev/null ||
  missing "'$py' cannot create a virtual environment (no venv/ensurepip module): install python3-venv (Debian/Ubuntu: apt-get install python3-venv)"
command -v git >/dev/null || missing "git not found: install git (buf checks protos against the main branch)"
# Not required: without a C compiler the SDK's per-record loop (sdk/tidelog/_crecords.c)
# is not built and consumers run its Python twin, at about half the speed.
command -v cc >/dev/null || command -v gcc >/dev/null ||
  echo "make install: no C compiler (cc): the SDK's C record loop is skipped; consumers run its slower Python twin (Debian/Ubuntu: apt-get install gcc)" >&2
exit 0
