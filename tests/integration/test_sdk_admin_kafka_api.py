"""The admin calls of issue 17 against a real broker: per-topic results of
create_topics/delete_topics, describe_cluster, list_offsets with OffsetSpec,
and configs over ConfigResource (describe, alter, incremental alter).
(describe_cluster of a real cluster: tests/integration/groups/.)"""

from __future__ import annotations

import asyncio

import pytest
from tidelog import (
    AdminClient,
    AlterConfigOp,
    AlterConfigOpType,
    AsyncAdminClient,
    ConfigResource,
    ConfigResourceType,
    ListOffsetsResultInfo,
    NewTopic,
    Node,
    OffsetSpec,
    Producer,
    TopicPartition,
)
from tidelog.errors import (
    InvalidConfigError,
    InvalidRequestError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(60)


def test_create_topics_reports_each_topic(broker_address: str, topic_name: str) -> None:
    taken, fresh, bad = f"{topic_name}-taken", f"{topic_name}-fresh", "no spaces allowed"
    with AdminClient(broker_address) as admin:
        assert admin.create_topics([NewTopic(taken)]) == {taken: None}
        # validate_only: the answer says it would work; nothing is created.
        assert admin.create_topics([NewTopic(fresh)], validate_only=True) == {fresh: None}
        assert fresh not in admin.list_topics()

        results = admin.create_topics(
            [NewTopic(taken), NewTopic(fresh, 2), NewTopic(bad)], raise_errors=False
        )
        assert results[fresh] is None
        assert isinstance(results[taken], TopicAlreadyExistsError)
        assert isinstance(results[bad], InvalidTopicError)
        assert taken in str(results[taken])
        assert {taken, fresh} <= set(admin.list_topics())

        # By default the first error is raised, after every topic was tried.
        with pytest.raises(TopicAlreadyExistsError, match=taken):
            admin.create_topics([NewTopic(taken), NewTopic(f"{topic_name}-also")])
        assert f"{topic_name}-also" in admin.list_topics()

        gone = admin.delete_topics([fresh, f"{topic_name}-never"], raise_errors=False)
        assert gone[fresh] is None
        assert isinstance(gone[f"{topic_name}-never"], UnknownTopicOrPartitionError)


def test_describe_cluster_of_a_standalone_broker(broker: BrokerProcess) -> None:
    with AdminClient(broker.address) as admin:
        described = admin.describe_cluster()
    host, port = broker.address.rsplit(":", 1)
    assert described.cluster_id is None and described.controller_id is None
    assert described.brokers == [Node(0, host, int(port))]
    assert described.coordinators == []


def test_list_offsets_takes_offset_specs(broker_address: str, topic_name: str) -> None:
    tp = TopicPartition(topic_name, 0)
    with AdminClient(broker_address) as admin:
        admin.create_topics([NewTopic(topic_name)])
    with Producer(broker_address) as producer:
        for i in range(3):
            producer.send(topic_name, b"v", partition=0, timestamp_ms=1_700_000_000_000 + i * 10)
        producer.flush()
    with AdminClient(broker_address) as admin:
        assert admin.list_offsets({tp: OffsetSpec.earliest()}) == {tp: (0, -1)}
        assert admin.list_offsets({tp: OffsetSpec.latest()})[tp].offset == 3
        found = admin.list_offsets({tp: OffsetSpec.for_timestamp(1_700_000_000_005)})
        assert found == {tp: ListOffsetsResultInfo(1, 1_700_000_000_010)}
        assert admin.list_offsets({tp: OffsetSpec.for_timestamp(1_800_000_000_000)})[tp][0] == -1
        assert admin.list_offsets({tp: -1}) == {tp: (3, -1)}  # the wire values still work
    with pytest.raises(ValueError, match="offset spec"):
        OffsetSpec(-3)
    with pytest.raises(ValueError, match="timestamp_ms"):
        OffsetSpec.for_timestamp(-5)


def test_configs_over_config_resources(broker_address: str, topic_name: str) -> None:
    topic = ConfigResource(ConfigResourceType.TOPIC, topic_name)
    with AdminClient(broker_address) as admin:
        admin.create_topics(
            [NewTopic(topic_name, topic_configs={"retention.ms": "60000", "segment.bytes": "4096"})]
        )
        described = admin.describe_configs([topic])
        assert list(described) == [topic]
        assert described[topic]["retention.ms"].value == "60000"
        assert described[topic]["retention.ms"].is_override

        # alter_configs: the resource's configs become the whole set of overrides.
        admin.alter_configs([ConfigResource("TOPIC", topic_name, {"retention.ms": "120000"})])
        entries = admin.describe_configs([topic_name])[topic_name]
        assert entries["retention.ms"].value == "120000"
        assert not entries["segment.bytes"].is_override  # back to the default

        # incremental_alter_configs: set, delete, append, subtract.
        admin.incremental_alter_configs(
            [
                ConfigResource(
                    "topic",
                    topic_name,
                    {
                        "segment.bytes": "8192",
                        "retention.ms": None,
                        "cleanup.policy": AlterConfigOp(AlterConfigOpType.SET, "compact"),
                    },
                )
            ]
        )
        entries = admin.describe_configs([topic_name])[topic_name]
        assert entries["segment.bytes"].value == "8192"
        assert not entries["retention.ms"].is_override
        assert entries["cleanup.policy"].value == "compact"
        append = AlterConfigOp(AlterConfigOpType.APPEND, "delete")
        admin.incremental_alter_configs(
            [ConfigResource("TOPIC", topic_name, {"cleanup.policy": append})]
        )
        assert admin.describe_configs([topic])[topic]["cleanup.policy"].value == "compact,delete"
        subtract = AlterConfigOp(AlterConfigOpType.SUBTRACT, "compact")
        admin.incremental_alter_configs(
            [ConfigResource("TOPIC", topic_name, {"cleanup.policy": subtract})]
        )
        assert admin.describe_configs([topic])[topic]["cleanup.policy"].value == "delete"

        # validate_only changes nothing; a bad value names the key.
        admin.alter_configs([ConfigResource("TOPIC", topic_name, {})], validate_only=True)
        assert admin.describe_configs([topic])[topic]["segment.bytes"].value == "8192"
        with pytest.raises(InvalidConfigError, match=r"segment\.bytes"):
            admin.incremental_alter_configs(
                [ConfigResource("TOPIC", topic_name, {"segment.bytes": "12"})]
            )

        broker = ConfigResource(ConfigResourceType.BROKER, "0")
        with pytest.raises(InvalidRequestError, match="only TOPIC configs"):
            admin.describe_configs([broker])
        with pytest.raises(InvalidRequestError, match="only TOPIC configs"):
            admin.alter_configs([ConfigResource("BROKER", "0", {"log.retention.ms": "1"})])
        with pytest.raises(ValueError, match="TOPIC or BROKER"):
            ConfigResource("GROUP", "g")


def test_async_admin_describes_the_cluster_and_configs(
    broker_address: str, topic_name: str
) -> None:
    async def main() -> None:
        async with AsyncAdminClient(broker_address) as admin:
            assert await admin.create_topics([NewTopic(topic_name)]) == {topic_name: None}
            described = await admin.describe_cluster()
            assert [b.id for b in described.brokers] == [0]
            topic = ConfigResource("TOPIC", topic_name)
            await admin.incremental_alter_configs(
                [ConfigResource("TOPIC", topic_name, {"retention.ms": "5000"})]
            )
            assert (await admin.describe_configs([topic]))[topic]["retention.ms"].value == "5000"

    asyncio.run(asyncio.wait_for(main(), 30))
