"""A consumer keeps the memory its records free for the next fetch
(tidelog._memory_reuse): freed memory is reused instead of being given back
to the OS and faulted in again, glibc's settings given by the user win, and
a bound of 0 changes nothing. Each case runs in a fresh interpreter, as the
allocators are process-wide; page faults (getrusage) show the behaviour."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from tidelog import records
from tidelog.config import ConsumerConfig

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        records._crecords is None or not sys.platform.startswith("linux"),
        reason="needs tidelog._crecords (a C compiler at install) and Linux's getrusage",
    ),
]

MIB = 1024 * 1024

# Each round makes and drops the same garbage; the script prints the minor
# page faults of each round. "small": 2M small tuples (Python's arenas);
# "heap": 8 MiB of 64 KiB bytes (glibc's heap, below its mmap threshold).
_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    from tidelog._memory_reuse import keep_freed_memory
    kind, bound = sys.argv[1], int(sys.argv[2])
    kept = keep_freed_memory(bound)

    def garbage():
        if kind == "small":
            return [(i, i + 1) for i in range(300_000)]
        return [bytes(64 * 1024) for _ in range(128)]

    faults = []
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        made = garbage()
        del made
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"kept": kept, "faults": faults}))
    """
)


def _faults(kind: str, bound: int, **env: str) -> tuple[int, list[int]]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environment.update(env)
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, kind, str(bound)],
        capture_output=True,
        text=True,
        env=environment,
        check=True,
        timeout=100,
    ).stdout
    result = json.loads(out.splitlines()[-1])
    return result["kept"], result["faults"]


def _later_rounds(faults: list[int]) -> int:
    """The most faults of a round once the first two have settled the
    allocators (the first grows them; the second may still move the heap)."""
    return max(faults[2:])


def test_freed_small_objects_are_reused_not_faulted_in_again() -> None:
    _, alone = _faults("small", 0)
    kept, reused = _faults("small", 64 * MIB)
    assert kept == 64 * MIB
    # Without the cache every round maps its arenas afresh (~9k pages of
    # 4 KiB for ~36 MiB of tuples); with it, later rounds reuse them.
    assert _later_rounds(alone) > 3_000
    assert _later_rounds(reused) < _later_rounds(alone) / 4


def test_freed_heap_memory_is_reused_on_glibc() -> None:
    _, alone = _faults("heap", 0)
    kept, reused = _faults("heap", 64 * MIB)
    assert kept == 64 * MIB
    assert _later_rounds(alone) > 1_000  # glibc trims the free top (over 128 KiB)
    assert _later_rounds(reused) < _later_rounds(alone) / 4


def test_the_users_glibc_settings_win() -> None:
    # MALLOC_TRIM_THRESHOLD_=0: glibc gives back every free top; the consumer
    # must not override what the user set.
    _, faults = _faults("heap", 64 * MIB, MALLOC_TRIM_THRESHOLD_="0")
    assert _later_rounds(faults) > 1_000


def test_the_bound_is_checked_and_defaults_to_64_mib() -> None:
    assert ConsumerConfig(bootstrap_servers="127.0.0.1:1").freed_memory_kept_bytes == 64 * MIB
    with pytest.raises(ValueError, match="freed_memory_kept_bytes"):
        ConsumerConfig(bootstrap_servers="127.0.0.1:1", freed_memory_kept_bytes=-1)


_CONSUMER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from collections import deque
    from tidelog import _malloc_tuning, _memory_reuse, records
    from tidelog._subscription import SubscriptionState
    from tidelog.config import ConsumerConfig
    options = {"freed_memory_kept_bytes": int(sys.argv[1])} if sys.argv[1] != "default" else {}
    config = ConsumerConfig(bootstrap_servers="127.0.0.1:1", **options)
    SubscriptionState(config, deque(), lambda name, args: None)
    print(json.dumps({
        "kept": _memory_reuse._kept_bytes,
        "glibc": _malloc_tuning._applied,
        "arena_cache_slots_bytes": records._crecords.keep_freed_arenas(0),
    }))
    """
)


@pytest.mark.parametrize("bound", ["default", "0"])
def test_a_consumer_applies_its_bound_to_the_process(bound: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CONSUMER_SCRIPT, bound],
        capture_output=True,
        text=True,
        check=True,
        timeout=100,
        env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")},
    ).stdout
    result = json.loads(out.splitlines()[-1])
    expected = 64 * MIB if bound == "default" else 0
    assert result["kept"] == expected
    assert result["arena_cache_slots_bytes"] == expected
    if bound == "0":
        assert result["glibc"] == {}
    else:
        assert result["glibc"] == {"mmap_threshold": 16 * MIB, "trim_threshold": 16 * MIB}
