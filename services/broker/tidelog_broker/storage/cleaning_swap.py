"""The crash-safe swap of cleaned segments into a partition log, and its
completion by the next open after a crash.

The cleaner (`cleaner.clean`, in a worker thread) writes each group of
cleaned segments as fsynced `<B>.log.cleaned`, `.index.cleaned` and
`.timeindex.cleaned` files, where B is the base offset of the first segment
the group replaces. `PartitionLog.finish_cleaning` then swaps them in, on the
event loop, in this order:

1. the gap limit is raised to the new clean offset and the cleaner checkpoint
   written durably (`checkpoints.py`), with the offset range each group
   replaces (`swap_ends`), before any rewritten segment can become part of
   the log;
2. `commit`: every `.cleaned` file is renamed `.swap` (index files first, the
   .log last: a `.log.swap` is the commit point of its group), directory
   fsynced;
3. `replace_groups`, per group: the replaced segments are renamed `.deleted`
   (the first one last), then the `.swap` files are renamed into the first
   one's names; directory fsynced;
4. the clean offset is raised and the checkpoint written again (without
   the ranges).

Steps 1 and 4 change the log's offsets, so `PartitionLog` does them; this
module does the renames of steps 2 and 3.

Open completes an interrupted swap (`complete_interrupted`): for each
`<B>.log.swap` it removes every segment the group replaces, those whose base
offset lies in [B, end) with the end from the checkpoint, and renames the
swap files into place. Every one of them must go, not only those up to the
swap's last offset: a replaced segment past that offset holds only records
the cleaner dropped, superseded values among them, and the tombstone that
superseded them may be dropped by the same round (delete.retention.ms), in a
group that is swapped in too: kept, such a segment brings a deleted key
back. Stray `.cleaned` files (the open's directory scan removes them) and
index `.swap` files without their `.log.swap` are deleted. So a crash at any
point leaves each offset in exactly one segment, and each group either
wholly swapped in or not at all.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right
from collections.abc import Sequence
from pathlib import Path

from tidelog.records import HEADER_SIZE, read_header
from tidelog_server.atomic_files import fsync_directory

from tidelog_broker.storage import files
from tidelog_broker.storage.cleaner import CleanedGroup
from tidelog_broker.storage.segment import LogSegment

logger = logging.getLogger("tidelog.broker.storage")


def still_planned(
    groups: Sequence[CleanedGroup],
    planned: tuple[tuple[LogSegment, int], ...],
    segments: Sequence[LogSegment],
    base_offsets: Sequence[int],
) -> bool:
    """Whether every segment the groups replace is still in the log, closed,
    and of the size it had when the round was planned (retention or a
    truncation may have changed it meanwhile)."""
    by_base = {segment.base_offset: (segment, size) for segment, size in planned}
    active = segments[-1]
    for group in groups:
        for base_offset in group.replaces:
            segment, size = by_base[base_offset]
            i = bisect_right(base_offsets, base_offset) - 1
            if (
                i < 0
                or segments[i] is not segment
                or segment is active
                or segment.size_bytes != size
            ):
                return False
    return True


def discard(directory: Path, groups: Sequence[CleanedGroup]) -> list[Path]:
    """Give up a round: its `.cleaned` files are renamed `.deleted`; returns
    them, for the caller to unlink off the event loop."""
    paths: list[Path] = []
    for group in groups:
        paths.extend(files.rename_deleted(cleaned_paths(directory, group.base_offset)))
    return paths


def swap_ends(groups: Sequence[CleanedGroup], base_offsets: Sequence[int]) -> dict[int, int]:
    """For step 1: the end of the offset range each group replaces, by its
    base offset (the base offset of the segment after its last one).
    Recovery needs each group's whole range: its cleaned segment may end well
    before the last segment it replaces."""
    ends: dict[int, int] = {}
    for group in groups:
        after = bisect_right(base_offsets, group.base_offset) - 1 + len(group.replaces)
        ends[group.base_offset] = base_offsets[after]
    return ends


def commit(directory: Path, groups: Sequence[CleanedGroup]) -> None:
    """Step 2: `.cleaned` -> `.swap`, the .log of each group last (its commit
    point: an index .swap without its .log.swap is not committed, open
    deletes it); durable when this returns."""
    for group in groups:
        for path in cleaned_paths(directory, group.base_offset):
            os.replace(path, with_suffix(path, files.CLEANED_SUFFIX, files.SWAP_SUFFIX))
    fsync_directory(directory)


def replace_groups(
    directory: Path,
    segments: list[LogSegment],
    base_offsets: list[int],
    groups: Sequence[CleanedGroup],
    now_ms: int,
    index_interval_bytes: int,
) -> list[Path]:
    """Step 3: each group's segment replaces those it was cleaned from, in
    `segments` and `base_offsets` (the log's lists, updated in place) and on
    disk; durable when this returns. Returns the files renamed `.deleted`,
    for the caller to unlink off the event loop."""
    deleted: list[Path] = []
    for group in groups:
        first = bisect_right(base_offsets, group.base_offset) - 1
        replaced = segments[first : first + len(group.replaces)]
        for segment in reversed(replaced[1:]):
            segment.close()
            deleted.extend(files.rename_deleted(segment.file_paths))
        replaced[0].close()
        # Renamed away rather than replaced by the swap: a rename over a
        # file frees its blocks on the spot (~1 ms per MB here), which
        # belongs in the worker thread with the other unlinks.
        deleted.extend(files.rename_deleted(replaced[0].file_paths))
        for path in reversed(swap_paths(directory, group.base_offset)):
            os.replace(path, with_suffix(path, files.SWAP_SUFFIX, ""))
        segment = LogSegment.open(directory, group.base_offset, now_ms, allow_gaps=True)
        if segment.needs_recovery:
            segment.recover(None, index_interval_bytes)
        segments[first : first + len(replaced)] = [segment]
        base_offsets[first : first + len(replaced)] = [group.base_offset]
    fsync_directory(directory)
    return deleted


def complete_interrupted(
    directory: Path, swaps: dict[int, list[Path]], logs: set[int], swap_ends: dict[int, int]
) -> None:
    """At open: finish the swaps whose `.log.swap` exists; drop index swaps
    without one. `swaps`: the `.swap` files found, by base offset; `logs`:
    the base offsets of the `.log` files found, updated in place;
    `swap_ends`: from the cleaner checkpoint.

    Each committed group replaces every segment in [base, end): a kill may
    have left any of them, the one at `base` included (its old index files
    must not outlive it either). Deleted before the renames, so a kill in
    here leaves a swap that the next open completes the same way.
    """
    for base_offset in sorted(swaps):
        log_swap = files.segment_path(directory, base_offset, files.LOG_SUFFIX + files.SWAP_SUFFIX)
        if log_swap not in swaps[base_offset]:
            # Index swaps of a group never committed: all that matters is
            # that they be gone, so one already gone since the open's scan
            # listed it (removed by hand, or by whatever else cleaned up the
            # directory meanwhile) is as good as unlinked here. The renames
            # below stay strict: a committed group's `.swap` file vanishing
            # before its rename means something else is changing the log's
            # files under the open, not that the work is done.
            for path in swaps[base_offset]:
                path.unlink(missing_ok=True)
            continue
        end = swap_ends.get(base_offset)
        if end is None:
            # A checkpoint written before it recorded the ranges: the swap's
            # own offsets are the best bound left.
            end = max(_swap_next_offset(log_swap, base_offset), base_offset + 1)
        files.delete_segment_files(directory, base_offset)
        for other in sorted(logs):
            if base_offset < other < end:
                files.delete_segment_files(directory, other)
                logs.discard(other)
        for path in sorted(swaps[base_offset], key=lambda p: p == log_swap):
            os.replace(path, with_suffix(path, files.SWAP_SUFFIX, ""))
        logs.add(base_offset)
        logger.warning(
            "%s: completed an interrupted swap of cleaned segment %d (replacing offsets %d to %d)",
            directory.name,
            base_offset,
            base_offset,
            end,
        )
    fsync_directory(directory)


def _swap_next_offset(path: Path, base_offset: int) -> int:
    """The offset after the last whole batch of a swap file (headers only:
    it was fsynced before it was committed)."""
    next_offset = base_offset
    size = path.stat().st_size
    with open(path, "rb") as f:
        position = 0
        while position + HEADER_SIZE <= size:
            header = read_header(os.pread(f.fileno(), HEADER_SIZE, position))
            if header.size < HEADER_SIZE or position + header.size > size:
                break
            next_offset = header.next_offset
            position += header.size
    return next_offset


def with_suffix(path: Path, old: str, new: str) -> Path:
    """`path` with its name's ending `old` replaced by `new`."""
    assert path.name.endswith(old)
    return path.with_name(path.name[: len(path.name) - len(old)] + new)


def cleaned_paths(directory: Path, base_offset: int) -> list[Path]:
    """The .cleaned files of a group, index files first, the .log last."""
    return [
        files.segment_path(directory, base_offset, suffix + files.CLEANED_SUFFIX)
        for suffix in (files.INDEX_SUFFIX, files.TIME_INDEX_SUFFIX, files.LOG_SUFFIX)
    ]


def swap_paths(directory: Path, base_offset: int) -> list[Path]:
    """The .swap files of a group, index files first, the .log last."""
    return [
        files.segment_path(directory, base_offset, suffix + files.SWAP_SUFFIX)
        for suffix in (files.INDEX_SUFFIX, files.TIME_INDEX_SUFFIX, files.LOG_SUFFIX)
    ]
