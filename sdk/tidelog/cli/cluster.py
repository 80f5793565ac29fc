"""`tidelog cluster describe`: the cluster id, the active controller (a
coordinator replica), the live brokers with their racks, and the
coordinator replicas."""

from __future__ import annotations

import argparse

from tidelog.admin import AdminClient
from tidelog.cli._common import AddBootstrap


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    cluster = sub.add_parser("cluster", help="describe the cluster")
    actions = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    describe = actions.add_parser(
        "describe", help="cluster id, controller, brokers (with racks), coordinators"
    )
    describe.set_defaults(handler=_describe)
    add_bootstrap(describe)


def _describe(args: argparse.Namespace) -> int:
    with AdminClient(bootstrap_servers=args.bootstrap_server) as admin:
        cluster = admin.describe_cluster()
    print(f"cluster id  {cluster.cluster_id or '(none: a standalone broker)'}")
    print(f"controller  {cluster.controller_id or '(none)'}")
    print(f"brokers     {len(cluster.brokers)}")
    rows = [["ID", "ADDRESS", "RACK"]] + [
        [str(b.id), f"{b.host}:{b.port}", b.rack or "-"] for b in cluster.brokers
    ]
    _table(rows)
    print(f"coordinators  {len(cluster.coordinators)}")
    rows = [["ID", "ADDRESS", "CONTROLLER"]] + [
        [cid, address, "*" if cid == cluster.controller_id else ""]
        for cid, address in cluster.coordinators
    ]
    _table(rows)
    return 0


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
