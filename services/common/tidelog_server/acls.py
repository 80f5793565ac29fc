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
PrefixWatcher in tidelog_server.security) and answers `authorize`, reading
only the bindings that match the resource (`PatternIndex`): what a decision
and a change cost does not grow with the number of bindings stored.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Iterable, Iterator
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


def names_a_value(field: str) -> bool:
    """Whether an AclFilter field names a value: "" and "any" match every one."""
    return field not in ("", "any")


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
            return not names_a_value(wanted) or wanted.lower() == value.lower()

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


class PatternIndex:
    """The bindings of one resource type, indexed by pattern for `matching`
    (see AclTable; the coordinator's DeleteAcls uses one for "match"
    filters). Buckets map an etcd key to (its order of arrival, binding), so
    that a binding is added or removed in O(1) and the deny a decision names
    is the one a scan in order of arrival would have found first. Not
    thread-safe."""

    __slots__ = ("_length_counts", "literal", "prefix_lengths", "prefixed")

    def __init__(self) -> None:
        #: Literal name (the wildcard "*" included) -> its bindings.
        self.literal: dict[str, dict[bytes, tuple[int, AclBinding]]] = {}
        #: Prefix -> its prefixed bindings.
        self.prefixed: dict[str, dict[bytes, tuple[int, AclBinding]]] = {}
        #: The lengths of the prefixes present, ascending.
        self.prefix_lengths: list[int] = []
        self._length_counts: dict[int, int] = {}

    def add(self, key: bytes, arrival: int, binding: AclBinding) -> None:
        name = binding.resource_name
        if binding.pattern_type == "prefixed":
            bucket = self.prefixed.get(name)
            if bucket is None:
                bucket = self.prefixed[name] = {}
                count = self._length_counts.get(len(name), 0)
                if not count:
                    bisect.insort(self.prefix_lengths, len(name))
                self._length_counts[len(name)] = count + 1
            bucket[key] = (arrival, binding)
        else:
            self.literal.setdefault(name, {})[key] = (arrival, binding)

    def remove(self, key: bytes, binding: AclBinding) -> None:
        name = binding.resource_name
        if binding.pattern_type == "prefixed":
            bucket = self.prefixed[name]
            del bucket[key]
            if not bucket:
                del self.prefixed[name]
                count = self._length_counts.pop(len(name))
                if count > 1:
                    self._length_counts[len(name)] = count - 1
                else:
                    self.prefix_lengths.remove(len(name))
        else:
            bucket = self.literal[name]
            del bucket[key]
            if not bucket:
                del self.literal[name]

    def matching(self, name: str) -> Iterator[tuple[bytes, int, AclBinding]]:
        """(key, arrival, binding) of each binding whose pattern matches
        `name` (AclBinding.matches_resource), each once."""
        for bucket in self._buckets(name):
            for key, (arrival, binding) in bucket.items():
                yield key, arrival, binding

    def count_matching(self, name: str) -> int:
        """How many bindings `matching(name)` yields, without reading them."""
        return sum(len(bucket) for bucket in self._buckets(name))

    def _buckets(self, name: str) -> Iterator[dict[bytes, tuple[int, AclBinding]]]:
        literal = self.literal.get(name)
        if literal:
            yield literal
        if name != WILDCARD:
            wildcard = self.literal.get(WILDCARD)
            if wildcard:
                yield wildcard
        for length in self.prefix_lengths:
            if length > len(name):
                break
            prefixed = self.prefixed.get(name[:length])
            if prefixed:
                yield prefixed


class AclTable:
    """The bindings of a cluster, replaced or changed by the watcher, and the
    decision for one request. Runs on one event loop; not thread-safe.

    A decision reads only the bindings whose pattern matches the resource
    (a client naming many topics must not cost names x bindings): per
    resource type, literal bindings by name, the wildcard "*" as one more
    literal name, and prefixed bindings by prefix with the sorted list of the
    prefix lengths present, so that the prefixes of a name that can match
    are looked up one dict probe each (at most one per distinct length
    present, up to the name's length; slicing copies at most
    MAX_NAME_CHARS characters each). A dict keyed by prefix was chosen over
    a trie: a trie holds one node per character of every prefix, and its
    walk is one Python step per character of the name. A change is one
    bucket insertion or removal (plus a sorted insert or removal among the
    distinct prefix lengths when one appears or disappears), and forgets the
    remembered decisions.
    """

    def __init__(
        self, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = True
    ) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._by_key: dict[bytes, AclBinding] = {}
        self._by_type: dict[str, PatternIndex] = {}
        #: Order of arrival of each key (a deny is named as a scan of
        #: `_by_key` in order would have found it first).
        self._arrivals: dict[bytes, int] = {}
        self._next_arrival = 0
        self._decisions: dict[tuple[str, str, str, str, str], Decision] = {}

    def replace(self, bindings: dict[bytes, AclBinding]) -> None:
        self._by_key = {}
        self._by_type = {}
        self._arrivals = {}
        for key, binding in bindings.items():
            self._add(key, binding)
        self._decisions.clear()

    def put(self, key: bytes, binding: AclBinding | None) -> None:
        old = self._by_key.get(key)
        if old is not None and old == binding:
            return  # the same binding again: no decision changes
        if old is not None:
            self._by_type[old.resource_type].remove(key, old)
            if binding is None:
                del self._by_key[key]
                del self._arrivals[key]
        if binding is not None:
            self._add(key, binding)
        # Any remembered decision may depend on the binding; changes are
        # rare next to decisions, so all are forgotten (each was computed
        # once, so forgetting costs no more than computing them did).
        self._decisions.clear()

    def _add(self, key: bytes, binding: AclBinding) -> None:
        # A key changed in place keeps its place, as in a dict.
        arrival = self._arrivals.get(key)
        if arrival is None:
            arrival = self._arrivals[key] = self._next_arrival
            self._next_arrival += 1
        self._by_key[key] = binding
        index = self._by_type.get(binding.resource_type)
        if index is None:
            index = self._by_type[binding.resource_type] = PatternIndex()
        index.add(key, arrival, binding)

    def bindings(self) -> list[AclBinding]:
        return list(self._by_key.values())

    def allows_everything(self, principal: str) -> bool:
        """True when every decision for `principal` is "allowed", whatever
        the operation and resource: a super user, or no binding at all with
        allow_everyone_if_no_acl_found (the default of a cluster without
        ACLs). Lets a caller skip listing what a request asks for."""
        return principal in self.super_users or (
            not self._by_key and self.allow_everyone_if_no_acl_found
        )

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
        index = self._by_type.get(resource_type)
        matching = index.matching(name) if index is not None else iter(())
        any_matching = False
        allowed = False
        first_deny: tuple[int, AclBinding] | None = None
        for _key, arrival, binding in matching:
            any_matching = True
            if not binding.grants(principal, host, operation):
                continue
            if binding.permission != "deny":
                allowed = True
            elif first_deny is None or arrival < first_deny[0]:
                first_deny = (arrival, binding)
        if not any_matching:
            if self.allow_everyone_if_no_acl_found:
                return Decision(True, "no ACL found for the resource")
            return Decision(False, "no ACL allows it")
        if first_deny is not None:
            return Decision(False, f"denied by the ACL {describe(first_deny[1])}")
        if allowed:
            return Decision(True, "allowed by an ACL")
        return Decision(False, "no ACL allows it")


def describe(binding: AclBinding) -> str:
    return (
        f"({binding.permission} {binding.principal} {binding.operation} from host "
        f"{binding.host} on {binding.resource_type}:{binding.pattern_type}:"
        f"{binding.resource_name})"
    )
