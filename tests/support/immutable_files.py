"""Files and directories the file system refuses to change: the storage tests'
stand-in for a failing disk.

`chattr +i` sets the immutable flag: the path can be neither removed nor renamed
(nor, for a directory, can anything in it be added, removed or renamed). It
needs root and a file system with the flag (ext4 has it, tmpfs does not):
`pin` skips the test where it cannot be set.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def pin(path: Path) -> None:
    """Make `path` immutable, or skip the calling test where that cannot be."""
    if shutil.which("chattr") is None:
        pytest.skip("needs chattr")
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip(f"the file system of {path} has no immutable flag (or we are not root)")


def unpin(path: Path) -> None:
    """Make `path` changeable again (it must exist)."""
    subprocess.run(["chattr", "-i", str(path)], check=True, capture_output=True)


def unpin_if_pinned(path: Path) -> None:
    """`unpin` for clean-ups: nothing when `path` is gone or chattr missing,
    so that a test's own failure is what it reports."""
    if shutil.which("chattr") is not None and path.exists():
        subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True)


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """`path` immutable (`pin`) while inside; it must not move meanwhile."""
    pin(path)
    try:
        yield
    finally:
        unpin(path)
