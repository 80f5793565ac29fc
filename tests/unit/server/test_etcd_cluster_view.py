"""The typed view of the cluster that brokers and the gateway keep, fed watch
batches as etcd sends them."""

from __future__ import annotations

import json

from tidelog_server.etcd import Change, WatchBatch
from tidelog_server.etcd.cluster_view import ClusterView
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import (
    BrokerRegistration,
    CoordinatorRegistration,
    PartitionState,
)

KEYS = Keys("/view")


def topic_value(name: str, topic_id: str, replicas: list[list[int]]) -> bytes:
    partitions = [{"partition": p, "replicas": r} for p, r in enumerate(replicas)]
    return json.dumps(
        {"name": name, "topic_id": topic_id, "partitions": partitions, "configs": {}}
    ).encode()


def test_live_brokers_carry_their_registration_revision() -> None:
    view = ClusterView(KEYS)
    registration = BrokerRegistration(1, "127.0.0.1", 9001, "a", 100, 1024)
    view.apply_brokers(
        WatchBatch(True, [Change(KEYS.broker(1), registration.encode(), 12, create_revision=10)])
    )
    assert view.registration_of(1) == 10
    assert view.brokers[1].registration == registration
    assert view.broker_address(1) == "127.0.0.1:9001"
    # It re-registers (a new key: a new create revision), then goes away.
    view.apply_brokers(
        WatchBatch(False, [Change(KEYS.broker(1), registration.encode(), 20, create_revision=20)])
    )
    assert view.registration_of(1) == 20
    view.apply_brokers(WatchBatch(False, [Change(KEYS.broker(1), None, 30)]))
    assert view.registration_of(1) is None and view.broker_address(1) is None


def test_a_reset_forgets_what_the_listing_no_longer_has() -> None:
    view = ClusterView(KEYS)
    for broker_id in (1, 2):
        value = BrokerRegistration(broker_id, "h", 1).encode()
        view.apply_brokers(
            WatchBatch(False, [Change(KEYS.broker(broker_id), value, 5, create_revision=5)])
        )
    value = BrokerRegistration(2, "h", 1).encode()
    view.apply_brokers(WatchBatch(True, [Change(KEYS.broker(2), value, 5, create_revision=5)]))
    assert sorted(view.brokers) == [2]


def test_a_state_older_than_its_topic_is_not_reported() -> None:
    """A topic deleted and re-created under the same name: the old state key
    (written before the new topic key) must not name a leader."""
    view = ClusterView(KEYS)
    view.apply_topics(
        WatchBatch(
            True,
            [
                Change(
                    KEYS.topic("t"),
                    topic_value("t", "new", [[1, 2], [2, 1]]),
                    50,
                    create_revision=50,
                )
            ],
        )
    )
    old = PartitionState(leader=1, leader_epoch=3, isr=(1, 2)).encode()
    new = PartitionState(leader=2, leader_epoch=0, isr=(2, 1)).encode()
    view.apply_states(
        WatchBatch(
            True,
            [
                Change(KEYS.partition_state("t", 0), old, 40),
                Change(KEYS.partition_state("t", 1), new, 51),
            ],
        )
    )
    topic = view.topics["t"]
    assert topic.replicas == [[1, 2], [2, 1]] and topic.topic_id == "new"
    assert view.state(topic, 0) is None
    state = view.state(topic, 1)
    assert state is not None
    assert (state.leader, state.leader_epoch, state.isr, state.mod_revision) == (2, 0, [2, 1], 51)


def test_coordinators_in_a_stable_order() -> None:
    view = ClusterView(KEYS)
    changes = [
        Change(KEYS.coordinator(name), CoordinatorRegistration(name, "h", port).encode(), 1)
        for name, port in (("c2", 2), ("c0", 0), ("c1", 1))
    ]
    view.apply_coordinators(WatchBatch(True, changes))
    # c0 registered no port: not reachable, so not tried.
    assert view.coordinator_addresses() == ["h:1", "h:2"]


def test_an_unreadable_value_is_skipped_and_the_rest_applied() -> None:
    """One bad key must not stop the watch that carries every other change
    (a callback that raised would make the watch list and fail forever)."""
    view = ClusterView(KEYS)
    good = BrokerRegistration(2, "h", 2).encode()
    view.apply_brokers(
        WatchBatch(
            True,
            [
                Change(KEYS.broker(1), b"{not json", 5, create_revision=5),
                Change(KEYS.broker(2), good, 6, create_revision=6),
                Change(KEYS.broker(3), b'{"host": "h"}', 7, create_revision=7),
            ],
        )
    )
    assert sorted(view.brokers) == [2]
    view.apply_topics(
        WatchBatch(
            True,
            [
                Change(KEYS.topic("bad"), b'{"partitions": [{"replicas": ["x"]}]}', 8),
                Change(KEYS.topic("t"), topic_value("t", "id", [[2]]), 9, create_revision=9),
            ],
        )
    )
    assert sorted(view.topics) == ["t"]
    view.apply_states(
        WatchBatch(
            True,
            [
                Change(KEYS.partition_state("t", 0), b'{"leader": "nobody"}', 10),
                Change(KEYS.partition_state("t", 1), PartitionState(leader=2).encode(), 11),
            ],
        )
    )
    assert sorted(view.states) == [("t", 1)]
    view.apply_coordinators(WatchBatch(True, [Change(KEYS.coordinator("c0"), b"[]", 12)]))
    assert view.coordinators == {}


def test_out_of_sync_lists_the_partitions_a_live_leader_has_not_taken_back() -> None:
    """What a broker's readiness (health "tidelog.broker.InSync") waits for."""
    view = ClusterView(KEYS)
    for broker_id in (1, 2, 3):
        value = BrokerRegistration(broker_id, "h", 1).encode()
        view.apply_brokers(
            WatchBatch(False, [Change(KEYS.broker(broker_id), value, 5, create_revision=5)])
        )
    topic = topic_value("t", "id", [[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    view.apply_topics(WatchBatch(True, [Change(KEYS.topic("t"), topic, 6, create_revision=6)]))
    states = {0: (1, [1, 2, 3]), 1: (2, [2, 3]), 2: (3, [3, 2])}
    view.apply_states(
        WatchBatch(
            True,
            [
                Change(
                    KEYS.partition_state("t", p), PartitionState(leader, 1, tuple(isr)).encode(), 7
                )
                for p, (leader, isr) in states.items()
            ],
        )
    )
    assert view.out_of_sync(1) == [("t", 1), ("t", 2)]
    assert view.out_of_sync(2) == [] and view.out_of_sync(3) == []
    assert view.out_of_sync(4) == []  # hosts nothing
    # Partition 2's leader dies: nobody can bring broker 1 back into its
    # ISR, so it no longer counts against broker 1.
    view.apply_brokers(WatchBatch(False, [Change(KEYS.broker(3), None, 8)]))
    assert view.out_of_sync(1) == [("t", 1)]


def test_offline_replicas_are_dead_brokers_and_the_logs_live_ones_list() -> None:
    """What Metadata answers as a partition's offline replicas, as Kafka's:
    in replica order, a replica whose broker is not registered (its lease
    expired, or it never was) and one whose live broker's registration lists
    its log offline; a registration without the field (an older broker)
    lists nothing."""
    view = ClusterView(KEYS)
    older = json.loads(BrokerRegistration(2, "h", 2).encode())
    older.pop("offline_partitions", None)
    listed = {
        1: BrokerRegistration(1, "h", 1, offline_partitions=(("t", 0), ("u", 1))).encode(),
        2: json.dumps(older).encode(),
        3: BrokerRegistration(3, "h", 3, offline_partitions=(("t", 0),)).encode(),
    }
    view.apply_brokers(
        WatchBatch(
            True,
            [Change(KEYS.broker(b), value, 5, create_revision=5) for b, value in listed.items()],
        )
    )
    assert view.offline_replicas("t", 0, [3, 2, 1]) == [3, 1]
    assert view.offline_replicas("t", 1, [3, 2, 1]) == []
    assert view.offline_replicas("u", 1, [2, 3]) == []  # broker 1 holds no replica of it
    # Broker 3's lease expires: not live, so offline for every partition
    # (in replica order, with the log broker 1 lists).
    view.apply_brokers(WatchBatch(False, [Change(KEYS.broker(3), None, 9)]))
    assert view.offline_replicas("t", 0, [3, 2, 1]) == [3, 1]
    assert view.offline_replicas("t", 1, [2, 3, 1]) == [3]
    # A broker id that never registered cannot serve either.
    assert view.offline_replicas("t", 1, [7, 2, 1]) == [7]
    # Only what is reported: lists_offline (what keeps a follower out of
    # the ISR) still answers for live registrations alone.
    assert not view.lists_offline(3, "t", 0)
    assert view.lists_offline(1, "t", 0)
