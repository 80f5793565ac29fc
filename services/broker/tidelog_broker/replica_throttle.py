"""The byte rate a leader sends to replicas being added by a reassignment
(Kafka's leader.replication.throttled.rate): one token bucket per broker,
shared by every throttled partition it leads, so that moving replicas
cannot starve the followers in the ISR or the clients of their bandwidth.

Which (partition, replica) pairs are throttled, and the rate, come from the
reassignments in etcd (ClusterLink sets them): a reassignment started with a
throttle throttles its adding replicas; the bucket runs at the smallest
throttle among them. The ISR's followers are never throttled.

The bucket holds at most one second of the rate. A read may take more than
the allowance (a batch is sent whole), which leaves the bucket in debt: over
time the rate holds. Time is injected (monotonic seconds), for tests.

Not thread-safe: the broker's event loop owns it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from tidelog_broker.log_manager import TopicPartitionKey


class ReplicationThrottle:
    """Token bucket over the bytes sent to throttled replicas (module doc)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: Bytes per second; 0 means not throttled.
        self.rate = 0
        self._tokens = 0.0
        self._at = clock()
        #: partition -> replicas whose fetches of it are throttled.
        self._throttled: Mapping[TopicPartitionKey, frozenset[int]] = {}

    def configure(self, throttled: Mapping[TopicPartitionKey, frozenset[int]], rate: int) -> None:
        """The throttled (partition -> replicas) pairs and the rate in bytes/s."""
        self._throttled = throttled
        if rate != self.rate:
            self._refill()
            self.rate = rate
            self._tokens = min(self._tokens, float(rate))

    def applies(self, key: TopicPartitionKey, replica_id: int) -> bool:
        """Whether fetches of `key` by `replica_id` are throttled."""
        return self.rate > 0 and replica_id in self._throttled.get(key, ())

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
        self._at = now

    def allowance(self) -> int:
        """Bytes that may be sent now (0 while the bucket is empty or in debt)."""
        self._refill()
        return max(0, int(self._tokens))

    def consume(self, sent: int) -> None:
        """Count `sent` bytes (may leave the bucket in debt)."""
        self._refill()
        self._tokens -= sent
