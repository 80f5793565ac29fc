"""Typed etcd values: each decodes what the writers store (and what older
releases stored), and encodes to equal bytes for equal records."""

from __future__ import annotations

import json

from tidelog_server.etcd.records import (
    BrokerRegistration,
    CoordinatorRegistration,
    PartitionState,
    TopicAssignment,
)


def test_a_broker_registration_round_trips_with_its_resources() -> None:
    registration = BrokerRegistration(3, "10.0.0.7", 9092, "rack-b", 4000, 65536)
    assert BrokerRegistration.decode(registration.encode()) == registration
    assert registration.address == "10.0.0.7:9092"


def test_a_broker_registration_without_resources_reports_none() -> None:
    # A broker from before the resources were reported; spacing as json.dumps writes it.
    older = json.dumps({"id": 1, "host": "h", "port": 1, "rack": None}, sort_keys=True).encode()
    registration = BrokerRegistration.decode(older)
    assert registration == BrokerRegistration(1, "h", 1, "", None, None)
    assert b"max_partitions" not in registration.encode()


def test_a_coordinator_registration_reads_the_controller_value() -> None:
    value = json.dumps({"id": "c1", "host": "127.0.0.1", "port": 7000}).encode()
    registration = CoordinatorRegistration.decode(value)
    assert (registration.coordinator_id, registration.address) == ("c1", "127.0.0.1:7000")
    assert CoordinatorRegistration.decode(registration.encode()) == registration


def test_a_topic_assignment_orders_partitions_by_number() -> None:
    value = json.dumps(
        {
            "name": "orders",
            "topic_id": "abc",
            "partitions": [
                {"partition": 1, "replicas": [2, 0]},
                {"partition": 0, "replicas": [1, 2]},
            ],
            "configs": {"retention.ms": "1000"},
            "version": 1,
            "created_ms": 5,
        }
    ).encode()
    topic = TopicAssignment.decode(value)
    assert topic.replicas == ((1, 2), (2, 0))
    assert (topic.name, topic.topic_id, topic.configs) == (
        "orders",
        "abc",
        {"retention.ms": "1000"},
    )


def test_a_topic_assignment_round_trips_as_the_coordinator_writes_it() -> None:
    topic = TopicAssignment("t", "id1", ((0, 1), (1, 2)), {"cleanup.policy": "compact"}, 3, 17)
    value = topic.encode()
    assert TopicAssignment.decode(value) == topic
    assert json.loads(value)["partitions"] == [
        {"partition": 0, "replicas": [0, 1]},
        {"partition": 1, "replicas": [1, 2]},
    ]


def test_a_topic_assignment_takes_defaults_for_missing_fields() -> None:
    topic = TopicAssignment.decode(b'{"partitions":[{},{}]}')
    assert topic == TopicAssignment("", "", ((), ()), {})


def test_a_broker_registration_carries_its_internal_listener() -> None:
    split = BrokerRegistration(broker_id=1, host="10.0.0.5", port=9392, internal_port=9393)
    assert BrokerRegistration.decode(split.encode()) == split
    assert split.internal_address == "10.0.0.5:9393"
    # A broker from before the split serves replication on its client port.
    older = BrokerRegistration.decode(b'{"id": 2, "host": "h", "port": 9392}')
    assert older.internal_port is None
    assert older.internal_address == "h:9392"


def test_a_broker_registration_lists_its_offline_partitions_by_topic() -> None:
    registration = BrokerRegistration(
        broker_id=1, host="h", port=1, offline_partitions=(("a-b", 3), ("a", 0), ("a-b", 1))
    )
    encoded = registration.encode()
    assert b'"offline_partitions":{"a":[0],"a-b":[1,3]}' in encoded
    decoded = BrokerRegistration.decode(encoded)
    assert decoded.offline_partitions == (("a", 0), ("a-b", 1), ("a-b", 3))
    # None offline: the field is left out (the bytes an older broker wrote),
    # and an older broker's registration means nothing is offline.
    assert b"offline" not in BrokerRegistration(1, "h", 1).encode()
    assert BrokerRegistration.decode(b'{"id": 2, "host": "h", "port": 1}').offline_partitions == ()


def test_a_broker_registration_lists_its_torn_partitions_by_topic() -> None:
    registration = BrokerRegistration(1, "h", 1, torn_partitions=(("b", 2), ("a", 0), ("b", 1)))
    encoded = registration.encode()
    assert b'"torn_partitions":{"a":[0],"b":[1,2]}' in encoded
    assert BrokerRegistration.decode(encoded).torn_partitions == (("a", 0), ("b", 1), ("b", 2))
    # None torn: left out, and an older broker's registration lists none.
    assert b"torn" not in BrokerRegistration(1, "h", 1).encode()
    assert BrokerRegistration.decode(b'{"id": 2, "host": "h", "port": 1}').torn_partitions == ()


def test_a_starting_broker_registration_says_so() -> None:
    encoded = BrokerRegistration(1, "h", 1, starting=True).encode()
    assert b'"starting":true' in encoded
    assert BrokerRegistration.decode(encoded).starting
    assert b"starting" not in BrokerRegistration(1, "h", 1).encode()
    assert not BrokerRegistration.decode(b'{"id": 2, "host": "h", "port": 1}').starting


def test_a_broker_registration_publishes_its_torn_logs_figures_apart() -> None:
    # A key of its own: a coordinator of the release before reads
    # torn_partitions as ever and ignores it.
    registration = BrokerRegistration(
        1,
        "h",
        1,
        torn_partitions=(("a", 0), ("b", 1)),
        torn_figures=(("b", 1, 4, 90), ("a", 0, -1, 0)),
    )
    encoded = registration.encode()
    assert b'"torn_partitions":{"a":[0],"b":[1]}' in encoded
    assert b'"torn_figures":{"a":[[0,-1,0]],"b":[[1,4,90]]}' in encoded
    assert BrokerRegistration.decode(encoded).torn_figures == (("a", 0, -1, 0), ("b", 1, 4, 90))
    # None: left out; an older broker's registration publishes none.
    assert b"torn_figures" not in BrokerRegistration(1, "h", 1).encode()
    old = b'{"id":2,"host":"h","port":1,"torn_partitions":{"a":[0]}}'
    assert BrokerRegistration.decode(old).torn_figures == ()


def test_a_partition_state_keeps_its_eligible_leader_replicas_and_omits_none() -> None:
    # As an older release wrote it: no "elr", none eligible.
    old = b'{"isr":[0,2],"leader":0,"leader_epoch":5,"version":9}'
    assert PartitionState.decode(old) == PartitionState(0, 5, (0, 2), 9)
    assert PartitionState(0, 5, (0, 2), 9).encode() == old
    kept = PartitionState(0, 5, (0,), 10, elr=(2,))
    assert PartitionState.decode(kept.encode()) == kept
    assert b'"elr":[2]' in kept.encode()
