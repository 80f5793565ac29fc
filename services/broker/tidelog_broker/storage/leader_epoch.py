"""The leader epoch history of one partition log: `leader-epoch-checkpoint`.

Each entry says "epoch E started at offset S": the first offset written by
the leader of epoch E. Entries are strictly increasing in both epoch and
start offset. A leader appends an entry when it takes over with a new epoch
(at its log end offset); a follower appends one when it replicates the first
batch stamped with a new epoch. The history answers "where did epoch E end?"
(`end_offset_for_epoch`), which is how a follower of a new leader finds the
suffix of its log that diverged (KIP-101/KIP-320) and truncates it.

On disk: ASCII, one line per entry, `<epoch> <start_offset>\\n`, always
replaced durably (`tidelog_server.atomic_files`, two fsyncs), but not at
every change. `assign` only changes memory: an election must not cost
fsyncs on the event loop (a broker that dies leaving 3,000 partitions to
the others made each of them do 6,000 in a row). The file is written by
`flush`, which the log calls with its own flush before it moves the
recovery point, and by `truncate_from_end`, at once. The invariant that
makes a stale file safe:

    For every offset below the recovery point on disk, the file on disk
    names the epoch of the batch at that offset.

`assign` keeps it: a new entry starts at the log end, at or above the
recovery point. The log's flush keeps it: the file is written before the
recovery point moves. A truncation keeps it: it only lowers the recovery
point, and that is made durable with the truncation (`PartitionLog.truncate_to`,
`reset_to`), so that no batch appended after it can sit below a stale
recovery point. So after a crash, open (`rebuild`) keeps the file's entries,
drops those at or past the log end, and reads the batch headers from the
first segment recovery checked (which starts at or below the recovery
point): every batch stamped with an epoch newer than the last entry starts a
new one, as in Kafka since KAFKA-15046. What can still be missing is an
epoch that wrote no batch: it could only be the last entry (a newer epoch's
entry replaces every entry starting at or after its own start), and
`end_offset_for_epoch` gives the same end offset without it.

`truncate_from_end` writes at once, for the log's truncation: a follower
truncates where its history says its epochs left the leader's, and a
truncation the file forgot would keep naming an epoch for offsets that now
hold another epoch's batches (with no newer epoch to replace it).

A file that exists but cannot be read means entries below the recovery point
may be lost: `unreadable` tells open to rebuild from every batch.

Not thread-safe: the log's event loop owns it.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Iterable
from pathlib import Path

from tidelog.records import BatchHeader
from tidelog_server.atomic_files import write_atomically

from tidelog_broker.storage import files

log = logging.getLogger("tidelog.broker.storage")

#: end_offset_for_epoch when no epoch at or below the one asked for is known.
UNDEFINED = (-1, -1)


class LeaderEpochCache:
    """(epoch, start_offset) entries of one log; see the module docstring
    for when they reach the disk."""

    def __init__(
        self, path: Path, entries: list[tuple[int, int]], *, unreadable: bool = False
    ) -> None:
        self.path = path
        self._entries = entries
        #: The file existed but could not be read: entries may be missing anywhere.
        self.unreadable = unreadable
        # Changed since the file was last written.
        self._dirty = False

    @classmethod
    def load(cls, directory: Path) -> LeaderEpochCache:
        path = directory / files.LEADER_EPOCH_CHECKPOINT_FILE
        entries: list[tuple[int, int]] = []
        try:
            for line in path.read_text().splitlines():
                epoch, start = (int(x) for x in line.split())
                if not entries or (epoch > entries[-1][0] and start >= entries[-1][1]):
                    entries.append((epoch, start))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("%s unreadable (%s): rebuilding it from every batch", path, exc)
            return cls(path, [], unreadable=True)
        return cls(path, entries)

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The newest epoch known, -1 when none."""
        return self._entries[-1][0] if self._entries else -1

    @property
    def dirty(self) -> bool:
        """Changed since the file was last written (`flush` writes it)."""
        return self._dirty

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` starts at `start_offset` (ignored unless newer),
        in memory only: callers assign at the log end, at or above the
        recovery point, so the file may lag until the log's flush writes it
        (module docstring)."""
        if self._entries and epoch <= self._entries[-1][0]:
            return
        # A new epoch starting below the last entry's start means that entry's
        # records were truncated away: drop it (its epoch wrote nothing kept).
        while self._entries and self._entries[-1][1] >= start_offset:
            self._entries.pop()
        self._entries.append((epoch, start_offset))
        self._dirty = True

    def truncate_from_end(self, end_offset: int) -> None:
        """The log now ends at `end_offset`: forget epochs that start at or
        after it. Durable when it returns if anything was forgotten."""
        kept = [e for e in self._entries if e[1] < end_offset]
        if len(kept) != len(self._entries):
            self._entries = kept
            self._write()

    def flush(self) -> None:
        """Write the file durably if anything changed since it was written
        (or it was unreadable)."""
        if self._dirty or self.unreadable:
            self._write()

    def rebuild(self, headers: Iterable[BatchHeader], log_end_offset: int) -> None:
        """After recovery: forget entries at or past `log_end_offset`, then
        learn the epochs of `headers` (every batch from the first segment
        recovery checked to the log end, in order): each batch stamped with
        an epoch newer than the latest starts an entry. Entries that this
        changes reach the file with the next `flush`."""
        self.truncate_from_end(log_end_offset)
        for header in headers:
            epoch = header.partition_leader_epoch
            if epoch > self.latest_epoch:
                self.assign(epoch, header.base_offset)

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest known epoch <= `epoch`, the offset where it ended): the
        next epoch's start offset, or the log end for the latest epoch.
        UNDEFINED when every known epoch is newer than `epoch`."""
        starts = [e for e, _ in self._entries]
        i = bisect_right(starts, epoch) - 1
        if i < 0:
            return UNDEFINED
        found = self._entries[i][0]
        if i + 1 < len(self._entries):
            return found, self._entries[i + 1][1]
        return found, log_end_offset

    def _write(self) -> None:
        body = "".join(f"{epoch} {start}\n" for epoch, start in self._entries)
        write_atomically(self.path, body.encode("ascii"))
        self._dirty = False
        self.unreadable = False
