"""Opening a partition log's directory: finishing what a crash interrupted,
loading the segments, and recovering those that need it.

`load` first puts the directory in order. A `reset_to` cut short (its
`reset-offset` file is there) is finished: every segment file goes, the log
start is that offset, and the cleaner checkpoint says nothing above it; the
epoch history and the producer state go in `PartitionLog.open`, which then
removes the file. (A log that ends below its start, with no such file, is
what an older broker left of a reset cut short: it is finished the same
way.) Then leftover temporary, `.deleted` and `.cleaned` files
are removed, committed swaps of cleaned segments completed
(`cleaning_swap.complete_interrupted`), index files without a .log removed
(a crash mid-roll or mid-deletion), and segments wholly below the log start
deleted (a retention pass cut short).

It then loads every segment cheaply (indexes plus a walk of the last few
batch headers). Unless the `clean-shutdown` marker says the log was closed
cleanly, every segment holding offsets at or above the recovery point is
recovered: each batch's CRC32C checked, indexes rebuilt, a torn or corrupt
tail cut off. Any segment whose files do not add up is recovered whatever
the marker says. Nothing after damage may be readable, so every segment
after a damaged one is deleted. Below the cleaner's gap limit, segments may
have been rewritten by the cleaner and hold offset gaps; above it, a gap
between segments is damage.

A recovery point past the log end means a truncation or a reset was cut
short by a crash after it cut the log and before it lowered the recovery
point (or a broker that lowered it without an fsync wrote it): it vouches
for nothing there, so, as Kafka does, the segment holding the end of the log
is recovered whatever the marker says. Whenever the recovery point comes out
of `load` lower than the file says, the file is lowered durably before the
log is used (the invariant of `PartitionLog`).

A log that was not closed cleanly may have lost its tail
(`LoadedLog.may_have_lost_tail`, Kafka's stance since KIP-966): records it
held, and may have acknowledged as an in-sync replica, may be gone without
recovery finding any damage. A crash that cuts a segment exactly at a batch
boundary leaves a log that recovers clean (after a power loss, ext4 with
data=ordered leaves a file at the size of an earlier write(): at a batch
boundary), so the missing marker is what says so, as do damage cut off and
a recovery point past the end (flushed records gone). A directory this load
creates has nothing to lose. The cluster keeps such a replica from being
elected while another in-sync replica may return
(LogManager.torn_partitions).

The epoch history and the producer state are the log's: `PartitionLog.open`
brings them in line with what `load` kept (`recovered_from` says where the
epoch history must be learnt from the batches again). Raises OSError.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tidelog_server.atomic_files import fsync_directory

from tidelog_broker.storage import checkpoints, cleaning_swap, files
from tidelog_broker.storage.config import LogConfig
from tidelog_broker.storage.segment import LogSegment, close_all

logger = logging.getLogger("tidelog.broker.storage")


class TailLoss(enum.Enum):
    """Why a log may have lost records at its end that it held before it
    was opened (`LoadedLog.may_have_lost_tail`), most certain first."""

    #: Recovery found damage (a torn or corrupt batch, or segments that do
    #: not meet) and cut the log there.
    DAMAGE = "damage cut off by recovery"
    #: The recovery point checkpoint is past the recovered log end: records
    #: flushed before the crash are gone.
    PAST_END = "recovery point past the log end"
    #: No clean-shutdown marker: a crash may have cut a segment anywhere,
    #: a batch boundary included, which no check can tell from an end.
    UNCLEAN_SHUTDOWN = "not closed cleanly"


@dataclass(frozen=True, slots=True)
class LoadedLog:
    """What `load` found and kept: a log's segments and offsets after recovery."""

    #: At least one, in offset order.
    segments: list[LogSegment]
    recovery_point: int
    log_start_offset: int
    clean_offset: int
    gap_limit: int
    #: Segments were deleted after damage: the next flush fsyncs the directory.
    directory_dirty: bool
    #: Base offset of the first segment recovery checked (None: none was).
    #: Every batch at or above the recovery point on disk is in that segment
    #: or a later one.
    recovered_from: int | None
    #: A `reset_to` cut short was finished: the log is empty at its start
    #: offset; its epoch history and producer state must go too, and then
    #: the `reset-offset` file (`PartitionLog.open` does both).
    reset: bool
    #: Records it held before the crash may be gone, and why (None: it was
    #: closed cleanly, or its directory is new): see the module doc.
    may_have_lost_tail: TailLoss | None = None


def load(directory: Path, name: str, config: LogConfig, now_ms: int) -> LoadedLog:
    """Open the log in `directory` (created if needed) and recover what
    needs it. `name` (`orders-3`) is for log messages.

    If it fails part-way (a segment file that cannot be opened or read, a
    checkpoint that cannot be written), the segments it opened are closed
    before the error propagates: nobody else holds them, and a log that
    fails to open is tried again at every start of the broker."""
    opened: list[LogSegment] = []
    try:
        return _load(directory, name, config, now_ms, opened)
    except BaseException:
        close_all(opened)
        raise


def _load(
    directory: Path, name: str, config: LogConfig, now_ms: int, opened: list[LogSegment]
) -> LoadedLog:
    """`load`, adding every segment it opens to `opened`."""
    created = not directory.is_dir()
    if created:
        directory.mkdir(parents=True)
        fsync_directory(directory.parent)
    clean_shutdown = checkpoints.take_clean_shutdown_marker(directory)
    recovery_point = checkpoints.read_recovery_point(directory)
    log_start_offset = checkpoints.read_log_start_offset(directory) or 0
    clean_offset, gap_limit, swap_ends = checkpoints.read_cleaner_checkpoint(directory)
    reset_offset = checkpoints.read_reset_offset(directory)
    if reset_offset is not None:
        log_start_offset, clean_offset, gap_limit = _finish_reset(
            directory, name, reset_offset, clean_offset, gap_limit, swap_ends
        )
        swap_ends = {}
    base_offsets = _segment_base_offsets(directory, swap_ends)
    # Segments wholly below the log start: a retention pass was cut short.
    while len(base_offsets) > 1 and base_offsets[1] <= log_start_offset:
        files.delete_segment_files(directory, base_offsets.pop(0))
    for base_offset in base_offsets:
        opened.append(
            LogSegment.open(directory, base_offset, now_ms, allow_gaps=base_offset < gap_limit)
        )
    segments = list(opened)
    # A log ending below its start (a gap between them) can only be what a
    # broker from before the reset-offset file left of a reset cut short: it
    # wrote the new start first. Finish that reset too. (A log ending AT its
    # start is DeleteRecords or retention up to the end, and keeps its
    # history.)
    legacy_reset = (
        reset_offset is None and bool(segments) and segments[-1].next_offset < log_start_offset
    )
    if legacy_reset:
        logger.warning(
            "%s: the log ends at %d, below its start %d: finishing a reset cut short by a "
            "crash (written by an older broker)",
            name,
            segments[-1].next_offset,
            log_start_offset,
        )
        for segment in segments:
            segment.delete()
        segments = []
    if not segments:
        segments = [LogSegment.create(directory, log_start_offset)]
        opened.append(segments[0])
    # Without a recovery point, every segment is recovered.
    recover_above = -1 if recovery_point is None else recovery_point
    past_end = recovery_point is not None and _past_the_end(segments, recovery_point)
    if past_end:
        recover_above = _last_batch_segment(segments).base_offset
        logger.warning(
            "%s: recovery point %d is past the log end %d (a truncation or reset cut short "
            "by a crash): recovering from offset %d",
            name,
            recovery_point,
            segments[-1].next_offset,
            recover_above,
        )
    trust_all = clean_shutdown and recovery_point is not None and not past_end
    kept, damaged_at, recovered_from = _recover(
        name, segments, recover_above, trust_all, gap_limit, config.index_interval_bytes
    )
    log_end_offset = kept[-1].next_offset
    log_start_offset = min(max(log_start_offset, kept[0].base_offset), log_end_offset)
    if len(kept) < len(segments):
        logger.warning(
            "%s: deleted %d segments after damage at offset %s",
            name,
            len(segments) - len(kept),
            damaged_at,
        )
    new_recovery_point = max(log_start_offset, min(max(recover_above, 0), log_end_offset))
    if recovery_point is not None and recovery_point > new_recovery_point:
        # Before anything is appended above the log end.
        checkpoints.write_recovery_point(directory, new_recovery_point, durable=True)
    return LoadedLog(
        segments=kept,
        recovery_point=new_recovery_point,
        log_start_offset=log_start_offset,
        clean_offset=min(max(clean_offset, log_start_offset), log_end_offset),
        gap_limit=gap_limit,
        directory_dirty=len(kept) < len(segments),
        recovered_from=recovered_from,
        reset=reset_offset is not None or legacy_reset,
        may_have_lost_tail=_tail_loss(damaged_at is not None, past_end, clean_shutdown or created),
    )


def _tail_loss(damaged: bool, past_end: bool, closed_cleanly: bool) -> TailLoss | None:
    """Why the log may have lost records it held (None: it may not). Logged
    by the LogManager, one line per hosting, not here: every log of a
    broker that was killed is one, and a broker may host thousands."""
    if damaged:
        return TailLoss.DAMAGE
    if past_end:
        return TailLoss.PAST_END
    if not closed_cleanly:
        return TailLoss.UNCLEAN_SHUTDOWN
    return None


def _finish_reset(
    directory: Path,
    name: str,
    offset: int,
    clean_offset: int,
    gap_limit: int,
    swap_ends: dict[int, int],
) -> tuple[int, int, int]:
    """Finish a `reset_to` cut short: drop every segment file, start the log
    at `offset`, and lower the cleaner checkpoint to it (nothing above it is
    clean or gapped any more). Each change is durable before the caller
    removes the `reset-offset` file. Returns the log start, clean offset and
    gap limit."""
    logger.warning("%s: finishing a reset to offset %d cut short by a crash", name, offset)
    files.delete_every_segment(directory)
    # Durably, with the deletions above (the directory's fsync).
    checkpoints.write_log_start_offset(directory, offset, durable=True)
    if clean_offset > offset or gap_limit > offset or swap_ends:
        clean_offset, gap_limit = min(clean_offset, offset), min(gap_limit, offset)
        checkpoints.write_cleaner_checkpoint(directory, clean_offset, gap_limit)
    return offset, clean_offset, gap_limit


def _recover(
    name: str,
    segments: list[LogSegment],
    recover_above: int,
    trust_all: bool,
    gap_limit: int,
    index_interval_bytes: int,
) -> tuple[list[LogSegment], int | None, int | None]:
    """Recover the segments that need it; delete every segment after damage.
    Returns the segments kept, the offset of the damage and the base offset
    of the first segment recovered (each None if none)."""
    kept: list[LogSegment] = []
    damaged_at: int | None = None
    recovered_from: int | None = None
    for segment in segments:
        if damaged_at is not None:
            segment.delete()
            continue
        if kept and _segments_do_not_meet(kept[-1], segment, gap_limit):
            # Offsets are dense outside the cleaned part, so a hole there
            # means the previous segment lost its tail; an overlap is
            # damage anywhere.
            damaged_at = kept[-1].next_offset
            segment.delete()
            continue
        if segment.needs_recovery or (not trust_all and segment.next_offset > recover_above):
            # No limit from max.message.bytes: it may have been lowered
            # since older batches were written, and they are still good. A
            # corrupt length costs one read bounded by the file's size.
            dropped_bytes = segment.recover(None, index_interval_bytes)
            if recovered_from is None:
                recovered_from = segment.base_offset
            if dropped_bytes:
                logger.warning(
                    "%s: recovery dropped %d bytes from the end of %s; the log now ends "
                    "at offset %d",
                    name,
                    dropped_bytes,
                    segment.log_path.name,
                    segment.next_offset,
                )
                damaged_at = segment.next_offset
        kept.append(segment)
    return kept, damaged_at, recovered_from


def _past_the_end(segments: list[LogSegment], recovery_point: int) -> bool:
    """Whether the log ends below `recovery_point`, as far as the cheap load
    can tell (a last segment that needs recovery gets it anyway)."""
    last = segments[-1]
    return not last.needs_recovery and recovery_point > last.next_offset


def _last_batch_segment(segments: list[LogSegment]) -> LogSegment:
    """The segment holding the last batch of the log (the first if none does)."""
    for segment in reversed(segments):
        if segment.size_bytes:
            return segment
    return segments[0]


def _segments_do_not_meet(previous: LogSegment, segment: LogSegment, gap_limit: int) -> bool:
    if previous.next_offset > segment.base_offset:
        return True
    gap = previous.next_offset < segment.base_offset
    return gap and previous.base_offset >= gap_limit


def _segment_base_offsets(directory: Path, swap_ends: dict[int, int]) -> list[int]:
    """Base offsets of the segments in `directory`, sorted, after finishing
    what a crash interrupted: leftover temporary, `.deleted` and `.cleaned`
    files are removed, committed swaps completed (`swap_ends`: the end of the
    range each group of the swap in flight replaces, by base offset, from the
    checkpoint), and index files without a .log removed (a crash mid-roll or
    mid-deletion).
    """
    logs: set[int] = set()
    indexes: list[tuple[int, Path]] = []
    swaps: dict[int, list[Path]] = {}
    for entry in os.scandir(directory):
        name = entry.name
        if name.endswith((files.TEMP_SUFFIX, files.DELETED_SUFFIX, files.CLEANED_SUFFIX)):
            # Missing is fine: gone is what is wanted, and a worker thread of
            # a LogManager closed just before in this process (unlinking the
            # `.deleted` files of a swap or a retention pass) may unlink it
            # first; failing on it hosted the log offline.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
            continue
        if name.endswith(files.SWAP_SUFFIX):
            parsed = files.parse_segment_file_name(name[: -len(files.SWAP_SUFFIX)])
            if parsed is not None:
                swaps.setdefault(parsed[0], []).append(Path(entry.path))
            continue
        parsed = files.parse_segment_file_name(name)
        if parsed is None:
            continue
        base_offset, suffix = parsed
        if suffix == files.LOG_SUFFIX:
            logs.add(base_offset)
        else:
            indexes.append((base_offset, Path(entry.path)))
    if swaps:
        cleaning_swap.complete_interrupted(directory, swaps, logs, swap_ends)
    for base_offset, path in indexes:
        if base_offset not in logs:
            path.unlink(missing_ok=True)
    return sorted(logs)
