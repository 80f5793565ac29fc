"""The one writer of checkpoint and metadata files: the target is never seen
half-written, a failure before the rename leaves it as it was, and each
durability level does exactly its fsyncs, in order."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from tidelog_server.atomic_files import (
    TEMP_SUFFIX,
    Durability,
    fsync_directory,
    write_atomically,
)


class _Recorder:
    """Wraps os.fsync and os.replace to record what happens, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[str] = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd: int) -> None:
            kind = "directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
            self.events.append(f"fsync {kind}")
            real_fsync(fd)

        def replace(src: str | Path, dst: str | Path) -> None:
            self.events.append("replace")
            real_replace(src, dst)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)


def test_replaces_the_content_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint"
    target.write_bytes(b"old\n")
    write_atomically(target, b"new\n")
    assert target.read_bytes() == b"new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_creates_a_missing_target(tmp_path: Path) -> None:
    target = tmp_path / "topics.json"
    write_atomically(target, b"{}")
    assert target.read_bytes() == b"{}"


@pytest.mark.parametrize("durability", list(Durability))
def test_the_target_is_whole_at_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: Durability
) -> None:
    """The seam is the rename: up to it the target holds the old content,
    and the temporary file already holds all of the new."""
    target = tmp_path / "checkpoint"
    target.write_bytes(b"old\n")
    new = b"x" * 100_000
    seen: list[tuple[bytes, bytes]] = []
    real_replace = os.replace

    def replace(src: str | Path, dst: str | Path) -> None:
        seen.append((Path(dst).read_bytes(), Path(src).read_bytes()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    write_atomically(target, new, durability)
    assert seen == [(b"old\n", new)]
    assert target.read_bytes() == new


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failure_before_the_rename_leaves_the_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    target = tmp_path / "checkpoint"
    target.write_bytes(b"old\n")

    def fail(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, fail)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(target, b"new\n")
    monkeypatch.undo()
    assert target.read_bytes() == b"old\n"
    assert not (tmp_path / ("checkpoint" + TEMP_SUFFIX)).exists()


@pytest.mark.parametrize(
    ("durability", "events"),
    [
        (Durability.DURABLE, ["fsync file", "replace", "fsync directory"]),
        (Durability.CONTENT, ["fsync file", "replace"]),
        (Durability.NONE, ["replace"]),
    ],
)
def test_each_durability_does_its_fsyncs_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: Durability, events: list[str]
) -> None:
    recorder = _Recorder(monkeypatch)
    write_atomically(tmp_path / "checkpoint", b"1\n", durability)
    assert recorder.events == events


def test_fsync_directory_opens_a_directory_only(tmp_path: Path) -> None:
    """O_DIRECTORY: handed a file, it fails instead of fsyncing the file."""
    fsync_directory(tmp_path)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        fsync_directory(tmp_path / "file")
