"""`make install` on a machine that lacks something: one message naming it.

tools/check-prereqs.sh runs first in `make install`. The machines here have
what it checks, so a missing piece is made the way it is missing elsewhere: an
interpreter name that is not on PATH, and a Python whose `ensurepip` cannot be
imported (Debian's python3 without the python3-venv package).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "tools/check-prereqs.sh"


def _check(python: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHECK), python], capture_output=True, text=True, timeout=60, env=env)


def test_this_machine_passes() -> None:
    result = _check(sys.executable)
    assert result.returncode == 0, result.stderr


def test_a_missing_python_is_named() -> None:
    result = _check("python3-not-installed-here")
    assert result.returncode == 1
    assert "'python3-not-installed-here' not found" in result.stderr
    assert "Python 3.11+" in result.stderr


def test_a_python_without_venv_support_names_python3_venv(tmp_path: Path) -> None:
    # A module that fails to import shadows the real ensurepip, as on Debian
    # where ensurepip ships in python3-venv.
    (tmp_path / "ensurepip").mkdir()
    (tmp_path / "ensurepip" / "__init__.py").write_text("raise ImportError('not here')\n")
    result = _check(sys.executable, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 1
    assert "install python3-venv" in result.stderr, result.stderr
