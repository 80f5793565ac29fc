"""`tidelog acls|users|quotas`: authorization, credentials and quotas.

`acls` follows kafka-acls: `add` with --allow-principal/--deny-principal,
--operation (repeatable), and a resource (--topic, --group or --cluster,
with --resource-pattern-type literal|prefixed) makes one binding per
principal x operation x resource; `list` shows the bindings matching the
options given; `remove` deletes them (what the options leave out matches
anything, as kafka-acls --remove does).

`users add NAME` reads the password from --password or, safer, from stdin
(--password-stdin); only a salted hash is stored. `quotas set` takes
Kafka's quota names.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from tidelog.admin import AclBinding, AclBindingFilter, AdminClient
from tidelog.cli._common import AddBootstrap

CLUSTER = "tidelog-cluster"


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    _register_acls(sub, add_bootstrap)
    _register_users(sub, add_bootstrap)
    _register_quotas(sub, add_bootstrap)


def _resource_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", action="append", default=[], help="topic name (repeatable)")
    parser.add_argument("--group", action="append", default=[], help="group id (repeatable)")
    parser.add_argument("--cluster", action="store_true", help="the cluster resource")
    parser.add_argument(
        "--resource-pattern-type",
        default=None,
        choices=("literal", "prefixed", "any", "match"),
        help="how --topic/--group names match (add: literal by default; list/remove: any; "
        "'match': every binding that applies to the name)",
    )
    parser.add_argument(
        "--operation",
        action="append",
        default=[],
        help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
        "AlterConfigs, IdempotentWrite or All (repeatable)",
    )


def _register_acls(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    acls = sub.add_parser("acls", help="add, list and remove ACLs (kafka-acls)")
    actions = acls.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, handler, doc in (
        ("add", _acls_add, "add bindings"),
        ("list", _acls_list, "list the bindings matching the options"),
        ("remove", _acls_remove, "remove the bindings matching the options"),
    ):
        parser = actions.add_parser(name, help=doc)
        _resource_arguments(parser)
        parser.add_argument("--allow-principal", action="append", default=[], metavar="User:NAME")
        parser.add_argument("--deny-principal", action="append", default=[], metavar="User:NAME")
        parser.add_argument("--allow-host", action="append", default=[], metavar="HOST")
        parser.add_argument("--deny-host", action="append", default=[], metavar="HOST")
        if name != "add":
            parser.add_argument(
                "--principal", default="", help="only bindings of this principal (list)"
            )
        add_bootstrap(parser)
        parser.set_defaults(handler=handler)


def _resources(args: argparse.Namespace, for_filter: bool) -> list[tuple[str, str]]:
    resources = [("topic", t) for t in args.topic] + [("group", g) for g in args.group]
    if args.cluster:
        resources.append(("cluster", CLUSTER))
    if not resources and for_filter:
        resources.append(("", ""))
    return resources


def _entries(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(principal, permission, host) of the options."""
    entries = []
    for permission, principals, hosts in (
        ("allow", args.allow_principal, args.allow_host),
        ("deny", args.deny_principal, args.deny_host),
    ):
        for principal in principals:
            for host in hosts or ["*"]:
                entries.append((principal, permission, host))
    return entries


def _acls_add(args: argparse.Namespace) -> int:
    resources = _resources(args, for_filter=False)
    entries = _entries(args)
    if not resources:
        raise ValueError("name a resource: --topic, --group or --cluster")
    if not entries:
        raise ValueError("name a principal: --allow-principal or --deny-principal")
    if not args.operation:
        raise ValueError("name an operation: --operation (for example Read, Write, All)")
    pattern = args.resource_pattern_type or "literal"
    bindings = [
        AclBinding(principal, operation, rtype, name, pattern, permission, host)
        for principal, permission, host in entries
        for operation in args.operation
        for rtype, name in resources
    ]
    with AdminClient(args.bootstrap_server) as admin:
        admin.create_acls(bindings)
    for binding in bindings:
        print(f"added {_line(binding)}")
    return 0


def _filters(args: argparse.Namespace) -> list[AclBindingFilter]:
    pattern = args.resource_pattern_type or ""
    entries: list[tuple[str, str, str]] = _entries(args) or [(args.principal, "", "")]
    return [
        AclBindingFilter(principal, operation, rtype, name, pattern, permission, host)
        for principal, permission, host in entries
        for operation in (args.operation or [""])
        for rtype, name in _resources(args, for_filter=True)
    ]


def _line(binding: AclBinding) -> str:
    return (
        f"{binding.permission:<5} {binding.principal} {binding.operation} from {binding.host} "
        f"on {binding.resource_type}:{binding.pattern_type}:{binding.resource_name}"
    )


def _acls_list(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server) as admin:
        found: dict[AclBinding, None] = {}
        for acl_filter in _filters(args):
            found.update(dict.fromkeys(admin.describe_acls(acl_filter)))
    for binding in sorted(found, key=_line):
        print(_line(binding))
    return 0


def _acls_remove(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server) as admin:
        deleted = admin.delete_acls(_filters(args))
    for binding in deleted:
        print(f"removed {_line(binding)}")
    if not deleted:
        print("no ACL matched", file=sys.stderr)
    return 0


def _register_users(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    users = sub.add_parser("users", help="add, remove and list users (credentials in etcd)")
    actions = users.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add a user or set its password")
    add.add_argument("user")
    source = add.add_mutually_exclusive_group()
    source.add_argument("--password", help="the password (visible in the process list)")
    source.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin"
    )
    add_bootstrap(add)
    add.set_defaults(handler=_users_add)
    remove = actions.add_parser("remove", help="remove a user")
    remove.add_argument("user")
    add_bootstrap(remove)
    remove.set_defaults(handler=_users_remove)
    listing = actions.add_parser("list", help="users and how their password is hashed")
    add_bootstrap(listing)
    listing.set_defaults(handler=_users_list)


def _users_add(args: argparse.Namespace) -> int:
    if args.password is not None:
        password = args.password
    elif args.password_stdin or not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"password for {args.user}: ")
    with AdminClient(args.bootstrap_server) as admin:
        error = admin.alter_user_credentials({args.user: password})[args.user]
    if error is not None:
        raise error
    print(f"user {args.user} set")
    return 0


def _users_remove(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server) as admin:
        error = admin.alter_user_credentials(deletions=[args.user])[args.user]
    if error is not None:
        raise error
    print(f"user {args.user} removed")
    return 0


def _users_list(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server) as admin:
        for user, mechanism in sorted(admin.describe_user_credentials().items()):
            print(f"{user}  {mechanism}")
    return 0


QUOTA_OPTIONS = (
    ("--producer-byte-rate", "producer_byte_rate", "bytes per second produced"),
    ("--consumer-byte-rate", "consumer_byte_rate", "bytes per second fetched"),
    ("--request-rate", "request_rate", "requests per second"),
)


def _register_quotas(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    quotas = sub.add_parser("quotas", help="set and describe client quotas")
    actions = quotas.add_subparsers(dest="action", required=True, metavar="ACTION")
    set_ = actions.add_parser("set", help="replace the quotas of a principal (and client id)")
    set_.add_argument(
        "--principal", required=True, help="User:NAME, or User:<default> for the default"
    )
    set_.add_argument("--client-id", default="", help="only this client id of the principal")
    for flag, _, doc in QUOTA_OPTIONS:
        set_.add_argument(flag, type=float, default=None, help=f"{doc} (0: no quota)")
    add_bootstrap(set_)
    set_.set_defaults(handler=_quotas_set)
    describe = actions.add_parser("describe", help="the quotas set")
    describe.add_argument("--principal", default="")
    add_bootstrap(describe)
    describe.set_defaults(handler=_quotas_describe)


def _quotas_set(args: argparse.Namespace) -> int:
    values = {
        key: getattr(args, key) for _, key, _ in QUOTA_OPTIONS if getattr(args, key) is not None
    }
    with AdminClient(args.bootstrap_server) as admin:
        admin.alter_client_quotas(args.principal, values, args.client_id)
    print(f"quotas of {args.principal} set: {values}")
    return 0


def _quotas_describe(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server) as admin:
        for quota in admin.describe_client_quotas(args.principal):
            client = f" client-id {quota.client_id}" if quota.client_id else ""
            values = ", ".join(f"{k}={v:g}" for k, v in sorted(quota.values.items()))
            print(f"{quota.principal}{client}: {values}")
    return 0
