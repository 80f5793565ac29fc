"""glibc's allocator settings for a consuming process (ConsumerConfig.malloc_tuning).

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

What: the first consumer of the process calls mallopt(3) (through ctypes) with

- M_MMAP_THRESHOLD = 16 MiB: blocks up to that size come from a heap and are
  reused after free (a fetch answer is at most the credit window, 8 MiB by
  default);
- M_TRIM_THRESHOLD = 16 MiB: up to that much free memory at the top of each
  heap stays for reuse instead of being returned and faulted in again.

Memory: live memory is still bounded by the consumer's credit window; what
changes is that an arena that held fetch buffers keeps up to 16 MiB of them
free for the next answers (setting M_MMAP_THRESHOLD also switches off glibc's
dynamic thresholds, for the whole process). An application that does not
want this sets `malloc_tuning=False`, or sets glibc's own environment
variables (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_), which are left
alone. Only on glibc: elsewhere (musl, macOS) nothing is done.

Thread-safe: applied at most once per process.
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

#: (name, mallopt parameter, value, glibc's environment variable for it).
SETTINGS = (
    ("mmap_threshold", M_MMAP_THRESHOLD, 16 * MIB, "MALLOC_MMAP_THRESHOLD_"),
    ("trim_threshold", M_TRIM_THRESHOLD, 16 * MIB, "MALLOC_TRIM_THRESHOLD_"),
)

_lock = threading.Lock()
_applied: dict[str, int] | None = None


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


def apply(libc: ctypes.CDLL | None, environ: Mapping[str, str]) -> dict[str, int]:
    """Apply SETTINGS with `libc`'s mallopt, skipping each one whose
    environment variable is set; returns what was applied. Never raises: a
    consumer runs correctly, only slower, with glibc's defaults."""
    if libc is None:
        return {}
    applied: dict[str, int] = {}
    for name, parameter, value, variable in SETTINGS:
        if variable in environ:
            continue
        if libc.mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) == 1:
            applied[name] = value
        else:
            log.debug("glibc refused mallopt %s=%d", name, value)
    return applied


def tune_once(enabled: bool) -> dict[str, int]:
    """The first call with `enabled` applies the settings (see module doc);
    later calls return what that one applied."""
    global _applied
    if not enabled:
        return {}
    with _lock:
        if _applied is None:
            _applied = apply(glibc(), os.environ)
            if _applied:
                log.debug("malloc tuning for fetching: %s", _applied)
        return _applied


def leave_alone() -> None:
    """Make every later tune_once a no-op in this process (for a benchmark
    that measures the client with glibc's defaults: bench.malloc_ab)."""
    global _applied
    with _lock:
        if _applied is None:
            _applied = {}
