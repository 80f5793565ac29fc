"""The producer's `linger_while_in_flight` against a real broker process: records sent while
their partition's request is unanswered (the broker frozen with SIGSTOP, undone in a
`finally`) go in one request once the answer comes; with the option off, each goes as its
linger ends, as Kafka's producer sends them."""

from __future__ import annotations

import os
import signal
import time

import pytest
from tidelog import AdminClient, NewTopic, Producer

from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(120)

TOPIC = "held"
#: Records sent one by one while the first request is unanswered.
LATER = 8
#: Between two of them: time enough for the sender to send each on its own.
GAP_S = 0.05


def _answered_requests(producer: Producer) -> int:
    return int(producer.metrics()["producer-metrics"]["request-total"])


def _send_while_frozen(broker: BrokerProcess, linger_while_in_flight: bool) -> int:
    """Produce one record, freeze the broker before it is answered, send LATER more one by
    one, thaw it; returns how many requests carried those LATER + 1 records."""
    with AdminClient(broker.address) as admin:
        admin.create_topics([NewTopic(TOPIC, num_partitions=1)])
    with Producer(
        broker.address,
        linger_ms=0,
        request_timeout_ms=60_000,
        linger_while_in_flight=linger_while_in_flight,
    ) as producer:
        producer.send(TOPIC, b"warm-up", partition=0).get(30)  # metadata and stream ready
        before = _answered_requests(producer)
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            futures = [producer.send(TOPIC, b"first", partition=0)]
            for i in range(LATER):
                time.sleep(GAP_S)
                futures.append(producer.send(TOPIC, b"later-%d" % i, partition=0))
            time.sleep(GAP_S)
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        offsets = [future.get(30).offset for future in futures]
        assert offsets == list(range(offsets[0], offsets[0] + LATER + 1))
        return _answered_requests(producer) - before


def test_records_sent_while_their_partition_is_unanswered_go_in_one_request(
    own_broker: BrokerProcess,
) -> None:
    """The first record's request stays unanswered while the broker is frozen; the
    later records wait in one batch, sent when the answer comes: two requests in all."""
    assert _send_while_frozen(own_broker, linger_while_in_flight=True) == 2


def test_without_it_each_record_goes_when_its_linger_ends(own_broker: BrokerProcess) -> None:
    """Off: the later records go in requests of their own while the first is
    unanswered (up to max_in_flight_requests, 5), the rest after: more than two."""
    assert _send_while_frozen(own_broker, linger_while_in_flight=False) > 2
