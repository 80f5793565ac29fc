"""glibc's allocator settings for the broker process (`--malloc-tuning`).

Why: a Fetch answer is one ~1 MiB `bytes` (the pread of the records, the
framed response, and gRPC's copy of it into a slice are three such
buffers per answer). glibc serves an allocation above M_MMAP_THRESHOLD with
its own mmap and gives it back with munmap on free, and gives freed memory at
the top of a heap back to the OS once it exceeds M_TRIM_THRESHOLD. Its dynamic
threshold (raised to the size of the last mmapped block freed, trim threshold
twice that) does not hold these buffers on the heap: measured with 1 KiB
records, the broker took ~250 minor page faults per thousand records
consumed, each answer's pages faulted in fresh and zeroed by the kernel, about
half of its CPU per record (bench/malloc_ab.py).

What: at start, before the event loop and gRPC's threads allocate, the broker
calls glibc's mallopt(3) (through ctypes) with

- M_MMAP_THRESHOLD: allocations up to this size come from the heap and are
  reused after free (fetch answers, replica answers, produce requests);
- M_TRIM_THRESHOLD: free memory at the top of a heap kept for reuse, up to
  this much, instead of returned and faulted in again;
- M_ARENA_MAX: at most this many heaps (glibc's default is 8 per core), so
  that the free memory kept is bounded by arenas x trim threshold.

Memory bound: setting M_MMAP_THRESHOLD also switches off glibc's dynamic
threshold. Live memory is still bounded by the broker's own limits (the fetch
budget, request sizes); what changes is that up to `trim_threshold` of free
memory per arena stays resident for reuse. The defaults keep that within the
300 MB RSS target (measured peak RSS in bench/malloc_ab.py and `make bench`).

Only on glibc (Linux with GNU libc): elsewhere (musl, macOS) the option is
skipped with a log line, as mallopt is absent or means something else. A
setting whose environment variable the user gave (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_, MALLOC_ARENA_MAX) is left to glibc's reading of it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

# One check for glibc, shared with the SDK consumer's own settings.
from tidelog._malloc_tuning import glibc

log = logging.getLogger("tidelog.broker")

KIB = 1024
MIB = 1024 * KIB

# mallopt(3) parameter numbers, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

#: glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
MAX_MMAP_THRESHOLD_BYTES = 32 * MIB
#: mallopt takes an int: trim thresholds up to 1 GiB are accepted here.
MAX_TRIM_THRESHOLD_BYTES = 1024 * MIB
MAX_ARENAS = 1024


@dataclass(frozen=True)
class MallocTuning:
    """The mallopt settings to apply; None leaves one at glibc's default."""

    mmap_threshold_bytes: int | None = None
    trim_threshold_bytes: int | None = None
    arena_max: int | None = None

    @property
    def enabled(self) -> bool:
        return any(
            value is not None
            for value in (self.mmap_threshold_bytes, self.trim_threshold_bytes, self.arena_max)
        )


#: `--malloc-tuning default`: room on the heap for a consumer's answers (1 MiB
#: by default) and a follower's (replica.fetch.max.bytes, 8 MiB, plus framing),
#: and up to 32 MiB of free heap kept per arena, in at most 4 arenas.
DEFAULT_TUNING = MallocTuning(
    mmap_threshold_bytes=16 * MIB, trim_threshold_bytes=32 * MIB, arena_max=4
)
OFF = MallocTuning()


@dataclass(frozen=True)
class _Setting:
    """One --malloc-tuning key: its MallocTuning field, its bounds, whether
    it is a size (a KiB/MiB suffix allowed) or a count, glibc's environment
    variable for it and its mallopt parameter."""

    field_name: str
    minimum: int
    maximum: int
    is_size: bool
    environment_variable: str
    parameter: int


_SETTINGS = {
    "mmap_threshold": _Setting(
        "mmap_threshold_bytes", 0, MAX_MMAP_THRESHOLD_BYTES, True,
        "MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD,
    ),
    "trim_threshold": _Setting(
        "trim_threshold_bytes", 0, MAX_TRIM_THRESHOLD_BYTES, True,
        "MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD,
    ),
    "arena_max": _Setting("arena_max", 1, MAX_ARENAS, False, "MALLOC_ARENA_MAX", M_ARENA_MAX),
}  # fmt: skip
_SIZE = re.compile(r"(\d{1,10})\s*(|b|k|kib|m|mib)", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": KIB, "kib": KIB, "m": MIB, "mib": MIB}


class MallocTuningError(ValueError):
    """A --malloc-tuning value that cannot be used; the message says why."""


def parse_malloc_tuning(spec: str) -> MallocTuning:
    """`default`, `off`, or `key=value,...` with keys mmap_threshold and
    trim_threshold (bytes, or with a KiB/MiB suffix) and arena_max (a count).
    Keys not given stay at glibc's defaults. Raises MallocTuningError."""
    text = spec.strip().lower()
    if text == "default":
        return DEFAULT_TUNING
    if text == "off":
        return OFF
    values: dict[str, int] = {}
    for item in text.split(","):
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or key not in _SETTINGS:
            raise MallocTuningError(
                f"--malloc-tuning: expected 'default', 'off' or key=value pairs with keys "
                f"{', '.join(_SETTINGS)}; got {item.strip()!r}"
            )
        setting = _SETTINGS[key]
        if setting.field_name in values:
            raise MallocTuningError(f"--malloc-tuning: {key} given twice")
        match = _SIZE.fullmatch(raw)
        if match is None or (not setting.is_size and match.group(2)):
            unit = "bytes, or a number with KiB or MiB" if setting.is_size else "a count"
            raise MallocTuningError(f"--malloc-tuning: {key} must be {unit}, got {raw!r}")
        value = int(match.group(1)) * _UNITS[match.group(2).lower()]
        if not setting.minimum <= value <= setting.maximum:
            raise MallocTuningError(
                f"--malloc-tuning: {key} must be between {setting.minimum} and "
                f"{setting.maximum}, got {value}"
            )
        values[setting.field_name] = value
    return MallocTuning(**values)


def apply_malloc_tuning(
    tuning: MallocTuning,
    libc: ctypes.CDLL | None = None,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, int]:
    """Apply `tuning` with mallopt; the settings applied, by field name.

    Skips (logging why) on a C library other than glibc, and each setting
    whose MALLOC_* environment variable is set. Never raises: a broker runs
    correctly, only slower, with glibc's defaults."""
    if not tuning.enabled:
        return {}
    libc = libc if libc is not None else glibc()
    if libc is None:
        log.info("malloc tuning skipped: the C library is not glibc")
        return {}
    applied: dict[str, int] = {}
    for setting in _SETTINGS.values():
        field_name, variable = setting.field_name, setting.environment_variable
        value = getattr(tuning, field_name)
        if value is None:
            continue
        if variable in environ:
            log.info("malloc tuning: %s left to %s=%s", field_name, variable, environ[variable])
            continue
        if libc.mallopt(ctypes.c_int(setting.parameter), ctypes.c_int(value)) != 1:
            log.warning("malloc tuning: glibc refused %s=%d", field_name, value)
            continue
        applied[field_name] = value
    log.info("malloc tuning applied: %s", applied)
    return applied
