"""AdminClient and AsyncAdminClient against a real broker process."""

from __future__ import annotations

import asyncio

import pytest
from tidelog import AdminClient, AsyncAdminClient, NewTopic
from tidelog.errors import (
    InvalidPartitionsError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

pytestmark = pytest.mark.timeout(30)


def test_create_describe_list_delete(broker_address: str, topic_name: str) -> None:
    with AdminClient(broker_address) as admin:
        admin.create_topics(
            [NewTopic(topic_name, num_partitions=3, topic_configs={"retention.ms": "60000"})]
        )
        assert topic_name in admin.list_topics()
        (description,) = admin.describe_topics([topic_name])
        assert description.name == topic_name
        assert [p.partition for p in description.partitions] == [0, 1, 2]
        assert description.partitions[0].leader == 0
        assert description.partitions[0].log_end_offset == 0
        assert description.configs["retention.ms"] == "60000"
        admin.delete_topics([topic_name])
        assert topic_name not in admin.list_topics()


def test_validate_only_creates_nothing(broker_address: str, topic_name: str) -> None:
    with AdminClient(broker_address) as admin:
        admin.create_topics([NewTopic(topic_name)], validate_only=True)
        assert topic_name not in admin.list_topics()


def test_typed_errors(broker_address: str, topic_name: str) -> None:
    with AdminClient(broker_address) as admin:
        admin.create_topics([NewTopic(topic_name)])
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic(topic_name)])
        with pytest.raises(InvalidTopicError):
            admin.create_topics([NewTopic("no spaces allowed")])
        with pytest.raises(InvalidPartitionsError):
            admin.create_topics([NewTopic(topic_name + "-x", num_partitions=-1)])
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_topics([topic_name + "-missing"])
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.describe_topics([topic_name + "-missing"])


def test_async_admin(broker_address: str, topic_name: str) -> None:
    async def main() -> None:
        async with AsyncAdminClient(broker_address) as admin:
            await admin.create_topics([NewTopic(topic_name, num_partitions=2)])
            (description,) = await admin.describe_topics([topic_name])
            assert len(description.partitions) == 2
            with pytest.raises(TopicAlreadyExistsError):
                await admin.create_topics([NewTopic(topic_name)])
            await admin.delete_topics([topic_name])
            assert topic_name not in await admin.list_topics()

    asyncio.run(main())
