"""The glibc part of a consumer's freed-memory reuse (tidelog._malloc_tuning, driven by
ConsumerConfig.freed_memory_kept_bytes): mallopt called with each setting at the bound (at
most 16 MiB), MALLOC_* variables respected, only a larger bound applied again, and on glibc
the effect it is there for (freed fetch-sized buffers reused instead of faulted in again)."""

from __future__ import annotations

import pytest
from tidelog import _malloc_tuning, _memory_reuse
from tidelog._malloc_tuning import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, MIB, apply

from tests.support.fake_libc import RecordingLibc
from tests.support.page_faults import churn_faults_per_round


def test_apply_calls_mallopt_with_each_setting() -> None:
    libc = RecordingLibc()
    applied = apply(libc, environ={}, value=16 * MIB)  # type: ignore[arg-type]
    assert sorted(libc.calls) == sorted(
        [(M_MMAP_THRESHOLD, 16 * MIB), (M_TRIM_THRESHOLD, 16 * MIB)]
    )
    assert applied == {"mmap_threshold": 16 * MIB, "trim_threshold": 16 * MIB}


def test_a_malloc_environment_variable_wins_and_a_refusal_is_not_applied() -> None:
    libc = RecordingLibc()
    environ = {"MALLOC_TRIM_THRESHOLD_": "0"}
    applied = apply(libc, environ=environ, value=16 * MIB)  # type: ignore[arg-type]
    assert libc.calls == [(M_MMAP_THRESHOLD, 16 * MIB)]
    assert applied == {"mmap_threshold": 16 * MIB}
    refusing = RecordingLibc(result=0)
    assert apply(refusing, environ={}, value=MIB) == {}  # type: ignore[arg-type]
    assert apply(None, environ={}, value=MIB) == {}


def test_the_bound_is_capped_and_only_a_larger_one_applies_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    libc = RecordingLibc()
    monkeypatch.setattr(_malloc_tuning, "glibc", lambda: libc)
    monkeypatch.setattr(_malloc_tuning, "_applied_bound", 0)
    monkeypatch.setattr(_malloc_tuning, "_applied", {})
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    assert _malloc_tuning.tune(4 * MIB) == {"mmap_threshold": 4 * MIB, "trim_threshold": 4 * MIB}
    assert _malloc_tuning.tune(2 * MIB)["trim_threshold"] == 4 * MIB  # never lowered
    assert _malloc_tuning.tune(64 * MIB)["trim_threshold"] == 16 * MIB  # capped
    assert [value for _, value in libc.calls] == [4 * MIB, 4 * MIB, 16 * MIB, 16 * MIB]
    # _memory_reuse.leave_alone(): nothing later applies (bench.malloc_ab's "off" side).
    monkeypatch.setattr(_memory_reuse, "_left_alone", False)
    _memory_reuse.leave_alone()
    _memory_reuse.keep_freed_memory(128 * MIB)
    assert len(libc.calls) == 4


# The churn of the fetch path: 8 answers' buffers of 200 KB (the paper test's fetch size)
# alive at once, then freed. With glibc's defaults the freed top of a heap is trimmed and
# every round faults its pages in again; tuned, they are reused.
def _faults_per_round(mode: str) -> int:
    bound = 16 * MIB if mode == "on" else 0
    setup = f"from tidelog import _malloc_tuning\n_malloc_tuning.tune({bound})"
    env = {"PATH": "/usr/bin:/bin"}  # no MALLOC_* variable from the caller
    return churn_faults_per_round(setup, 204_800, 8, env=env)


@pytest.mark.skipif(_malloc_tuning.glibc() is None, reason="needs glibc (mallopt)")
def test_on_glibc_freed_fetch_buffers_are_reused_instead_of_faulted_in_again() -> None:
    # 1.6 MB touched per round is 400 pages of 4 KiB.
    assert _faults_per_round("off") > 200
    assert _faults_per_round("on") < 20
