"""`tidelog dev`: hands over to `tidelog_server.dev`, which runs the local cluster.

The local cluster (etcd, a coordinator, brokers, a gateway) is server code, shipped by
the `tidelog-server` distribution with the brokers, the coordinator and the
gateway; the
client distribution installs none of it. So this command imports nothing of
the servers: it replaces itself with `python -m tidelog_server.dev` run by
the same interpreter (the servers must be installed beside this client, since
the cluster runs `python -m tidelog_broker` with it), or says which packages
to install.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from tidelog.cli._common import AddBootstrap, fail

#: What `tidelog dev` needs beside the client, as module -> distribution.
SERVER_PACKAGES = {
    "tidelog_server": "tidelog-server",
    "tidelog_broker": "tidelog-broker",
    "tidelog_coordinator": "tidelog-coordinator",
    "tidelog_gateway": "tidelog-gateway",
}


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    # Only for `tidelog --help`: main() hands `tidelog dev ...` over before parsing,
    # and `tidelog dev --help` shows the server's own options.
    sub.add_parser("dev", help="run a local cluster in the foreground (make run)", add_help=False)


def missing_server_packages() -> list[str]:
    """The distributions `tidelog dev` needs that this environment lacks."""
    return [
        dist for module, dist in SERVER_PACKAGES.items() if importlib.util.find_spec(module) is None
    ]


def run(argv: list[str]) -> int:
    """Replace this process with the local cluster; returns only on error."""
    missing = missing_server_packages()
    if missing:
        return fail(
            f"'tidelog dev' runs the servers, which are not installed: "
            f"pip install {' '.join(missing)} (or 'make install' in a checkout)"
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "tidelog_server.dev", *argv])
