"""ACL semantics (tidelog_server.acls): Kafka's, decided in one place."""

from __future__ import annotations

import pytest
from tidelog_server.acls import CLUSTER_NAME, AclBinding, AclFilter, AclTable


def _binding(
    principal: str = "User:alice",
    operation: str = "Read",
    name: str = "orders",
    *,
    permission: str = "allow",
    pattern: str = "literal",
    resource_type: str = "topic",
    host: str = "*",
) -> AclBinding:
    return AclBinding.checked(resource_type, name, pattern, principal, host, operation, permission)


def _table(
    *bindings: AclBinding, allow_if_none: bool = False, supers: tuple[str, ...] = ()
) -> AclTable:
    table = AclTable(supers, allow_if_none)
    table.replace({b.binding_id.encode(): b for b in bindings})
    return table


def test_allow_and_absence() -> None:
    table = _table(_binding())
    assert table.authorize("User:alice", "10.0.0.1", "Read", "topic", "orders").allowed
    # Another operation, another principal, another topic: no ACL allows it.
    assert not table.authorize("User:alice", "10.0.0.1", "Write", "topic", "orders").allowed
    assert not table.authorize("User:bob", "10.0.0.1", "Read", "topic", "orders").allowed
    assert not table.authorize("User:alice", "10.0.0.1", "Read", "topic", "other").allowed


def test_allow_everyone_if_no_acl_found_applies_only_to_resources_without_acls() -> None:
    table = _table(_binding(), allow_if_none=True)
    assert table.authorize("User:bob", "h", "Write", "topic", "other").allowed
    assert not table.authorize("User:bob", "h", "Read", "topic", "orders").allowed


def test_deny_wins_over_allow_and_over_a_wildcard_allow() -> None:
    table = _table(
        _binding("User:*", "All", "*"),
        _binding(name="ord", pattern="prefixed"),
        _binding(name="orders", permission="deny"),
    )
    decision = table.authorize("User:alice", "h", "Read", "topic", "orders")
    assert not decision.allowed and "denied by the ACL" in decision.reason
    assert table.authorize("User:alice", "h", "Read", "topic", "ordinal").allowed
    assert table.authorize("User:bob", "h", "Read", "topic", "orders").allowed


def test_prefixed_patterns_match_names_that_start_with_them() -> None:
    table = _table(_binding(name="pub-", pattern="prefixed"))
    assert table.authorize("User:alice", "h", "Read", "topic", "pub-x").allowed
    assert not table.authorize("User:alice", "h", "Read", "topic", "pu").allowed
    assert not table.authorize("User:alice", "h", "Read", "group", "pub-x").allowed


def test_implied_operations() -> None:
    table = _table(_binding(operation="Write"), _binding(operation="AlterConfigs"))
    assert table.authorize("User:alice", "h", "Describe", "topic", "orders").allowed
    assert table.authorize("User:alice", "h", "DescribeConfigs", "topic", "orders").allowed
    # A deny of Describe does not deny Write; a deny of Write denies Write.
    table = _table(_binding(operation="Write"), _binding(operation="Describe", permission="deny"))
    assert table.authorize("User:alice", "h", "Write", "topic", "orders").allowed


def test_hosts_and_super_users() -> None:
    table = _table(_binding(host="10.0.0.1"), supers=("User:admin",))
    assert table.authorize("User:alice", "10.0.0.1", "Read", "topic", "orders").allowed
    assert not table.authorize("User:alice", "10.0.0.2", "Read", "topic", "orders").allowed
    assert table.authorize("User:admin", "x", "Delete", "cluster", CLUSTER_NAME).allowed


def test_changes_replace_what_was_known() -> None:
    deny = _binding(permission="deny")
    table = _table(_binding())
    table.put(deny.binding_id.encode(), deny)
    assert not table.authorize("User:alice", "h", "Read", "topic", "orders").allowed
    table.put(deny.binding_id.encode(), None)
    assert table.authorize("User:alice", "h", "Read", "topic", "orders").allowed


def test_bad_bindings_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="operation must be one of"):
        _binding(operation="Eat")
    with pytest.raises(ValueError, match="User:<name>"):
        _binding(principal="alice")
    with pytest.raises(ValueError, match="pattern type"):
        _binding(pattern="regex")
    with pytest.raises(ValueError, match="cluster resource"):
        _binding(resource_type="cluster", name="other")
    # Spelling is canonical, so equal bindings share one key.
    assert _binding(operation="read").binding_id == _binding(operation="Read").binding_id


def test_filters() -> None:
    prefixed = _binding(name="pub-", pattern="prefixed")
    literal = _binding(name="pub-x")
    assert AclFilter(pattern_type="match", resource_name="pub-x").matches(prefixed)
    assert AclFilter(pattern_type="match", resource_name="pub-x").matches(literal)
    assert not AclFilter(pattern_type="literal", resource_name="pub-x").matches(prefixed)
    assert AclFilter(principal="user:alice").matches(literal)
    assert not AclFilter(permission="deny").matches(literal)
