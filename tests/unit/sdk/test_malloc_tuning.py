"""The consumer's allocator settings (tidelog._malloc_tuning, ConsumerConfig.malloc_tuning):
mallopt called with each setting, MALLOC_* variables and malloc_tuning=False respected, the
fetcher applying it, and on glibc the effect it is there for (freed fetch-sized buffers
reused instead of faulted in again)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import deque
from typing import Any

import pytest
from tidelog import _malloc_tuning
from tidelog._connection import Cluster
from tidelog._fetcher import Fetcher
from tidelog._malloc_tuning import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, MIB, apply
from tidelog.config import ConsumerConfig


class RecordingLibc:
    """Stands in for the C library: records mallopt calls, accepts or refuses them."""

    def __init__(self, result: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.result = result

    def mallopt(self, param: Any, value: Any) -> int:
        self.calls.append((param.value, value.value))
        return self.result


def test_apply_calls_mallopt_with_each_setting() -> None:
    libc = RecordingLibc()
    applied = apply(libc, environ={})  # type: ignore[arg-type]
    assert sorted(libc.calls) == sorted(
        [(M_MMAP_THRESHOLD, 16 * MIB), (M_TRIM_THRESHOLD, 16 * MIB)]
    )
    assert applied == {"mmap_threshold": 16 * MIB, "trim_threshold": 16 * MIB}


def test_a_malloc_environment_variable_wins_and_a_refusal_is_not_applied() -> None:
    libc = RecordingLibc()
    applied = apply(libc, environ={"MALLOC_TRIM_THRESHOLD_": "0"})  # type: ignore[arg-type]
    assert libc.calls == [(M_MMAP_THRESHOLD, 16 * MIB)]
    assert applied == {"mmap_threshold": 16 * MIB}
    refusing = RecordingLibc(result=0)
    assert apply(refusing, environ={}) == {}  # type: ignore[arg-type]
    assert apply(None, environ={}) == {}


def test_the_fetcher_applies_it_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []
    monkeypatch.setattr(_malloc_tuning, "tune_once", asked.append)
    for enabled in (True, False):
        config = ConsumerConfig(bootstrap_servers="127.0.0.1:1", malloc_tuning=enabled)
        Fetcher(Cluster(config), config, deque(), lambda: None)
    assert asked == [True, False]


def test_switched_off_it_calls_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_malloc_tuning, "glibc", lambda: pytest.fail("libc looked up"))
    assert _malloc_tuning.tune_once(False) == {}
    # leave_alone(): later consumers tune nothing either (bench.malloc_ab's "off" side).
    monkeypatch.setattr(_malloc_tuning, "_applied", None)
    _malloc_tuning.leave_alone()
    assert _malloc_tuning.tune_once(True) == {}


# The churn of the fetch path: several answers' buffers (200 KB, the paper test's fetch
# size) alive at once, then freed. With glibc's defaults the freed top of a heap is trimmed
# and every round faults its pages in again; tuned, they are reused. In a child process:
# mallopt is process-wide.
_CHURN = textwrap.dedent(
    """
    import resource, sys
    from tidelog import _malloc_tuning
    _malloc_tuning.tune_once(sys.argv[1] == "on")
    def churn(rounds):
        for _ in range(rounds):
            buffers = [b"x" * 204_800 for _ in range(8)]
            del buffers
    churn(5)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    churn(50)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 50)
    """
)


def _faults_per_round(mode: str) -> int:
    env = {"PATH": "/usr/bin:/bin"}  # no MALLOC_* variable from the caller
    out = subprocess.run(
        [sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.mark.skipif(_malloc_tuning.glibc() is None, reason="needs glibc (mallopt)")
def test_on_glibc_freed_fetch_buffers_are_reused_instead_of_faulted_in_again() -> None:
    # 1.6 MB touched per round is 400 pages of 4 KiB.
    assert _faults_per_round("off") > 200
    assert _faults_per_round("on") < 20
