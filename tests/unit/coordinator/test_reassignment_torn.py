"""A reassignment that moves leadership off a leaving leader, against a real
etcd (the controller's ReassignmentDriver, and a cancel through
PartitionAdmin), with brokers whose registration lists their log of the
partition torn (`torn_partitions`: back from a crash, maybe with its tail
cut, and not caught up since).

Before, both picked the first target replica alive and in the ISR, torn or
not: the others then truncated to its cut log, losing acknowledged records.
They elect by the controller's rule now (election_rule.elect_in_sync): an
untorn ISR member leads; with only torn ones and an ISR member away, the
move waits (logged once) and completes once they caught up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from tidelog.errors import InvalidRequestError
from tidelog.types import TopicPartition
from tidelog_coordinator.partition_admin import PartitionAdmin
from tidelog_coordinator.reassignment_driver import ReassignmentDriver
from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import (
    BrokerRegistration,
    PartitionState,
    Reassignment,
    TopicAssignment,
)

from tests.support.etcd import EtcdProcess

TOPIC = "events"


def registration(broker: int, torn: tuple[int, int] | None = None) -> bytes:
    """Broker `broker`'s registration; with `torn` (last epoch, log end),
    listing TOPIC-0 torn with those figures, as a broker writes it."""
    value: dict[str, Any] = {"host": "127.0.0.1", "id": broker, "port": 9092 + broker, "rack": ""}
    if torn is not None:
        value["torn_partitions"] = {TOPIC: [0]}
        value["torn_figures"] = {TOPIC: [[0, *torn]]}
    raw = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    assert BrokerRegistration.decode(raw).encode() == raw
    return raw


Step = Callable[[Any, Keys], Awaitable[Any]]


async def fence(client: Any, keys: Keys) -> Any:
    """A controller fence that holds (the driver's writes compare it)."""
    await client.put(keys.election + b"me", b"me")
    return client.transactions.value(keys.election + b"me") == b"me"


def in_etcd(
    etcd: EtcdProcess,
    prefix: bytes,
    move: Reassignment,
    state: PartitionState,
    brokers: dict[int, tuple[int, int] | None],
    steps: list[Step],
) -> tuple[list[Any], TopicAssignment, PartitionState]:
    """TOPIC-0 moving by `move` in `state`, brokers registered (a broker ->
    its torn figures, None: not torn); each of `steps` run in turn. Returns
    what the steps returned, the topic record and the state after."""

    async def run() -> tuple[list[Any], TopicAssignment, PartitionState]:
        client = connect(etcd.endpoint)
        keys = Keys(prefix.decode().rstrip("/"))
        try:
            for broker, torn in brokers.items():
                await client.put(keys.broker(broker), registration(broker, torn))
            record = TopicAssignment(TOPIC, uuid.uuid4().hex, (move.replicas,), {}, 1, 0, {0: move})
            await client.put(keys.topic(TOPIC), record.encode())
            await client.put(keys.partition_state(TOPIC, 0), state.encode())
            results = [await step(client, keys) for step in steps]
            topic = TopicAssignment.decode((await client.get(keys.topic(TOPIC))).value)
            after = PartitionState.decode((await client.get(keys.partition_state(TOPIC, 0))).value)
            return results, topic, after
        finally:
            await client.close()

    return asyncio.run(run())


def test_completing_a_move_elects_an_untorn_target_over_a_torn_one(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    # Leader 0 leaves; target 2 comes first but is torn (its figures even
    # claim the longer log): 3 leads. Before, 2 did.
    move = Reassignment(target=(2, 3), original=(0, 1))
    state = PartitionState(leader=0, leader_epoch=4, isr=(0, 1, 2, 3), version=2)
    driver: ReassignmentDriver | None = None

    async def complete(client: Any, keys: Keys) -> int:
        nonlocal driver
        driver = driver or ReassignmentDriver(client, keys)
        return await driver.complete_once(await fence(client, keys))

    (done,), topic, after = in_etcd(
        etcd, prefix, move, state, {0: None, 1: None, 2: (4, 900), 3: None}, [complete]
    )
    assert done == 1
    assert topic.replicas == ((2, 3),) and not topic.reassignments
    assert after == PartitionState(leader=3, leader_epoch=5, isr=(2, 3), version=3)


def test_a_move_whose_targets_are_all_torn_waits_while_an_isr_member_is_away(
    etcd: EtcdProcess, prefix: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    # Leader 0 died (its registration gone; the controller has not moved
    # the partition yet) and both targets are torn: 0 may return with more,
    # so the move waits, saying so once; once the targets caught up (their
    # brokers list nothing torn), it completes with the first leading.
    move = Reassignment(target=(2, 3), original=(0, 1))
    state = PartitionState(leader=0, leader_epoch=4, isr=(0, 2, 3), version=2)
    driver: ReassignmentDriver | None = None

    async def complete(client: Any, keys: Keys) -> tuple[int, PartitionState]:
        nonlocal driver
        driver = driver or ReassignmentDriver(client, keys)
        done = await driver.complete_once(await fence(client, keys))
        got = await client.get(keys.partition_state(TOPIC, 0))
        return done, PartitionState.decode(got.value)

    async def caught_up(client: Any, keys: Keys) -> None:
        for broker in (2, 3):
            await client.put(keys.broker(broker), registration(broker))

    caplog.set_level(logging.INFO, logger="tidelog.coordinator.reassignment")
    results, topic, after = in_etcd(
        etcd,
        prefix,
        move,
        state,
        {1: None, 2: (4, 900), 3: (4, 800)},
        [complete, complete, caught_up, complete],
    )
    assert results[:2] == [(0, state), (0, state)]
    waits = [r.getMessage() for r in caplog.records if "reassignment waits" in r.getMessage()]
    assert len(waits) == 1, waits
    assert "torn [2, 3]" in waits[0] and "not live [0]" in waits[0]
    assert results[3][0] == 1
    assert topic.replicas == ((2, 3),) and not topic.reassignments
    assert after == PartitionState(leader=2, leader_epoch=5, isr=(2, 3), version=3)


def test_a_cancel_moves_leadership_to_an_untorn_original_replica(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    # Moving (2, 3) -> (0, 1); 0, a target, leads (the preferred replica of
    # the move). The cancel drops it: 3 leads, not 2 (torn). With both
    # torn and 0 serving, the cancel is refused naming why.
    move = Reassignment(target=(0, 1), original=(2, 3))
    state = PartitionState(leader=0, leader_epoch=4, isr=(0, 1, 2, 3), version=2)

    def cancel(torn: dict[int, tuple[int, int] | None]) -> Any:
        async def step(client: Any, keys: Keys) -> Any:
            clock = SimpleNamespace(time_ms=lambda: 0)
            admin = PartitionAdmin(SimpleNamespace(client=client, keys=keys, clock=clock))  # type: ignore[arg-type]
            try:
                await admin.alter_reassignment(TopicPartition(TOPIC, 0), [], 0)
            except InvalidRequestError as exc:
                return exc
            return None

        return in_etcd(etcd, prefix, move, state, {0: None, 1: None, **torn}, [step])

    (error,), topic, after = cancel({2: (4, 900), 3: None})
    assert error is None
    assert topic.replicas == ((2, 3),) and not topic.reassignments
    assert after == PartitionState(leader=3, leader_epoch=5, isr=(2, 3), version=3)

    (error,), topic, after = cancel({2: (4, 900), 3: (4, 800)})
    assert isinstance(error, InvalidRequestError)
    assert "in-sync [2, 3] may have lost the tail" in str(error), error
    assert topic.reassignments and after == state
