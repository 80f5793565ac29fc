"""The client side of connections and metadata, with no server (or none
listening): bootstrap from the environment, names refused before any call,
a bounded wait for a server that cannot be reached, partitions that do not
exist."""

from __future__ import annotations

import pytest
from tidelog import AdminClient, Consumer, Producer, ProducerConfig, TopicPartition
from tidelog._connection import MetadataSnapshot, TopicMetadata, check_known_partitions
from tidelog.errors import BrokerNotAvailableError, InvalidTopicError, UnknownTopicOrPartitionError

from tests.support.processes import free_port

pytestmark = pytest.mark.timeout(60)


def test_the_default_bootstrap_comes_from_tidelog_bootstrap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TIDELOG_BOOTSTRAP", "10.1.2.3:9000,10.1.2.4:9000")
    assert ProducerConfig().addresses == ("10.1.2.3:9000", "10.1.2.4:9000")
    with AdminClient() as admin:
        assert admin._async._config.addresses == ("10.1.2.3:9000", "10.1.2.4:9000")
    # An explicit argument wins over the environment.
    assert ProducerConfig(bootstrap_servers="a:1").addresses == ("a:1",)
    monkeypatch.delenv("TIDELOG_BOOTSTRAP")
    assert ProducerConfig().addresses == ("127.0.0.1:9392",)


@pytest.mark.parametrize("name", ["bad/name", ""])
def test_a_bad_topic_name_fails_at_once(name: str) -> None:
    # Nothing listens there: a client that asked would wait out max_block_ms.
    with (
        Producer(f"127.0.0.1:{free_port()}", max_block_ms=600_000) as producer,
        pytest.raises(InvalidTopicError),
    ):
        producer.send(name, b"x")


def test_an_unreachable_bootstrap_fails_within_the_connection_setup_timeout() -> None:
    address = f"127.0.0.1:{free_port()}"
    # The deadline is the module's 60 s timeout, far below the 600 s
    # max_block_ms that this send used to wait out.
    with (
        Producer(address, max_block_ms=600_000, socket_connection_setup_timeout_ms=500) as producer,
        pytest.raises(BrokerNotAvailableError) as info,
    ):
        producer.send("orders", b"x")
    assert address in info.value.message
    assert "socket_connection_setup_timeout_ms" in info.value.message


def test_partitions_metadata_says_do_not_exist_are_refused() -> None:
    snapshot = MetadataSnapshot(
        brokers={0: "b:1"},
        topics={"t": TopicMetadata("t", (0, 0, 0))},
        partition_counts={"t": 3},
    )
    check_known_partitions(snapshot, [("t", 0), ("t", 2), ("unknown-yet", 5)])
    for partition in (3, 7, -1):
        with pytest.raises(UnknownTopicOrPartitionError) as info:
            check_known_partitions(snapshot, [("t", partition)])
        assert f"partition {partition} of topic 't'" in info.value.message
    # -1 never names a partition, not even the last one.
    assert snapshot.leader_address("t", -1) is None


def test_assign_of_a_negative_partition_raises() -> None:
    with (
        Consumer(bootstrap_servers=f"127.0.0.1:{free_port()}") as consumer,
        pytest.raises(UnknownTopicOrPartitionError),
    ):
        consumer.assign([TopicPartition("t", -1)])
