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


@dataclass(frozen=True)
class SecurityOptions:
    allow_anonymous: bool | None = None
    super_users: tuple[str, ...] = ()
    allow_everyone_if_no_acl_found: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SecurityOptions:
        """ValueError naming the bad principal."""
        users = tuple(check_principal(p.strip()) for p in args.super_users.split(";") if p.strip())
        return cls(args.allow_anonymous, users, args.allow_everyone_if_no_acl_found)
