"""The small files of a partition log's directory besides its segments.

Each is replaced whole through `tidelog_server.atomic_files`; what a crash may
do to it decides how durably:

- `recovery-point`: the offset below which every byte has been fsynced, as
  ASCII decimal and a newline. Raised after the fsyncs it vouches for, by
  rename, without an fsync of its own (`Durability.NONE`): a stale or
  unreadable file only makes the next open recover more than it had to.
  Lowered durably (a truncation, a reset, an open that finds the log ending
  below it): a stale, higher file would vouch for batches appended later
  below it, and recovery would never check them (nor learn their epochs
  again: `leader_epoch`).
- `clean-shutdown`: empty; written by `close` after everything is flushed and
  removed (durably) by the next open before anything is written.
- `log-start-offset`: the first readable offset, ASCII decimal. Retention
  writes it before renaming the segments it drops; open deletes segments
  that lie wholly below it (a retention pass cut short by a crash). A lost
  update is harmless: the first segment's base offset is a lower bound.
  DeleteRecords and `reset_to` write it durably.
- `reset-offset`: the offset a `PartitionLog.reset_to` in flight restarts
  the log at, ASCII decimal; present only from the reset's first durable
  step to its last. Written durably before the reset changes anything, and
  removed durably once every change is on disk: it is the reset's commit
  point. An open that finds it finishes the reset (`log_loader`): every
  segment, snapshot and epoch entry goes, the log is empty at that offset.
  Unreadable, it refuses the open: the old log and the empty one cannot be
  told apart.
- `cleaner-checkpoint`: two offsets, `clean_offset gap_limit`, then, while
  a swap is in flight, one `base-end` pair per cleaned group: the offsets
  [base, end) whose segments the group replaces (`cleaning_swap.py`).
  Written durably. Below the clean offset every key appears at most once
  (the cleaner maps only what is above it). Below the gap limit, segments
  may have been rewritten by the cleaner and hold offset gaps, so the
  density checks of recovery are relaxed there to "offsets increase"; above
  it, a gap still counts as damage.

The leader epoch history (`leader_epoch.py`) and the producer-state snapshots
(`producer_state.py`) are files of their own modules. Readers raise OSError
only where guessing would be unsafe (the cleaner checkpoint).
"""

from __future__ import annotations

import logging
from pathlib import Path

from tidelog_server.atomic_files import Durability, fsync_directory, write_atomically

from tidelog_broker.storage import files

logger = logging.getLogger("tidelog.broker.storage")


def read_recovery_point(directory: Path) -> int | None:
    """The recovery point, or None when absent or unreadable (recover everything)."""
    path = directory / files.RECOVERY_POINT_FILE
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        logger.warning("%s unreadable (%s): recovering every segment", path, exc)
        return None
    try:
        return int(text.strip())
    except ValueError:
        logger.warning("%s holds %r, not an offset: recovering every segment", path, text[:40])
        return None


def write_recovery_point(directory: Path, offset: int, durable: bool = False) -> None:
    """`durable`: on disk when this returns (the recovery point went down).
    Otherwise no fsync: a raised recovery point is written only after the
    data it vouches for is durable, so a lost or torn update can only make
    recovery do more."""
    write_atomically(
        directory / files.RECOVERY_POINT_FILE,
        f"{offset}\n".encode("ascii"),
        Durability.DURABLE if durable else Durability.NONE,
    )


def read_log_start_offset(directory: Path) -> int | None:
    """The log start offset, or None when absent or unreadable (the first
    segment's base offset then bounds it)."""
    path = directory / files.LOG_START_OFFSET_FILE
    try:
        return int(path.read_text(encoding="ascii").strip())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        logger.warning("%s unreadable (%s): ignoring it", path, exc)
        return None


def write_log_start_offset(directory: Path, offset: int, durable: bool = False) -> None:
    """`durable`: on disk when this returns (a reset); otherwise a lost
    update is harmless (retention)."""
    write_atomically(
        directory / files.LOG_START_OFFSET_FILE,
        f"{offset}\n".encode("ascii"),
        Durability.DURABLE if durable else Durability.NONE,
    )


def read_reset_offset(directory: Path) -> int | None:
    """The offset a reset in flight restarts the log at, or None when no
    reset is in flight. Raises OSError when the file cannot be read."""
    path = directory / files.RESET_OFFSET_FILE
    try:
        return int(path.read_text(encoding="ascii").strip())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        # Written durably by rename, so this is damage from outside: neither
        # keeping the old log nor finishing the reset would be a safe guess.
        raise OSError(f"{path} unreadable ({exc}): cannot tell whether the log was reset") from exc


def write_reset_offset(directory: Path, offset: int) -> None:
    """Durably: from the moment this returns, open finishes the reset."""
    write_atomically(directory / files.RESET_OFFSET_FILE, f"{offset}\n".encode("ascii"))


def remove_reset_offset(directory: Path) -> None:
    """Durably, once everything the reset changed is on disk: anything
    appended afterwards would be dropped by an open that found the file."""
    # Missing: a reset an older broker cut short, which had no such file.
    (directory / files.RESET_OFFSET_FILE).unlink(missing_ok=True)
    fsync_directory(directory)


def read_cleaner_checkpoint(directory: Path) -> tuple[int, int, dict[int, int]]:
    """(clean offset, gap limit, end of the range each group of a swap in
    flight replaces by its base offset); (0, 0, {}) when the log was never
    cleaned."""
    path = directory / files.CLEANER_CHECKPOINT_FILE
    try:
        clean_offset, gap_limit, *ranges = path.read_text(encoding="ascii").split()
        swap_ends: dict[int, int] = {}
        for pair in ranges:
            base, end = pair.split("-")
            swap_ends[int(base)] = int(end)
        return int(clean_offset), int(gap_limit), swap_ends
    except FileNotFoundError:
        return 0, 0, {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        # Written durably by rename, so this is damage from outside: without
        # the gap limit, compacted segments would look damaged. Refuse.
        raise OSError(
            f"{path} unreadable ({exc}): cannot tell compacted segments from damage"
        ) from exc


def write_cleaner_checkpoint(
    directory: Path, clean_offset: int, gap_limit: int, swap_ends: dict[int, int] | None = None
) -> None:
    """Durably: the gap limit, and the ranges a swap replaces, must be on
    disk before a gapped segment is."""
    ranges = "".join(f" {base}-{end}" for base, end in sorted((swap_ends or {}).items()))
    write_atomically(
        directory / files.CLEANER_CHECKPOINT_FILE,
        f"{clean_offset} {gap_limit}{ranges}\n".encode("ascii"),
    )


def take_clean_shutdown_marker(directory: Path) -> bool:
    """Whether the log was closed cleanly; the marker is gone for good when
    this returns, so a crash from here on cannot pass for a clean shutdown."""
    marker = directory / files.CLEAN_SHUTDOWN_FILE
    if not marker.exists():
        return False
    marker.unlink()
    fsync_directory(directory)
    return True


def mark_clean_shutdown(directory: Path) -> None:
    """After everything is flushed: the next open may trust the files."""
    (directory / files.CLEAN_SHUTDOWN_FILE).touch()
