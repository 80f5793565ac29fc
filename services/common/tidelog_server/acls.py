"""ACL bindings: what they are, how they are stored, and whether they allow a call.

Kafka's model (kafka-acls, AclAuthorizer), kept to its semantics:

- a binding is (principal, host, operation, allow|deny) on a resource
  pattern (topic|group|cluster, literal|prefixed, name); a literal "*" name
  and the principal "User:*" and host "*" match everything;
- a request for (principal, host, operation, resource) is **denied** when a
  matching deny binding exists (deny wins), **allowed** when a matching allow
  binding exists, and otherwise denied, unless no binding at all exists for
  the resource and `allow_everyone_if_no_acl_found` is set;
- Read, Write, Delete and Alter imply Describe; AlterConfigs implies
  DescribeConfigs; All matches every operation;
- super users pass every check.

Each binding is one etcd key under `<prefix>/security/acls/`, named by a
digest of its fields, so adding the same binding twice is one key.
`AclTable` holds the bindings a service knows (kept current by a
PrefixWatcher in tidelog_server.security) and answers `authorize`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

RESOURCE_TYPES = ("topic", "group", "cluster")
PATTERN_TYPES = ("literal", "prefixed")
OPERATIONS = (
    "Read",
    "Write",
    "Create",
    "Delete",
    "Alter",
    "Describe",
    "ClusterAction",
    "DescribeConfigs",
    "AlterConfigs",
    "IdempotentWrite",
    "All",
)
PERMISSIONS = ("allow", "deny")
#: The one cluster resource's name (Kafka's "kafka-cluster").
CLUSTER_NAME = "tidelog-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
#: Limits on what one Admin request may carry.
MAX_BINDINGS_PER_REQUEST = 1_000
MAX_NAME_CHARS = 1_000
#: Decisions remembered between ACL changes (a hot topic is checked per request).
MAX_REMEMBERED_DECISIONS = 10_000

#: Operations that a grant of the key implies (Kafka's implied operations).
_IMPLIES = {
    "Describe": ("Read", "Write", "Delete", "Alter"),
    "DescribeConfigs": ("AlterConfigs",),
}


def _canonical(value: str, allowed: tuple[str, ...], what: str) -> str:
    for candidate in allowed:
        if candidate.lower() == value.lower():
            return candidate
    raise ValueError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


def check_principal(principal: str) -> str:
    kind, sep, name = principal.partition(":")
    if kind != "User" or not sep or not name:
        raise ValueError(f"a principal is written User:<name>, got {principal!r}")
    if len(principal) > MAX_NAME_CHARS:
        raise ValueError(f"a principal has at most {MAX_NAME_CHARS} characters")
    return principal


@dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission: str

    @classmethod
    def checked(
        cls,
        resource_type: str,
        resource_name: str,
        pattern_type: str,
        principal: str,
        host: str,
        operation: str,
        permission: str,
    ) -> AclBinding:
        """A binding with canonical spellings; ValueError naming a bad field."""
        resource_type = _canonical(resource_type, RESOURCE_TYPES, "resource type")
        pattern_type = _canonical(pattern_type or "literal", PATTERN_TYPES, "pattern type")
        if resource_type == "cluster":
            resource_name = resource_name or CLUSTER_NAME
            if resource_name != CLUSTER_NAME or pattern_type != "literal":
                raise ValueError(f"the cluster resource is the literal {CLUSTER_NAME!r}")
        if not resource_name:
            raise ValueError(f"a {resource_type} ACL needs a resource name")
        if len(resource_name) > MAX_NAME_CHARS or len(host) > MAX_NAME_CHARS:
            raise ValueError(f"names have at most {MAX_NAME_CHARS} characters")
        if pattern_type == "prefixed" and resource_name == WILDCARD:
            raise ValueError("a prefixed pattern cannot be '*' (use a literal '*')")
        return cls(
            resource_type,
            resource_name,
            pattern_type,
            check_principal(principal),
            host or WILDCARD,
            _canonical(operation, OPERATIONS, "operation"),
            _canonical(permission, PERMISSIONS, "permission"),
        )

    @property
    def binding_id(self) -> str:
        """The etcd key's last part: equal bindings share one key."""
        fields = "\0".join(asdict(self).values())
        return hashlib.sha256(fields.encode()).hexdigest()[:32]

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> AclBinding:
        return cls(**json.loads(data))

    def matches_resource(self, resource_type: str, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == "prefixed":
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)

    def grants(self, principal: str, host: str, operation: str) -> bool:
        """Whether this binding speaks of this principal, host and operation."""
        if self.principal not in (principal, WILDCARD_PRINCIPAL):
            return False
        if self.host not in (host, WILDCARD):
            return False
        if self.operation in ("All", operation):
            return True
        # An allow of Read (say) implies Describe; a deny of Describe does not
        # deny Read, so implication works for allow bindings only (Kafka).
        return self.permission == "allow" and self.operation in _IMPLIES.get(operation, ())


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Matches bindings; an empty field (or "any") matches every value.
    pattern_type "match" selects the bindings that apply to resource_name."""

    resource_type: str = ""
    resource_name: str = ""
    pattern_type: str = ""
    principal: str = ""
    host: str = ""
    operation: str = ""
    permission: str = ""

    def matches(self, binding: AclBinding) -> bool:
        def eq(wanted: str, value: str) -> bool:
            return wanted in ("", "any") or wanted.lower() == value.lower()

        if not (
            eq(self.resource_type, binding.resource_type)
            and eq(self.principal, binding.principal)
            and eq(self.host, binding.host)
            and eq(self.operation, binding.operation)
            and eq(self.permission, binding.permission)
        ):
            return False
        if self.pattern_type.lower() == "match":
            return binding.matches_resource(binding.resource_type, self.resource_name)
        return eq(self.pattern_type, binding.pattern_type) and eq(
            self.resource_name, binding.resource_name
        )


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    #: Why, for the error message and the log ("denied by ...", "no ACL ...").
    reason: str


class AclTable:
    """The bindings of a cluster, replaced or changed by the watcher, and the
    decision for one request. Runs on one event loop; not thread-safe."""

    def __init__(
        self, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = True
    ) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._by_key: dict[bytes, AclBinding] = {}
        self._by_type: dict[str, list[AclBinding]] = {t: [] for t in RESOURCE_TYPES}
        self._decisions: dict[tuple[str, str, str, str, str], Decision] = {}

    def replace(self, bindings: dict[bytes, AclBinding]) -> None:
        self._by_key = dict(bindings)
        self._reindex()

    def put(self, key: bytes, binding: AclBinding | None) -> None:
        if binding is None:
            self._by_key.pop(key, None)
        else:
            self._by_key[key] = binding
        self._reindex()

    def _reindex(self) -> None:
        # ACL changes are rare and reads are per call: index once per change,
        # and remember decisions until the next change.
        by_type: dict[str, list[AclBinding]] = {t: [] for t in RESOURCE_TYPES}
        for binding in self._by_key.values():
            by_type[binding.resource_type].append(binding)
        self._by_type = by_type
        self._decisions.clear()

    def bindings(self) -> list[AclBinding]:
        return list(self._by_key.values())

    def authorize(
        self, principal: str, host: str, operation: str, resource_type: str, name: str
    ) -> Decision:
        if principal in self.super_users:
            return Decision(True, "super user")
        key = (principal, host, operation, resource_type, name)
        decision = self._decisions.get(key)
        if decision is None:
            if len(self._decisions) >= MAX_REMEMBERED_DECISIONS:
                self._decisions.clear()
            decision = self._decisions[key] = self._decide(*key)
        return decision

    def _decide(
        self, principal: str, host: str, operation: str, resource_type: str, name: str
    ) -> Decision:
        matching = [
            b for b in self._by_type[resource_type] if b.matches_resource(resource_type, name)
        ]
        if not matching:
            if self.allow_everyone_if_no_acl_found:
                return Decision(True, "no ACL found for the resource")
            return Decision(False, "no ACL allows it")
        relevant = [b for b in matching if b.grants(principal, host, operation)]
        for binding in relevant:
            if binding.permission == "deny":
                return Decision(False, f"denied by the ACL {describe(binding)}")
        if relevant:
            return Decision(True, "allowed by an ACL")
        return Decision(False, "no ACL allows it")


def describe(binding: AclBinding) -> str:
    return (
        f"({binding.permission} {binding.principal} {binding.operation} from host "
        f"{binding.host} on {binding.resource_type}:{binding.pattern_type}:"
        f"{binding.resource_name})"
    )
