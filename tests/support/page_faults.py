"""Page faults of allocator churn in a fresh interpreter: what the broker's and
the SDK's allocator settings are there to remove (mallopt is process-wide, so
each measurement needs a process of its own)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Rounds of `count` buffers of `size` bytes alive at once, then all freed
# (the churn of fetch answers); faults counted after a few warm-up rounds.
_CHURN = textwrap.dedent(
    """
    import resource, sys
    exec(sys.argv[1])
    size, count = int(sys.argv[2]), int(sys.argv[3])
    def churn(rounds):
        for _ in range(rounds):
            buffers = [b"x" * size for _ in range(count)]
            del buffers
    churn(5)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    churn(50)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 50)
    """
)


def churn_faults_per_round(
    setup: str, size: int, count: int, env: dict[str, str] | None = None
) -> int:
    """Minor page faults per round of the churn, after `setup` (Python source
    run first in the child: the settings under test)."""
    out = subprocess.run(
        [sys.executable, "-c", _CHURN, setup, str(size), str(count)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout)
