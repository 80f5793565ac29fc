"""`--malloc-tuning` (tidelog_broker.malloc_tuning): parsing and its limits, the skip on
other C libraries and for MALLOC_* variables, the broker's start applying it, and on glibc
the effect it is there for (freed 1 MiB buffers reused instead of faulted in again)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
import tidelog_broker.__main__ as broker_main
from tidelog_broker import malloc_tuning
from tidelog_broker.malloc_tuning import (
    DEFAULT_TUNING,
    M_ARENA_MAX,
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    MIB,
    OFF,
    MallocTuning,
    MallocTuningError,
    apply_malloc_tuning,
    parse_malloc_tuning,
)

from tests.support.fake_libc import RecordingLibc
from tests.support.page_faults import churn_faults_per_round


def test_default_and_off() -> None:
    assert parse_malloc_tuning("default") == DEFAULT_TUNING
    assert parse_malloc_tuning(" OFF ") == OFF
    assert DEFAULT_TUNING.enabled and not OFF.enabled


def test_own_values_with_units() -> None:
    assert parse_malloc_tuning("mmap_threshold=4MiB, trim_threshold=65536k,arena_max=2") == (
        MallocTuning(4 * MIB, 64 * MIB, 2)
    )
    assert parse_malloc_tuning("trim_threshold=1048576") == MallocTuning(None, MIB, None)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("on", r"expected 'default', 'off' or key=value pairs with keys mmap_threshold"),
        ("mmap_threshold", r"expected 'default'"),
        ("top_pad=1", r"got 'top_pad=1'"),
        ("mmap_threshold=33MiB", r"mmap_threshold must be between 0 and 33554432"),
        ("trim_threshold=2000MiB", r"trim_threshold must be between 0 and 1073741824"),
        ("arena_max=0", r"arena_max must be between 1 and 1024"),
        ("arena_max=2MiB", r"arena_max must be a count"),
        ("mmap_threshold=-1", r"mmap_threshold must be bytes"),
        ("mmap_threshold=4GB", r"mmap_threshold must be bytes"),
        ("arena_max=1,arena_max=2", r"arena_max given twice"),
    ],
)
def test_bad_values_are_refused_naming_the_limit(spec: str, message: str) -> None:
    with pytest.raises(MallocTuningError, match=message):
        parse_malloc_tuning(spec)


def test_apply_calls_mallopt_with_each_setting() -> None:
    libc = RecordingLibc()
    applied = apply_malloc_tuning(DEFAULT_TUNING, libc, environ={})  # type: ignore[arg-type]
    assert sorted(libc.calls) == sorted(
        [
            (M_MMAP_THRESHOLD, DEFAULT_TUNING.mmap_threshold_bytes),
            (M_TRIM_THRESHOLD, DEFAULT_TUNING.trim_threshold_bytes),
            (M_ARENA_MAX, DEFAULT_TUNING.arena_max),
        ]
    )
    assert applied == {
        "mmap_threshold_bytes": 16 * MIB,
        "trim_threshold_bytes": 32 * MIB,
        "arena_max": 4,
    }


def test_a_malloc_environment_variable_wins() -> None:
    libc = RecordingLibc()
    applied = apply_malloc_tuning(
        DEFAULT_TUNING,
        libc,  # type: ignore[arg-type]
        environ={"MALLOC_MMAP_THRESHOLD_": "67108864", "MALLOC_ARENA_MAX": "1"},
    )
    assert libc.calls == [(M_TRIM_THRESHOLD, 32 * MIB)]
    assert applied == {"trim_threshold_bytes": 32 * MIB}


def test_off_calls_nothing_and_a_refusal_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    libc = RecordingLibc(result=0)
    assert apply_malloc_tuning(OFF, libc, environ={}) == {}  # type: ignore[arg-type]
    assert libc.calls == []
    with caplog.at_level(logging.WARNING, "tidelog.broker"):
        assert apply_malloc_tuning(DEFAULT_TUNING, libc, environ={}) == {}  # type: ignore[arg-type]
    assert "glibc refused mmap_threshold_bytes" in caplog.text


def test_skipped_cleanly_without_glibc(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert malloc_tuning.glibc() is None
    with caplog.at_level(logging.INFO, "tidelog.broker"):
        assert apply_malloc_tuning(DEFAULT_TUNING, environ={}) == {}
    assert "skipped: the C library is not glibc" in caplog.text


def test_a_library_without_glibcs_own_symbol_is_not_glibc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Musl:  # musl has mallopt (a no-op) but not gnu_get_libc_version
        def mallopt(self, param: Any, value: Any) -> int:
            return 0

    monkeypatch.setattr(malloc_tuning.ctypes, "CDLL", lambda _name: Musl())
    monkeypatch.setattr(sys, "platform", "linux")
    assert malloc_tuning.glibc() is None


def test_the_broker_applies_the_default_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[MallocTuning] = []

    async def no_serve(*_args: object) -> int:
        return 0  # serve()'s exit status

    monkeypatch.setattr(broker_main, "apply_malloc_tuning", applied.append)
    monkeypatch.setattr(broker_main, "serve", no_serve)
    monkeypatch.setattr(broker_main, "raise_open_file_limit", lambda: 0)
    assert broker_main.main([]) == 0
    assert applied == [DEFAULT_TUNING]
    assert broker_main.main(["--malloc-tuning", "off"]) == 0
    assert applied[-1] == OFF


def test_the_broker_refuses_a_bad_value_at_start(capsys: pytest.CaptureFixture[str]) -> None:
    assert broker_main.main(["--malloc-tuning", "mmap_threshold=64MiB"]) == 2
    assert "mmap_threshold must be between 0 and 33554432" in capsys.readouterr().err


# The churn of the fetch path: 4 buffers of 1 MiB alive at once, then all freed. With
# glibc's defaults the freed top of the heap is trimmed and every round faults its pages in
# again; tuned, the pages are reused.
def _faults_per_round(spec: str) -> int:
    setup = (
        "from tidelog_broker.malloc_tuning import apply_malloc_tuning, parse_malloc_tuning\n"
        f"apply_malloc_tuning(parse_malloc_tuning({spec!r}), environ={{}})"
    )
    return churn_faults_per_round(setup, 1 << 20, 4)


@pytest.mark.skipif(malloc_tuning.glibc() is None, reason="needs glibc (mallopt)")
def test_on_glibc_freed_buffers_are_reused_instead_of_faulted_in_again() -> None:
    # 4 MiB touched per round is 1,024 pages of 4 KiB.
    assert _faults_per_round("off") > 500
    assert _faults_per_round("default") < 50
