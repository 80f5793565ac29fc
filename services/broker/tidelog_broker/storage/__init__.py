"""The broker's storage engine: partition logs on local disk.

It knows nothing of gRPC or etcd; the broker's manager calls it from one
asyncio event-loop thread, and no class here is thread-safe. Layers, from
the bottom up, one class per on-disk artifact:

- `files`: every on-disk name (log directories, segment files, markers), and
  deleting or renaming a segment's files as a whole.
- `index`: `OffsetIndex` (.index) and `TimeIndex` (.timeindex), sparse and
  derived from the log, kept in memory as arrays and appended to their files.
- `segment`: `LogSegment`, one .log file of record batches with its indexes:
  append, read whole batches, recover after a crash.
- `partition_log`: `PartitionLog`, a directory of segments: offsets, rolling,
  the flush policy and recovery point, retention (log start offset),
  truncation, and the hand-over of a compaction round; helped by
  `checkpoints` (the small files beside the segments), `log_loader` (open:
  crash completion and recovery) and `cleaning_swap` (the crash-safe swap of
  compacted segments, and its completion at open).
- `cleaner`: one compaction round over a snapshot of a log's closed segments
  (offset map of key hashes, rewrite to `.cleaned` files); the only code here
  that runs in a worker thread, and it shares nothing with the event loop.
- `config` (`LogConfig`, topic configs with Kafka's names) and `clock`
  (injected time, `ManualClock` for tests).

Errors: `PartitionLog` raises `tidelog.errors.StorageError` for any I/O error
and `OffsetOutOfRangeError` for a read outside the log; a reset or a
truncation that fails part-way takes the log offline (`PartitionLog.offline`:
StorageError for everything until the directory is opened again); a log
that cannot be opened at all is hosted as an `UnopenedLog` (`unopened_log`),
offline from the start, so that its neighbours open and serve.
"""

from tidelog_server.clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock

from tidelog_broker.storage.config import LogConfig, config_to_strings, parse_topic_configs
from tidelog_broker.storage.partition_log import AppendInfo, PartitionLog, ReadResult
from tidelog_broker.storage.segment import LogSegment
from tidelog_broker.storage.unopened_log import UnopenedLog

__all__ = [
    "SYSTEM_CLOCK",
    "AppendInfo",
    "Clock",
    "LogConfig",
    "LogSegment",
    "ManualClock",
    "PartitionLog",
    "ReadResult",
    "SystemClock",
    "UnopenedLog",
    "config_to_strings",
    "parse_topic_configs",
]
