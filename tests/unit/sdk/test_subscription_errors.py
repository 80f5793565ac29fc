"""Partition errors in the consumer's SubscriptionState, fed the fetcher's
inbox items as the fetcher queues them: an error taken while position() of
another partition waited for its reset (absorb) is raised by the next poll,
once; a read of named partitions leaves the others' errors for poll(); a
seek drops the error of the position it abandons.

absorb() raised the first error it took, whichever partition it concerned,
so position(B) raised A's error and poll() never raised it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
from tidelog._arrow_poll import collect_arrow
from tidelog._fetcher import ERROR, RESET
from tidelog._subscription import SubscriptionState
from tidelog.config import ConsumerConfig
from tidelog.errors import NoOffsetForPartitionError, TopicAuthorizationFailedError
from tidelog.types import TopicPartition

pytestmark = pytest.mark.timeout(30)

FAILING = TopicPartition("t", 0)
READING = TopicPartition("t", 1)

Poll = Callable[[SubscriptionState], dict[TopicPartition, Any]]
POLLS: dict[str, Poll] = {
    "poll": lambda subs: subs.collect(100),
    "poll_arrow": lambda subs: collect_arrow(subs, include_headers=False),
}


def subscription() -> tuple[SubscriptionState, deque[tuple]]:
    """A SubscriptionState assigned FAILING and READING (both waiting for a
    reset, epoch 0) and its inbox."""
    inbox: deque[tuple] = deque()
    subs = SubscriptionState(
        ConsumerConfig(bootstrap_servers="127.0.0.1:1"), inbox, lambda name, args: None
    )
    subs.assign([FAILING, READING])
    return subs, inbox


def no_offset() -> NoOffsetForPartitionError:
    return NoOffsetForPartitionError("no position and auto_offset_reset='none'")


@pytest.mark.parametrize("poll", POLLS.values(), ids=POLLS.keys())
def test_an_error_taken_by_another_partitions_position_is_raised_by_poll_once(
    poll: Poll,
) -> None:
    subs, inbox = subscription()
    inbox.extend([(ERROR, FAILING, 0, no_offset()), (RESET, READING, 0, 7)])
    subs.absorb()  # what position(READING) does while READING is being reset
    assert subs.position(READING) == 7
    # The position that is unknown says why; the error still waits for poll().
    with pytest.raises(NoOffsetForPartitionError):
        subs.position_now(FAILING)
    with pytest.raises(NoOffsetForPartitionError) as raised:
        poll(subs)
    assert (raised.value.topic, raised.value.partition) == tuple(FAILING)
    assert poll(subs) == {}


def test_errors_are_raised_by_poll_in_the_order_they_came() -> None:
    subs, inbox = subscription()
    denied = TopicAuthorizationFailedError("not allowed to read")
    inbox.extend([(ERROR, READING, 0, denied), (ERROR, FAILING, 0, no_offset())])
    subs.absorb()
    with pytest.raises(TopicAuthorizationFailedError):
        subs.collect(100)
    with pytest.raises(NoOffsetForPartitionError):
        subs.collect(100)
    assert subs.collect(100) == {}


def test_a_read_of_named_partitions_raises_their_errors_only() -> None:
    subs, inbox = subscription()
    inbox.extend([(ERROR, FAILING, 0, no_offset()), (RESET, READING, 0, 7)])
    assert subs.collect(100, frozenset([READING])) == {}
    with pytest.raises(NoOffsetForPartitionError):
        subs.collect(100, frozenset([FAILING]))
    assert subs.collect(100) == {}


def test_a_seek_drops_the_error_of_the_position_it_abandons() -> None:
    subs, inbox = subscription()
    inbox.append((ERROR, FAILING, 0, no_offset()))
    subs.absorb()
    subs.seek(FAILING, 3)
    assert subs.position_now(FAILING) == 3
    assert subs.collect(100) == {}
