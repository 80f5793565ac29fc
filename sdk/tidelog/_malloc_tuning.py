"""glibc's allocator settings for a consuming process: the glibc part of
ConsumerConfig.freed_memory_kept_bytes (tidelog._memory_reuse decides when).

Why: every fetch answer reaches the consumer as large buffers: gRPC's read
buffers (event-engine threads), the `bytes` gRPC makes of the message and
the records sliced out of it (the I/O loop). Each is ~`max_partition_fetch_bytes`
(200 KB in the paper's test, 1 MiB by default). glibc serves such a block
with mmap, or from a heap whose free top it gives back to the OS once it
exceeds M_TRIM_THRESHOLD (dynamically twice the last mmapped block freed,
here ~400 KB): with two answers' buffers freed per fetch, the top is trimmed
and faulted in again, zeroed by the kernel, page by page. Measured on the
paper's test (bench/fetch_profile.py, 200 KB fetches): ~65 minor page faults
per fetch with poll(), ~2-15 with these settings, and ~90 us less client CPU
per fetch (of ~700); a bare grpc.aio stream of 200 KB messages: ~35 us of
~110 per message.

What: `tune(bound)` calls mallopt(3) (through ctypes) with, both set to
min(bound, 16 MiB):

- M_MMAP_THRESHOLD: blocks up to that size come from a heap and are
  reused after free (a fetch answer is at most the credit window, 8 MiB by
  default);
- M_TRIM_THRESHOLD: up to that much free memory at the top of each
  heap stays for reuse instead of being returned and faulted in again.

Memory: live memory is still bounded by the consumer's credit window; what
changes is that an arena that held fetch buffers keeps up to 16 MiB of them
free for the next answers (setting M_MMAP_THRESHOLD also switches off glibc's
dynamic thresholds, for the whole process). An application that does not
want this sets `freed_memory_kept_bytes=0`, or sets glibc's own environment
variables (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_), which are left
alone. Only on glibc: elsewhere (musl, macOS) nothing is done.

Thread-safe: a larger bound than the one applied applies again, never a
smaller one.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Mapping

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# mallopt(3) parameter numbers, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: The largest value set (the fetch answers are at most the credit window).
MAX_THRESHOLD_BYTES = 16 * MIB
#: (name, mallopt parameter, glibc's environment variable for it).
SETTINGS = (
    ("mmap_threshold", M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_"),
    ("trim_threshold", M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_"),
)

_lock = threading.Lock()
_applied: dict[str, int] = {}
#: The bound applied: only a larger one applies again.
_applied_bound = 0


def glibc() -> ctypes.CDLL | None:
    """This process's C library if it is GNU libc, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    # musl has a mallopt that does nothing; gnu_get_libc_version is glibc's own.
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    return libc


def apply(libc: ctypes.CDLL | None, environ: Mapping[str, str], value: int) -> dict[str, int]:
    """Set each of SETTINGS to `value` with `libc`'s mallopt, skipping each
    one whose environment variable is set; returns what was applied. Never
    raises: a consumer runs correctly, only slower, with glibc's defaults."""
    if libc is None:
        return {}
    applied: dict[str, int] = {}
    for name, parameter, variable in SETTINGS:
        if variable in environ:
            continue
        if libc.mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) == 1:
            applied[name] = value
        else:
            log.debug("glibc refused mallopt %s=%d", name, value)
    return applied


def tune(bound: int) -> dict[str, int]:
    """Apply the settings at min(bound, MAX_THRESHOLD_BYTES) unless a bound
    as large was applied before (see module doc); what is in place."""
    global _applied, _applied_bound
    value = min(bound, MAX_THRESHOLD_BYTES)
    with _lock:
        if value <= _applied_bound:
            return dict(_applied)
        _applied = apply(glibc(), os.environ, value)
        _applied_bound = value
        if _applied:
            log.debug("malloc tuning for consuming: %s", _applied)
        return dict(_applied)
