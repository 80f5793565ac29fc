"""The data directory's lock: one broker process per data directory, as
Kafka's `.lock` in each log directory.

`DataDirLock.acquire` takes an exclusive, non-blocking `flock` on
`<data-dir>/.lock` (created if missing) and keeps its descriptor open until
`release`: the LogManager takes it when it opens the directory and lets it
go at its close, so a broker holds it for as long as it runs, in cluster
and standalone mode alike. A second process (or a second LogManager in this
process: flock locks belong to the open file description) is refused with
`DataDirLockedError`, naming the directory and the pid that holds it.

The kernel drops a flock when the last descriptor of its open file
description closes, so a process that dies, SIGKILL included, leaves no
stale lock: the next start takes it at once. The file stays (removing it
would race a process opening it); its content, the holder's pid, is only
for the error message. Linux/POSIX only, as the broker.

What holding it guarantees: only this process writes the data directory's
files meanwhile, among them the registration record (cluster_link's
`registration.json`) from which a restarted broker recognises its previous
incarnation's etcd lease.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from tidelog.errors import TidelogError

#: In the data directory (Kafka's name; no log directory is named so:
#: partition directories are `<topic>-<partition>`).
LOCK_FILE = ".lock"


class DataDirLockedError(TidelogError):
    """Another process (or another open of this one) holds the data
    directory's lock."""


class DataDirLock:
    """The exclusive lock of one data directory (see module doc)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise DataDirLockedError at once (no wait)."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise DataDirLockedError(
                f"data directory {self.data_dir} is in use by another broker process "
                f"({holder}): its lock {self.path} is held; one broker per data directory"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        # The holder's pid, for the error another start would show; a write
        # that fails costs only that detail.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Let the lock go (closing the descriptor drops the flock)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _read_holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "pid unknown"
