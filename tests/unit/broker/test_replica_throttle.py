"""The replication throttle's token bucket (time injected)."""

from __future__ import annotations

from tidelog_broker.replica_throttle import ReplicationThrottle


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_only_configured_replicas_of_configured_partitions_are_throttled() -> None:
    throttle = ReplicationThrottle(FakeClock())
    assert not throttle.applies(("t", 0), 3)
    throttle.configure({("t", 0): frozenset({3})}, 1000)
    assert throttle.applies(("t", 0), 3)
    assert not throttle.applies(("t", 0), 1)  # an ISR follower
    assert not throttle.applies(("t", 1), 3)
    throttle.configure({("t", 0): frozenset({3})}, 0)  # 0: no limit
    assert not throttle.applies(("t", 0), 3)


def test_the_bucket_refills_at_the_rate_holds_one_second_and_carries_debt() -> None:
    clock = FakeClock()
    throttle = ReplicationThrottle(clock)
    throttle.configure({("t", 0): frozenset({3})}, 1000)
    assert throttle.allowance() == 0
    clock.now += 0.5
    assert throttle.allowance() == 500
    clock.now += 10  # at most one second's worth
    assert throttle.allowance() == 1000
    throttle.consume(3000)  # a batch bigger than the allowance: debt
    assert throttle.allowance() == 0
    clock.now += 1.9
    assert throttle.allowance() == 0
    clock.now += 0.2
    assert throttle.allowance() == 100
