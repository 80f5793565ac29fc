"""What a crash cannot take back from a directory, followed through the real fsyncs.

POSIX promises a file's bytes once the file is fsynced, and a name (a
creation, a rename) once its directory is; nothing orders writes that were
not fsynced, so a crash (power loss) may keep any of them and lose any
other. A test builds the state a crash leaves from the files as they are,
bringing back under a name what the disk holds there (`bring_back`) where
it chooses a write that was never made durable to be lost.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


class DurableDirectory:
    """The durable state of one directory: each name as the directory's last
    fsync saw it, each file's bytes as its last fsync left them. It starts
    from the directory as it is (as if the kernel had just written
    everything back). Every `os.fsync` still goes to the kernel; this only
    watches which file or directory it was for.
    """

    def __init__(self, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.directory = directory.resolve()
        self._inodes: dict[str, int] = {}
        self._contents: dict[int, bytes] = {}
        self._note_names()
        for name, inode in self._inodes.items():
            self._contents[inode] = (self.directory / name).read_bytes()
        real_fsync = os.fsync

        def watched_fsync(fd: int) -> None:
            real_fsync(fd)
            self._note_fsync(fd)

        monkeypatch.setattr(os, "fsync", watched_fsync)

    def _note_names(self) -> None:
        self._inodes = {
            entry.name: entry.inode()
            for entry in os.scandir(self.directory)
            if entry.is_file(follow_symlinks=False)
        }

    def _note_fsync(self, fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path == self.directory:
            self._note_names()
        elif path.parent == self.directory and path.is_file():
            self._contents[os.fstat(fd).st_ino] = path.read_bytes()

    @property
    def names(self) -> set[str]:
        """The names the directory's last fsync saw."""
        return set(self._inodes)

    def bring_back(self, name: str) -> None:
        """Put under `name` what the disk holds there after a crash that lost
        every write to it not yet made durable: the file the name pointed to
        at the directory's last fsync, with the bytes of that file's last
        fsync (none if it was never fsynced), or no file at all."""
        path = self.directory / name
        inode = self._inodes.get(name)
        if inode is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(self._contents.get(inode, b""))
