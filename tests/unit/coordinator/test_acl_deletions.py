"""Which bindings a DeleteAcls's filters delete (tidelog_coordinator.
acl_deletions): those a match of every filter against every binding would
delete, and a matching work that is bounded per request."""

from __future__ import annotations

import random

import pytest
from tidelog_coordinator.acl_deletions import MATCH_SCANS_PER_REQUEST, Stored, claim
from tidelog_server.acls import CLUSTER_NAME, AclBinding, AclFilter

from tests.support.acl_samples import random_binding

SEEDS = range(12)
NAMES = ["a", "ab", "abc", "AB", "b", "*", "any"]
PRINCIPALS = ["User:alice", "User:Alice", "User:bob", "User:*"]
HOSTS = ["10.0.0.1", "*"]
BINDINGS_MAX = 60
FILTERS_MAX = 25


def _scanned(bindings: list[Stored], filters: list[AclFilter]) -> dict[bytes, int]:
    """Each binding claimed by the first filter matching it (the oracle)."""
    claimed: dict[bytes, int] = {}
    for index, wanted in enumerate(filters):
        for key, binding in bindings:
            if key not in claimed and wanted.matches(binding):
                claimed[key] = index
    return claimed


def _random_binding(rng: random.Random) -> AclBinding:
    return random_binding(rng, names=NAMES, principals=PRINCIPALS, hosts=HOSTS)


def _random_filter(rng: random.Random) -> AclFilter:
    def one(*values: str) -> str:
        return rng.choice(["", "any", *values])

    return AclFilter(
        resource_type=one("topic", "Topic", "group", "cluster"),
        resource_name=one(*NAMES, "abcd", "A", "", CLUSTER_NAME),
        pattern_type=one("literal", "prefixed", "match", "MATCH", "Literal"),
        principal=one(*PRINCIPALS, "user:bob"),
        host=one(*HOSTS),
        operation=one("Read", "write", "All"),
        permission=one("allow", "deny"),
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_the_bindings_claimed_are_those_of_a_scan_of_every_binding(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(20):
        bindings = [
            (f"k{i}".encode(), _random_binding(rng)) for i in range(rng.randrange(BINDINGS_MAX))
        ]
        # Fewer filters than MATCH_SCANS_PER_REQUEST: none is refused.
        filters = [_random_filter(rng) for _ in range(rng.randrange(MATCH_SCANS_PER_REQUEST))]
        filters += rng.sample(filters, len(filters) // 3)  # some given twice
        claims = claim(bindings, filters)
        assert claims.refused == {}
        assert claims.claimed == _scanned(bindings, filters)


#: Bindings stored, and filters in one request (DeleteAcls takes 1,000 at most).
STORED = 10_000
FILTERS = 1_000


class _Matches:
    count = 0


class _CountedFilter(AclFilter):
    """A filter that counts the bindings it is matched against."""

    def matches(self, binding: AclBinding) -> bool:
        _Matches.count += 1
        return super().matches(binding)


@pytest.fixture(scope="module")
def stored() -> list[Stored]:
    return [
        (
            f"k{i}".encode(),
            AclBinding.checked("topic", f"t-{i}", "literal", f"User:u-{i}", "*", "Read", "allow"),
        )
        for i in range(STORED)
    ]


def test_filters_naming_a_resource_or_a_principal_are_matched_against_its_bindings_only(
    stored: list[Stored],
) -> None:
    filters = [_CountedFilter(resource_name=f"T-{i}") for i in range(FILTERS // 2)]
    filters += [
        _CountedFilter(resource_type="topic", resource_name=f"t-{i}", pattern_type="match")
        for i in range(FILTERS // 2, FILTERS // 2 + FILTERS // 4)
    ]
    filters += [_CountedFilter(principal=f"User:u-{i}") for i in range(FILTERS * 3 // 4, FILTERS)]
    _Matches.count = 0
    claims = claim(stored, filters)
    # One binding each, where matching every filter against every binding
    # (the code before) counted FILTERS x STORED.
    assert _Matches.count == FILTERS
    assert claims.refused == {}
    assert sorted(claims.claimed.values()) == list(range(FILTERS))


def test_filters_matched_against_every_binding_are_bounded_per_request(
    stored: list[Stored],
) -> None:
    # Neither a resource nor a principal: each would match every binding.
    filters = [_CountedFilter(host=f"10.0.0.{i % 250}", operation="Read") for i in range(FILTERS)]
    _Matches.count = 0
    claims = claim(stored, filters)
    assert _Matches.count <= MATCH_SCANS_PER_REQUEST * STORED
    # The distinct filters past the bound are refused, naming it; a filter
    # given again gets the same answer as the first time.
    distinct = 250
    assert len(claims.refused) == (distinct - MATCH_SCANS_PER_REQUEST) * FILTERS // distinct
    assert set(claims.refused) == {i for i in range(FILTERS) if i % 250 >= MATCH_SCANS_PER_REQUEST}
    message = str(next(iter(claims.refused.values())))
    assert "MATCH_SCANS_PER_REQUEST" in message and "another request" in message
    # A single filter always fits, however many bindings are stored.
    assert claim(stored, [AclFilter()]).claimed.keys() == {key for key, _ in stored}
