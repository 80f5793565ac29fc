"""AclTable's index (tidelog_server.acls): the same decisions as a scan of
every binding, on random binding sets changed one binding at a time, and a
decision or a change that reads only the bindings it concerns."""

from __future__ import annotations

import random
from typing import Any

import pytest
from tidelog_server.acls import (
    CLUSTER_NAME,
    OPERATIONS,
    AclBinding,
    AclTable,
    Decision,
    describe,
)

from tests.support.acl_samples import random_binding

SEEDS = range(12)
#: Small alphabets, so that random bindings and requests meet often.
NAMES = ["a", "ab", "abc", "b", "ba", "*", "", "x"]
PRINCIPALS = ["User:alice", "User:bob", "User:*"]
HOSTS = ["10.0.0.1", "10.0.0.2", "*"]
REQUEST_PRINCIPALS = ["User:alice", "User:bob", "User:carol"]
REQUEST_HOSTS = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
CHANGES = 150
DECISIONS_PER_CHANGE = 10


def _scanned(
    bindings: dict[bytes, AclBinding],
    allow_if_none: bool,
    principal: str,
    host: str,
    operation: str,
    resource_type: str,
    name: str,
) -> Decision:
    """The decision by a scan of every binding, in order of arrival (the
    oracle: Kafka's rules as the module docstring states them)."""
    matching = [b for b in bindings.values() if b.matches_resource(resource_type, name)]
    if not matching:
        if allow_if_none:
            return Decision(True, "no ACL found for the resource")
        return Decision(False, "no ACL allows it")
    relevant = [b for b in matching if b.grants(principal, host, operation)]
    for binding in relevant:
        if binding.permission == "deny":
            return Decision(False, f"denied by the ACL {describe(binding)}")
    if relevant:
        return Decision(True, "allowed by an ACL")
    return Decision(False, "no ACL allows it")


def _random_binding(rng: random.Random) -> AclBinding:
    return random_binding(
        rng,
        names=[n for n in NAMES if n],
        principals=PRINCIPALS,
        hosts=HOSTS,
        permissions=("allow", "allow", "deny"),
    )


def _random_request(rng: random.Random) -> tuple[str, str, str, str, str]:
    resource_type = rng.choice(["topic", "group", "cluster"])
    name = CLUSTER_NAME if resource_type == "cluster" else rng.choice([*NAMES, "abcd", "bab"])
    return (
        rng.choice(REQUEST_PRINCIPALS),
        rng.choice(REQUEST_HOSTS),
        rng.choice(OPERATIONS),
        resource_type,
        name,
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_decisions_are_those_of_a_scan_of_every_binding(seed: int) -> None:
    rng = random.Random(seed)
    allow_if_none = seed % 2 == 0
    table = AclTable(allow_everyone_if_no_acl_found=allow_if_none)
    # Keys are not always the binding's digest: a key changed in place keeps
    # its place among the others (the deny a decision names is the first).
    known: dict[bytes, AclBinding] = {}
    for i in range(rng.randrange(0, 30)):
        known[f"k{i}".encode()] = _random_binding(rng)
    table.replace(known)
    for _ in range(CHANGES):
        for _ in range(DECISIONS_PER_CHANGE):
            request = _random_request(rng)
            assert table.authorize(*request) == _scanned(known, allow_if_none, *request), request
        key = f"k{rng.randrange(40)}".encode()
        if rng.random() < 0.35:
            known.pop(key, None)
            table.put(key, None)
        else:
            known[key] = _random_binding(rng)
            table.put(key, known[key])
        assert table.bindings() == list(known.values())


#: Bindings in the table whose reads are counted: many topics, literal and
#: prefixed, and groups.
LITERAL_TOPICS = 1_000
PREFIXED_TOPICS = 500
GROUPS = 500
FRESH_NAMES = 200


class _Reads:
    """Which bindings had a field read (by id)."""

    touched: set[int] = set()


class _CountedBinding(AclBinding):
    """A binding that records every read of its fields."""

    def __getattribute__(self, name: str) -> Any:
        _Reads.touched.add(id(self))
        return super().__getattribute__(name)


def _counted(resource_type: str, name: str, pattern: str, principal: str) -> AclBinding:
    return _CountedBinding.checked(resource_type, name, pattern, principal, "*", "Read", "allow")


@pytest.fixture
def many() -> AclTable:
    bindings: list[AclBinding] = []
    bindings += [
        _counted("topic", f"t-{i}", "literal", "User:alice") for i in range(LITERAL_TOPICS)
    ]
    bindings += [
        _counted("topic", f"p-{i}-", "prefixed", "User:alice") for i in range(PREFIXED_TOPICS)
    ]
    bindings += [_counted("group", f"g-{i}", "literal", "User:alice") for i in range(GROUPS)]
    table = AclTable(allow_everyone_if_no_acl_found=False)
    table.replace({f"k{i}".encode(): b for i, b in enumerate(bindings)})
    return table


def test_a_decision_reads_only_the_bindings_that_match_the_resource(many: AclTable) -> None:
    for i in range(FRESH_NAMES):
        # Each name is new to the table (no remembered decision).
        for name, allowed in ((f"t-{i}", True), (f"p-{i}-x{i}", True), (f"fresh-{i}", False)):
            _Reads.touched.clear()
            decision = many.authorize("User:alice", "h", "Read", "topic", name)
            assert decision.allowed is allowed, (name, decision)
            # One binding matches each name (none the fresh ones).
            assert len(_Reads.touched) <= 1, (name, len(_Reads.touched))


def test_a_change_reads_only_the_binding_changed(many: AclTable) -> None:
    added = _counted("topic", "new", "prefixed", "User:bob")
    _Reads.touched.clear()
    many.put(b"new-key", added)
    many.put(b"k0", None)
    # The binding added, and the one removed.
    assert len(_Reads.touched) <= 2, len(_Reads.touched)
    assert many.authorize("User:bob", "h", "Read", "topic", "new-x").allowed
    assert not many.authorize("User:alice", "h", "Read", "topic", "t-0").allowed
    _Reads.touched.clear()
    many.put(b"new-key", None)
    assert len(_Reads.touched) <= 1, len(_Reads.touched)
    # The decision remembered before the removal is forgotten.
    assert not many.authorize("User:bob", "h", "Read", "topic", "new-x").allowed
