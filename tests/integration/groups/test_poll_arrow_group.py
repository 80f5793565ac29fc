"""Consumer.poll_arrow in a consumer group: the member gets its partitions
through the group's poll loop, reads them as Arrow batches, and commit()
commits the positions past what poll_arrow returned."""

from __future__ import annotations

from tidelog import Consumer, TopicPartition

from tests.integration.groups.conftest import create_topic, produce
from tests.support.cluster import ClusterProcesses


def test_poll_arrow_in_a_group_commits_what_it_returned(
    cluster: ClusterProcesses, names: tuple[str, str]
) -> None:
    topic, group = names
    create_topic(cluster, topic, 2)
    produce(cluster, topic, 2, 100)
    seen: dict[int, list[int]] = {0: [], 1: []}
    with Consumer(
        topic, group_id=group, bootstrap_servers=cluster.bootstrap, enable_auto_commit=False
    ) as consumer:
        for _ in range(60):
            for tp, batches in consumer.poll_arrow(timeout_ms=500).items():
                for batch in batches:
                    seen[tp.partition].extend(batch.column("offset").to_pylist())
            if all(len(offsets) >= 100 for offsets in seen.values()):
                break
        consumer.commit()
        committed = {p: consumer.committed(TopicPartition(topic, p)) for p in (0, 1)}
    assert seen == {0: list(range(100)), 1: list(range(100))}
    assert committed == {0: 100, 1: 100}
