"""The commit path's topic-name check (tidelog_coordinator.topic_names):
the same outcome and message as tidelog.names' rule for every name, valid
or not, seen once or again; only valid names remembered, at most max_names."""

from __future__ import annotations

import pytest
from tidelog.errors import InvalidTopicError
from tidelog.names import validate_topic_name
from tidelog_coordinator.topic_names import VALID_TOPIC_NAMES_MAX, TopicNameCache

pytestmark = pytest.mark.timeout(60)

NAMES = [
    "orders",
    "a",
    "a.b_c-D9",
    "...",
    "x" * 249,
    # invalid:
    "",
    ".",
    "..",
    "x" * 250,
    "bad/name",
    "sp ace",
    "é",
    "tab\t",
    "nul\0",
    "orders\n",
]


def _outcome(check: object, name: str) -> tuple[str, str]:
    try:
        return ("ok", check(name))  # type: ignore[operator]
    except InvalidTopicError as exc:
        return (type(exc).__name__, exc.message)


@pytest.mark.parametrize("name", NAMES)
def test_every_name_gets_the_rules_outcome_and_message_each_time(name: str) -> None:
    cache = TopicNameCache()
    expected = _outcome(validate_topic_name, name)
    # First sight, then again (a valid name is remembered by then).
    assert _outcome(cache.validate, name) == expected
    assert _outcome(cache.validate, name) == expected
    assert len(cache) == (1 if expected[0] == "ok" else 0)


def test_a_valid_name_that_prefixes_an_invalid_one_does_not_admit_it() -> None:
    cache = TopicNameCache()
    cache.validate("orders")
    with pytest.raises(InvalidTopicError, match="contains"):
        cache.validate("orders\n")
    with pytest.raises(InvalidTopicError, match="contains"):
        cache.validate("orders/0")


def test_the_memory_holds_at_most_max_names() -> None:
    cache = TopicNameCache(max_names=8)
    for i in range(100):
        assert cache.validate(f"t{i}") == f"t{i}"
        assert 1 <= len(cache) <= 8
        for _ in range(3):
            with pytest.raises(InvalidTopicError):
                cache.validate(f"bad/{i}")
        assert len(cache) <= 8
    # Names forgotten when it was emptied are still accepted, and remembered again.
    assert cache.validate("t0") == "t0"
    assert len(cache) <= 8


def test_the_default_bound_is_named_and_a_bound_below_one_is_refused() -> None:
    assert TopicNameCache().max_names == VALID_TOPIC_NAMES_MAX
    with pytest.raises(ValueError, match="at least 1"):
        TopicNameCache(max_names=0)
