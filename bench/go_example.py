"""The Go example program (examples/go), as the benchmarks that drive Go
clients build it: `go_example()` runs examples/go/build.sh once per process
(the script itself caches the build) and returns the binary's path, or why
it could not be built (Go missing: the script exits 3 and says so)."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@cache
def go_example() -> Path | str:
    build = subprocess.run(
        [str(ROOT / "examples/go/build.sh")],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode != 0:
        lines = build.stderr.strip().splitlines()
        return lines[-1] if lines else f"examples/go/build.sh exited {build.returncode}"
    return Path(build.stdout.strip().splitlines()[-1])
