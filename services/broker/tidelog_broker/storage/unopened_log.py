"""A partition log that could not be opened (`UnopenedLog`): what the
broker hosts in its place, offline from the start.

Kafka starts, and goes on hosting the rest, when a log directory fails
at load: the directory's replicas are offline and the controller is told.
Here the unit is the partition: when `PartitionLog.open` raises
StorageError (EIO, an unreadable checkpoint, a deleted topic's directory
that cannot be renamed aside), the LogManager hosts an UnopenedLog for that
partition and opens the others. It is an ordinary PartitionLog in the
offline state (`PartitionLog.offline`), so every path that handles an
offline log handles it unchanged: lookups answer StorageError, it is listed
in `LogManager.offline_partitions` (and so in the broker's registration:
the controller never elects it and keeps it out of the ISR), the background
loops and the replica fetcher skip it, it may follow or have no leader but
never lead, and deleting its topic renames its directory aside.

It reads nothing of its directory and holds no file: no segment, an empty
epoch history and producer state, offsets 0 (never reported: Describe,
like every path, answers an offline log with its STORAGE_ERROR, and -1
figures). It stays offline until the broker restarts and opens
the directory again, as any offline log: what failed is the disk or damage
from outside, which a retry in the same process would only meet again (and
Kafka, too, brings a failed log directory back only with a restart).

Not thread-safe, as PartitionLog.
"""

from __future__ import annotations

from pathlib import Path

from tidelog.errors import StorageError
from tidelog_server.clock import Clock

from tidelog_broker.storage import files
from tidelog_broker.storage.config import LogConfig
from tidelog_broker.storage.leader_epoch import LeaderEpochCache
from tidelog_broker.storage.partition_log import PartitionLog

__all__ = ["UnopenedLog"]


class UnopenedLog(PartitionLog):
    """Stands in for the log of a partition whose open failed with `error`."""

    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        clock: Clock,
        error: StorageError,
    ) -> None:
        super().__init__(
            directory,
            topic,
            partition,
            config,
            clock,
            segments=[],
            recovery_point=0,
            # Not loaded: the directory is what failed.
            leader_epochs=LeaderEpochCache(directory / files.LEADER_EPOCH_CHECKPOINT_FILE, []),
        )
        self._offline = f"opening it failed: {error}"

    @property
    def log_end_offset(self) -> int:
        # Nothing is known of its records: it has no segment.
        return 0
