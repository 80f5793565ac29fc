"""Names of everything the storage engine puts on disk, in one place.

A broker's data directory holds one directory per partition::

    <data-dir>/<topic>-<partition>/
        00000000000000000000.log        record batches, as produced (the data)
        00000000000000000000.index      offset index of that segment (derived)
        00000000000000000000.timeindex  time index of that segment (derived)
        00000000000000004096.log        the next segment: named by its base offset
        ...
        recovery-point                  offset below which every byte was fsynced
        clean-shutdown                  present only from a clean close to the next open
        log-start-offset                first offset still readable (retention moves it)
        cleaner-checkpoint              compaction's clean offset and gap limit
        reset-offset                    present only while a reset is in flight
        00000000000000004096.snapshot   idempotent producers' state below that offset
                                        (producer_state.py)
        topic-id                        the id of the topic incarnation the log belongs
                                        to (Kafka's partition.metadata): a topic deleted
                                        and created again under the same name never
                                        opens the old one's directory

Transient names, each removed or completed by the next open after a crash:
`<segment file>.deleted` (retention or a swap renamed it; unlinked by a worker
thread), `<segment file>.cleaned` (the cleaner is still writing it) and
`<segment file>.swap` (a cleaned segment, committed, waiting to replace the
segments it was cleaned from; see `cleaning_swap.py`).

Base offsets are zero-padded to 20 digits (the width of int64) so that `ls`
lists segments in offset order. Topic names may contain '-' and '.', so the
partition is what follows the last '-'.

Besides the names, the few operations on a segment's files as a whole that
open, retention, reset and the cleaning swap share: delete them (one
segment's, or every segment's), rename them `.deleted`, unlink what was
renamed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

from tidelog_server import atomic_files
from tidelog_server.atomic_files import Durability, fsync_directory, write_atomically

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)

RECOVERY_POINT_FILE = "recovery-point"
CLEAN_SHUTDOWN_FILE = "clean-shutdown"
LOG_START_OFFSET_FILE = "log-start-offset"
CLEANER_CHECKPOINT_FILE = "cleaner-checkpoint"
#: The offset a `PartitionLog.reset_to` in flight restarts the log at (checkpoints.py).
RESET_OFFSET_FILE = "reset-offset"
LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"
#: Appended to a segment file's name: renamed away, to be unlinked off the event loop.
DELETED_SUFFIX = ".deleted"
#: Appended to a segment file's name while the cleaner writes it (incomplete).
CLEANED_SUFFIX = ".cleaned"
#: Appended to a cleaned segment file's name once it is complete and committed.
SWAP_SUFFIX = ".swap"
#: Suffix of a file being written before it is renamed over its final name
#: (`tidelog_server.atomic_files` writes every checkpoint file this way).
TEMP_SUFFIX = atomic_files.TEMP_SUFFIX
#: Producer state snapshot, named by the offset it describes (producer_state.py).
SNAPSHOT_SUFFIX = ".snapshot"

#: The topic incarnation's id, in its partition directory.
TOPIC_ID_FILE = "topic-id"
#: Ends the name of a partition directory renamed aside to be deleted.
DELETE_DIR_SUFFIX = "-delete"
#: What a topic id looks like (the coordinator's and a standalone broker's
#: are 32 hex digits): printable ASCII without spaces, at most 64 characters.
#: A file holding anything else (a torn write, zeros) records no id.
_TOPIC_ID = re.compile(r"[!-~]{1,64}")

_OFFSET_DIGITS = 20

logger = logging.getLogger("tidelog.broker.storage")


def log_dir_name(topic: str, partition: int) -> str:
    """`orders-3` for partition 3 of topic `orders`."""
    return f"{topic}-{partition}"


def log_dir(data_dir: Path, topic: str, partition: int) -> Path:
    """The directory a partition's log lives in."""
    return data_dir / log_dir_name(topic, partition)


def parse_log_dir_name(name: str) -> tuple[str, int]:
    """(topic, partition) from a log directory name; ValueError if it is not one."""
    topic, sep, partition = name.rpartition("-")
    if not sep or not topic or not partition.isdigit():
        raise ValueError(f"{name!r} is not a log directory name (<topic>-<partition>)")
    return topic, int(partition)


def rename_for_deletion(directory: Path) -> Path:
    """Rename a partition directory to `<name>.<unique id>-delete` (one
    rename: the directory leaves its name whole) and return the new path.
    Raises OSError (FileNotFoundError if it is gone): it then keeps its name."""
    target = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}")
    os.rename(directory, target)
    # Durable, else a crash could bring the old name back.
    fsync_directory(directory.parent)
    return target


def is_renamed_for_deletion(name: str) -> bool:
    """Whether a data directory entry is a partition directory renamed
    aside to be deleted (never a log directory: those end in a number)."""
    return name.endswith(DELETE_DIR_SUFFIX)


#: Rounds of `remove_renamed` against entries that vanish under it (each
#: round one remover at least gets further; two in a row is already rare).
_REMOVE_ROUNDS = 100


def remove_renamed(directory: Path) -> bool:
    """Remove a directory renamed for deletion; False (logged) if some of it
    could not be (the next sweep tries again). True once it is gone, also
    when something else removes it meanwhile (an operator's `rm -rf`, a
    tool's `PartitionLog.delete` beside the broker's sweep): rmtree stops at
    the first entry that vanished under it, so it starts again on what is
    left."""
    for _ in range(_REMOVE_ROUNDS):
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:
            if not os.path.lexists(directory):
                return True
            # Something in it went under us, not all of it: again, on less.
        except OSError as exc:
            logger.warning("cannot remove %s yet: %s (retried later)", directory, exc)
            return False
        else:
            return True
    logger.warning("cannot remove %s yet: its entries keep vanishing (retried later)", directory)
    return False


def read_topic_id(directory: Path) -> str | None:
    """The topic id recorded in a partition directory; None when it has
    none (no directory yet, one written before ids were recorded, or a
    file that does not hold an id: see `write_topic_id`). Raises OSError if
    it cannot be read."""
    try:
        raw = (directory / TOPIC_ID_FILE).read_bytes()
    except FileNotFoundError:
        return None
    text = raw.decode("ascii", "replace").strip()
    if not _TOPIC_ID.fullmatch(text):
        logger.warning("%s: %r is not a topic id; taken as none", directory / TOPIC_ID_FILE, raw)
        return None
    return text


def write_topic_id(directory: Path, topic_id: str) -> None:
    """Record the topic id a partition directory belongs to, with no fsync
    (`Durability.NONE`; with both fsyncs creating a log took twice as long,
    ~2.1 ms instead of ~1.1): after a machine crash the file may be missing,
    empty or zeros, which `read_topic_id` takes as no id, never as another
    one, and a log without an id is adopted by the topic that opens it (as
    a log from before ids were recorded is) and given its id again. So the
    id protects a log once the kernel has written it back (within ~30 s)."""
    write_atomically(directory / TOPIC_ID_FILE, topic_id.encode("ascii"), Durability.NONE)


def segment_file_name(base_offset: int, suffix: str) -> str:
    """`00000000000000000042.log` for base offset 42 and suffix `.log`."""
    return f"{base_offset:0{_OFFSET_DIGITS}d}{suffix}"


def segment_path(directory: Path, base_offset: int, suffix: str) -> Path:
    return directory / segment_file_name(base_offset, suffix)


def parse_segment_file_name(name: str) -> tuple[int, str] | None:
    """(base offset, suffix) of a segment file name, or None for any other file."""
    for suffix in SEGMENT_SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            if len(stem) == _OFFSET_DIGITS and stem.isdigit():
                return int(stem), suffix
    return None


def snapshot_path(directory: Path, offset: int) -> Path:
    """`<directory>/00000000000000000042.snapshot` for offset 42."""
    return directory / segment_file_name(offset, SNAPSHOT_SUFFIX)


def parse_snapshot_file_name(name: str) -> int | None:
    """The offset of a producer snapshot's file name, or None for any other file."""
    if name.endswith(SNAPSHOT_SUFFIX):
        stem = name[: -len(SNAPSHOT_SUFFIX)]
        if len(stem) == _OFFSET_DIGITS and stem.isdigit():
            return int(stem)
    return None


def delete_segment_files(directory: Path, base_offset: int) -> None:
    """Unlink a segment's .log and indexes, whichever exist."""
    for suffix in SEGMENT_SUFFIXES:
        segment_path(directory, base_offset, suffix).unlink(missing_ok=True)


def delete_every_segment(directory: Path) -> None:
    """Unlink every segment file in `directory`, committed swaps (`.swap`)
    included: a reset finished by open keeps nothing of the old log."""
    for entry in os.scandir(directory):
        name = entry.name.removesuffix(SWAP_SUFFIX)
        if parse_segment_file_name(name) is not None:
            # Already gone is fine: every segment file is to go, so a
            # missing one is one fewer to remove, never a sign of lost data
            # (the log is being emptied; the reset-offset file, removed only
            # after this, keeps the reset to redo should a kill cut it short).
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def rename_deleted(paths: Sequence[Path]) -> list[Path]:
    """Rename files to `<name>.deleted` (cheap); return the new paths."""
    renamed = []
    for path in paths:
        target = path.with_name(path.name + DELETED_SUFFIX)
        try:
            os.replace(path, target)
        except FileNotFoundError:
            continue
        renamed.append(target)
    return renamed


def unlink_files(paths: Sequence[Path], stop: threading.Event | None = None) -> int:
    """Unlink files (a worker thread's job: unlinking a large file can take
    milliseconds). Returns how many were removed; errors are logged. Stops
    before the next file once `stop` is set (the broker closing): the files
    are renamed `.deleted`, which the next open removes."""
    removed = 0
    for path in paths:
        if stop is not None and stop.is_set():
            break
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("cannot unlink %s: %s (the next open removes it)", path, exc)
    return removed
