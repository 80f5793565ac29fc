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

What: once per process, when a consumer is made with a bound above what is
in place, tidelog._crecords keeps up to that many bytes of freed arenas for
reuse, and, on glibc, keeps up to that much free at the top of each heap
(M_TRIM_THRESHOLD) and serves allocations up to 16 MiB from the heap
(M_MMAP_THRESHOLD). The memory is not lost: it is reused by the process,
and the resident size stays up to the bound (per glibc heap) above what is
in use. A process's MALLOC_TRIM_THRESHOLD_ / MALLOC_MMAP_THRESHOLD_ (or
GLIBC_TUNABLES) win over the glibc part. Without the C extension nothing
is changed. A bound of 0 leaves the allocators as they are; a later consumer
with a larger bound raises it, none lowers it (the allocators are shared by
everything in the process).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from tidelog import records

#: Allocations up to this size come from glibc's heap (the fetch answers:
#: max_partition_fetch_bytes is 1 MiB by default).
GLIBC_MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024
#: mallopt takes an int.
_INT_MAX = 2**31 - 1
#: Environment variables through which the user already set glibc's.
_GLIBC_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")

_kept_bytes = 0


def keep_freed_memory(max_bytes: int, environ: Mapping[str, str] = os.environ) -> int:
    """Keep up to `max_bytes` of freed memory for reuse (module docstring);
    the bound in place afterwards (0: nothing changed)."""
    global _kept_bytes
    crecords = records._crecords
    if max_bytes <= _kept_bytes or crecords is None:
        return _kept_bytes
    crecords.keep_freed_arenas(max_bytes)
    tunables = environ.get("GLIBC_TUNABLES", "")
    if not any(name in environ for name in _GLIBC_VARIABLES) and "malloc." not in tunables:
        bound = min(max_bytes, _INT_MAX)
        crecords.keep_freed_heap(bound, min(bound, GLIBC_MMAP_THRESHOLD_BYTES))
    _kept_bytes = max_bytes
    return _kept_bytes
