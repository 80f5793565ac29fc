"""acks=all below min.insync.replicas after the append, against real brokers.

A topic of two replicas with min.insync.replicas 2: the follower is frozen
(SIGSTOP) just after the idempotent producer's batches are appended with the
ISR still at two, so the ISR shrinks to the leader alone with the batches
written and unconfirmed. The leader answers them NOT_ENOUGH_REPLICAS_AFTER_APPEND
as soon as the HW passes them (Kafka's DelayedProduce), well before the
request timeout; the producer retries, is refused NOT_ENOUGH_REPLICAS while
the ISR is short, and, once the follower is back in the ISR, is answered with
the original offsets: every record is written exactly once, with the offset
the producer was told.

Every process is started by the fixtures and stopped through its own PID;
the SIGSTOP is undone in a `finally`.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any

import pytest
from tidelog import Producer
from tidelog._sender import Sender

from tests.fault.replication_support import ReplicatedCluster, read_back
from tests.support.polling import read_until

TOPIC = "after-append"
COUNT = 200
#: Far above what the answer takes (the follower leaves the ISR after
#: REPLICA_LAG_MS or its session's expiry, seconds): the answer must not be
#: the request timing out.
REQUEST_TIMEOUT_MS = 90_000


class RetriedErrors:
    """Spies on the producer's sender (the real one runs unchanged): the
    errors its batches were answered with and sent again for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.errors: Counter[str] = Counter()
        original = Sender._retry_or_fail
        spy = self

        def retry_or_fail(sender: Sender, batches: list[Any], error: Any) -> None:
            spy.errors[type(error).__name__] += len(batches)
            original(sender, batches, error)

        monkeypatch.setattr(Sender, "_retry_or_fail", retry_or_fail)


@pytest.mark.timeout(240)
def test_an_idempotent_batch_answered_after_append_is_written_once(
    cluster: ReplicatedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    retried = RetriedErrors(monkeypatch)
    cluster.create_topic(TOPIC, 1, 2, {"min.insync.replicas": "2"})
    leader_id = cluster.leaders(TOPIC)[0]
    (follower,) = (cluster.brokers[r] for r in cluster.isr(TOPIC)[0] if r != leader_id)
    with Producer(
        bootstrap_servers=cluster.bootstrap,
        acks="all",
        linger_ms=5,
        retry_backoff_ms=50,
        retry_backoff_max_ms=500,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        delivery_timeout_ms=2 * REQUEST_TIMEOUT_MS,
    ) as producer:
        # Metadata and a producer id first: the sends below go out at once.
        first = producer.send(TOPIC, b"0:0", partition=0).get(timeout=30)
        assert first.offset == 0
        stopped = False
        try:
            os.kill(follower.pid, signal.SIGSTOP)
            stopped = True
            # Appended with the ISR still at two: it takes seconds to shrink.
            futures = [producer.send(TOPIC, b"0:%d" % i, partition=0) for i in range(1, COUNT)]
            read_until(
                lambda: dict(retried.errors),
                lambda errors: errors.get("NotEnoughReplicasAfterAppendError", 0) > 0,
                "a NOT_ENOUGH_REPLICAS_AFTER_APPEND answer (batches retried, by error)",
                REQUEST_TIMEOUT_MS / 1000 / 3,
            )
            assert not any(f.succeeded() for f in futures), "acknowledged below min ISR"
        finally:
            if stopped:
                os.kill(follower.pid, signal.SIGCONT)
        assert cluster.wait_full_isr(TOPIC, 2, 60), cluster.isr(TOPIC)
        offsets = [f.get(timeout=60).offset for f in futures]
    print(f"\nbatches sent again, by the error they were answered with: {dict(retried.errors)}")
    assert offsets == list(range(1, COUNT)), "the producer was told other offsets than written"
    seqs = read_back(cluster.bootstrap, TOPIC, 1, 30)[0]
    assert seqs == list(range(COUNT)), Counter(seqs).most_common(3)
