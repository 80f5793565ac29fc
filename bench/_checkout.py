"""Another git ref's SDK and services, runnable beside this work tree's: the "before" side of
the bench's A/B tools (bench.e2e_ab, bench.columnar_ab, bench.gateway_records_ab).

`export(ref, into)` unpacks `ref`'s ``sdk/`` and ``services/`` with ``git archive`` and builds
the SDK's optional C extensions (tidelog._crecords, tidelog._cproduce) in place there, then
returns the PYTHONPATH that runs that code. Why build: the work tree's SDK is an editable
install whose compiled modules are found by the install's own import hook, so an export
without its own would run `ref`'s Python over *this work tree's* C code: a change to a C
source would then be measured against itself. With the export's own modules built, Python's
path finder takes them first (they sit in the exported package's directory).

A build that fails is an error here (`CheckoutError`), not a silent fallback to the pure-Python
paths, which run at about half the speed and would make any A/B meaningless.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Import roots of the exported parts, in PYTHONPATH order.
PACKAGE_DIRS = (
    "sdk",
    "services/common",
    "services/broker",
    "services/coordinator",
    "services/gateway",
)

#: The SDK's compiled modules, as the work tree has them (sdk/setup.py).
C_EXTENSIONS = ("_crecords", "_cproduce")


class CheckoutError(RuntimeError):
    """A ref could not be exported or its C extensions not built."""


def export(ref: str, into: Path) -> str:
    """`ref`'s SDK and services unpacked under `into`, its C extensions built; the PYTHONPATH
    that runs them (see the module doc)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "sdk", "services"], capture_output=True
    )
    if archive.returncode != 0:
        raise CheckoutError(f"git archive {ref}: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    _build_extensions(into / "sdk", ref)
    return os.pathsep.join(str(into / d) for d in PACKAGE_DIRS)


def compiled_modules() -> dict[str, str]:
    """The files of C_EXTENSIONS this interpreter imports (none without a C compiler), by
    module name: which side's compiled code a run uses."""
    import importlib

    found = {}
    for name in C_EXTENSIONS:
        try:
            module = importlib.import_module(f"tidelog.{name}")
        except ImportError:
            continue  # not built: that side runs the pure-Python twin
        found[name] = str(module.__file__)
    return found


def environment(pythonpath: str | None) -> dict[str, str]:
    """This process's environment with PYTHONPATH `pythonpath` (none for None): a child's
    environment that runs that side's code (None: this work tree's)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


@contextlib.contextmanager
def children_run(pythonpath: str | None) -> Iterator[None]:
    """While open, os.environ is `environment(pythonpath)`: a process started meanwhile
    that inherits this process's environment (tests/support starts the services so) runs
    that side's code."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environment(pythonpath))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _build_extensions(sdk: Path, ref: str) -> None:
    # An older ref may not have every module this tree has: build what its sources define.
    wanted = [n for n in compiled_modules() if (sdk / "tidelog" / f"{n}.c").exists()]
    if not wanted:
        return  # the work tree runs pure Python too: both sides alike
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=str(sdk),
        capture_output=True,
        text=True,
    )
    built = {p.name.split(".", 1)[0] for p in (sdk / "tidelog").glob("_c*.so")}
    missing = [name for name in wanted if name not in built]
    if build.returncode != 0 or missing:
        raise CheckoutError(
            f"building {ref}'s SDK C extensions failed (missing {missing or 'none'}): "
            f"{(build.stderr or build.stdout).strip()[-2000:]}"
        )
