"""DeleteRecords and the partition operations on a standalone broker (issue
13): records below the offset go (whole segments), durably across a
restart; operations that need a cluster are refused saying so."""

from __future__ import annotations

import pytest
from tidelog import AdminClient, NewTopic, Producer, TopicPartition
from tidelog.errors import InvalidRequestError, OffsetOutOfRangeError

from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(120)


def test_delete_records_on_a_standalone_broker(broker: BrokerProcess, topic_name: str) -> None:
    tp = TopicPartition(topic_name, 0)
    with AdminClient(bootstrap_servers=broker.address) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1, {"segment.bytes": "2048"})])
        with Producer(bootstrap_servers=broker.address, linger_ms=0) as producer:
            for _ in range(100):
                producer.send(topic_name, b"d" * 100).get(timeout=10)
        before = admin.describe_topics([topic_name])[0].partitions[0]
        assert admin.delete_records({tp: 60}) == {tp: 60}
        after = admin.describe_topics([topic_name])[0].partitions[0]
        assert after.log_start_offset == 60 and after.segment_count < before.segment_count
        with pytest.raises(OffsetOutOfRangeError, match="high watermark 100"):
            admin.delete_records({tp: 101})
        with pytest.raises(InvalidRequestError, match="needs a cluster"):
            admin.create_partitions({topic_name: 2})
        with pytest.raises(InvalidRequestError, match="needs a cluster"):
            admin.alter_partition_reassignments({tp: [0]})
        assert admin.list_partition_reassignments() == {}
    broker.restart()
    with AdminClient(bootstrap_servers=broker.address) as admin:
        assert admin.describe_topics([topic_name])[0].partitions[0].log_start_offset == 60
