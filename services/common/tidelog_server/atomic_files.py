"""Replacing a small file atomically: every checkpoint and metadata file the
servers write goes through `write_atomically`.

The new content is written to `<name>.tmp` in the same directory (a rename
is atomic only within one file system) and renamed over the target, so a
reader never sees the target half-written. What survives a crash depends on
the fsyncs, chosen per file by how much its loss would cost:

- `Durability.DURABLE` (the default): the temporary file is fsynced before
  the rename and the directory after it, so once the call returns the new
  content survives a crash. For files that must never go back (topic
  metadata, producer ids, the cleaner checkpoint, the epoch history).
- `Durability.CONTENT`: the temporary file is fsynced, the directory is not.
  After a crash the target holds the old content or the new, whole; a lost
  update must be harmless (a producer-state snapshot: without it the next
  open scans more headers).
- `Durability.NONE`: rename only. After a crash the target may even be empty
  or torn on some file systems; only for hints whose reader treats a bad file
  as absent and whose loss costs only work (the recovery point, written on
  every flush: an fsync more there would double the cost of a flush).

A write that fails before the rename leaves the target as it was and
removes the temporary file.
Leftover `.tmp` files from a crash are the caller's to clean up (a partition
log's open removes them). Thread-safe for distinct targets; two writers of
one target must not overlap (they would share the temporary name).

No dependency beyond the standard library: the storage engine uses it.
"""

from __future__ import annotations

import contextlib
import enum
import os
from pathlib import Path

#: Appended to the target's name while the new content is written.
TEMP_SUFFIX = ".tmp"


class Durability(enum.Enum):
    """Which fsyncs `write_atomically` does (see the module docstring)."""

    #: fsync the file, rename, fsync the directory: the new content survives a crash.
    DURABLE = "durable"
    #: fsync the file, rename: a crash leaves the old content or the new, whole.
    CONTENT = "content"
    #: rename only: a crash may leave anything, the reader must cope.
    NONE = "none"


def write_atomically(path: Path, data: bytes, durability: Durability = Durability.DURABLE) -> None:
    """Replace the file at `path` with `data`, atomically (see the module
    docstring for what each `durability` guarantees). Raises OSError: the
    target is then unchanged, unless only the directory fsync failed."""
    temp = path.with_name(path.name + TEMP_SUFFIX)
    try:
        with open(temp, "wb") as out:
            out.write(data)
            out.flush()
            if durability is not Durability.NONE:
                os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
        raise
    if durability is Durability.DURABLE:
        fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make file creations, renames and deletions in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
