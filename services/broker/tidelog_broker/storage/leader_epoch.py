"""The leader epoch history of one partition log: `leader-epoch-checkpoint`.

Each entry says "epoch E started at offset S": the first offset written by
the leader of epoch E. Entries are strictly increasing in both epoch and
start offset. A leader appends an entry when it takes over with a new epoch
(at its log end offset); a follower appends one when it replicates the first
batch stamped with a new epoch. The history answers "where did epoch E end?"
(`end_offset_for_epoch`), which is how a follower of a new leader finds the
suffix of its log that diverged (KIP-101/KIP-320) and truncates it.

On disk: ASCII, one line per entry, `<epoch> <start_offset>\\n`, replaced
durably on every change (`tidelog_server.atomic_files`: a truncation that a
crash forgot would leave epochs past the log end). It is derived
from the batches' partition_leader_epoch fields, but not rebuilt from them:
a lost file only makes divergence detection start from an empty history,
which a follower treats as "truncate to what the leader says".

Not thread-safe: the log's event loop owns it.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from pathlib import Path

from tidelog_server.atomic_files import write_atomically

from tidelog_broker.storage import files

log = logging.getLogger("tidelog.broker.storage")

#: end_offset_for_epoch when no epoch at or below the one asked for is known.
UNDEFINED = (-1, -1)


class LeaderEpochCache:
    """(epoch, start_offset) entries of one log, persisted at every change."""

    def __init__(self, path: Path, entries: list[tuple[int, int]]) -> None:
        self.path = path
        self._entries = entries

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
            log.warning("ignoring unreadable %s: %s", path, exc)
            entries = []
        return cls(path, entries)

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The newest epoch known, -1 when none."""
        return self._entries[-1][0] if self._entries else -1

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` starts at `start_offset` (ignored unless newer)."""
        if self._entries and epoch <= self._entries[-1][0]:
            return
        # A new epoch starting below the last entry's start means that entry's
        # records were truncated away: drop it (its epoch wrote nothing kept).
        while self._entries and self._entries[-1][1] >= start_offset:
            self._entries.pop()
        self._entries.append((epoch, start_offset))
        self._write()

    def truncate_from_end(self, end_offset: int) -> None:
        """The log now ends at `end_offset`: forget epochs that start at or after it."""
        kept = [e for e in self._entries if e[1] < end_offset]
        if len(kept) != len(self._entries):
            self._entries = kept
            self._write()

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
