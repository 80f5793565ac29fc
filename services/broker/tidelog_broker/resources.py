"""What this machine lets the broker host: open files, hence partitions.

A partition replica holds descriptors for as long as it is hosted (its
active segment's .log, .index and .timeindex; an older segment's only while
it is read), and every connection and etcd watch holds one more. A broker
past its open-file limit fails everywhere at once (issue 16, item 7: one
7,000-partition topic stopped every broker), so the broker

- raises its soft RLIMIT_NOFILE to the hard limit at start;
- derives how many partition replicas it can host from that limit (or takes
  `max.partitions` when set), reports it in its etcd registration so that
  coordinators refuse topics the brokers cannot hold, and refuses to host
  more replicas itself (INVALID_PARTITIONS, logged) instead of falling over.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("tidelog.broker")

#: Descriptors a hosted partition replica may hold: the active segment's
#: three files, plus one for a read of an older segment or a checkpoint.
DESCRIPTORS_PER_PARTITION = 4
#: Descriptors kept for everything else: client connections, etcd, gRPC's
#: own, the Python runtime, files being written by the cleaner.
RESERVED_DESCRIPTORS = 128


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft


def open_file_limit() -> int:
    """The current soft RLIMIT_NOFILE."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def partition_capacity(open_file_limit: int, configured: int) -> int:
    """Partition replicas a broker may host: `configured` (max.partitions)
    when set, else what the open-file limit leaves after the reserve."""
    if configured > 0:
        return configured
    return max(0, (open_file_limit - RESERVED_DESCRIPTORS) // DESCRIPTORS_PER_PARTITION)
