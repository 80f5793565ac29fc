"""What a consumer does to its process's memory allocators, and why
(`ConsumerConfig.freed_memory_kept_bytes`).

Why: a consumer builds and drops several objects per record, millions a
second, and receives each fetch answer as a fresh buffer of up to
`max_partition_fetch_bytes`. By default both of the process's allocators
give such memory back to the OS as soon as it is free, and every page of it
is then faulted in (and zeroed by the kernel) again for the next fetch:

- CPython's small-object allocator (objects up to 512 bytes: records, ints,
  values of small records) returns each 1 MiB arena once it empties and
  keeps one. Reading 100-byte records, ~30% of the consumer's CPU went to
  those page faults (perf, bench/consume_memory_ab.py).
- glibc's malloc (larger values, the fetch answers) returns memory above
  its dynamic mmap threshold with munmap and trims the free top of a heap
  over 128 KiB: reading 1 KiB records, ~25% of the consumer's CPU.

What: when a consumer is made with a bound above what is in place,
tidelog._crecords keeps up to that many bytes of freed arenas for reuse (only
with the C extension), and, on glibc, tidelog._malloc_tuning keeps up to
min(bound, 16 MiB) free at the top of each heap and serves allocations up to
that size from the heap. The memory is not lost: it is reused by the
process, and the resident size stays up to the bound (per glibc heap) above
what is in use. A process's MALLOC_TRIM_THRESHOLD_ / MALLOC_MMAP_THRESHOLD_
win over the glibc part. A bound of 0 leaves the allocators as they are; a
later consumer with a larger bound raises it, none lowers it (the allocators
are shared by everything in the process).
"""

from __future__ import annotations

import threading

from tidelog import _malloc_tuning, records

_lock = threading.Lock()
_kept_bytes = 0
#: Set by leave_alone(): no consumer of this process changes the allocators.
_left_alone = False


def keep_freed_memory(max_bytes: int) -> int:
    """Keep up to `max_bytes` of freed memory for reuse (module docstring);
    the bound in place afterwards (0: nothing changed)."""
    global _kept_bytes
    with _lock:
        if _left_alone or max_bytes <= _kept_bytes:
            return _kept_bytes
        if records._crecords is not None:
            records._crecords.keep_freed_arenas(max_bytes)
        _malloc_tuning.tune(max_bytes)
        _kept_bytes = max_bytes
        return _kept_bytes


def leave_alone() -> None:
    """Make every later keep_freed_memory a no-op in this process (for a
    benchmark that measures a client with the allocators' defaults:
    bench.malloc_ab)."""
    global _left_alone
    with _lock:
        _left_alone = True
