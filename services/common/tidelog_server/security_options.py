"""The security options every service takes on its command line.

Kept apart from tidelog_server.security (which follows etcd) so that a
service's config module can hold them without importing grpc or etcd.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from tidelog_server.acls import check_principal


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Authentication and authorization (docs/security.md)")
    group.add_argument(
        "--allow-anonymous",
        type=_bool,
        default=None,
        metavar="true|false",
        help="serve clients with no certificate and no credentials as User:ANONYMOUS "
        "(default: true without TLS, false with TLS)",
    )
    group.add_argument(
        "--super-users",
        default="",
        metavar="User:a;User:b",
        help="principals that pass every ACL check; the CN of this service's own "
        "certificate is always one (the cluster's own calls)",
    )
    group.add_argument(
        "--allow-everyone-if-no-acl-found",
        type=_bool,
        default=True,
        metavar="true|false",
        help="allow a request on a resource that no ACL names (Kafka's "
        "allow.everyone.if.no.acl.found; default %(default)s, so clusters without ACLs "
        "keep working: set false in production)",
    )
    group.add_argument(
        "--max-streams-per-principal",
        type=int,
        default=DEFAULT_MAX_STREAMS_PER_PRINCIPAL,
        metavar="N",
        help="streaming calls (Produce, Fetch, Consume, Heartbeat, CommitOffsetsStream) one "
        "principal may have open on this service; super users are not counted "
        "(default %(default)s)",
    )


#: Streams one principal may hold open on one service. Per-connection limits
#: alone let one identity open many connections; this bounds what one
#: (non-super) identity costs a service whatever it does.
DEFAULT_MAX_STREAMS_PER_PRINCIPAL = 4096


@dataclass(frozen=True)
class SecurityOptions:
    allow_anonymous: bool | None = None
    super_users: tuple[str, ...] = ()
    allow_everyone_if_no_acl_found: bool = True
    max_streams_per_principal: int = DEFAULT_MAX_STREAMS_PER_PRINCIPAL

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SecurityOptions:
        """ValueError naming the bad principal."""
        users = tuple(check_principal(p.strip()) for p in args.super_users.split(";") if p.strip())
        limit = args.max_streams_per_principal
        if limit < 1:
            raise ValueError(f"--max-streams-per-principal must be at least 1, got {limit}")
        return cls(
            args.allow_anonymous,
            users,
            args.allow_everyone_if_no_acl_found,
            limit,
        )
