"""An ISR write whose transaction fails without saying whether etcd applied
it (a deadline, a connection lost after the commit): ClusterLink.write_isr
settles the outcome before the proposal may end (`_settle_isr_write`).

Ending the proposal at the error, as before, let the leader move the HW
over the ISR it had applied while etcd's ISR already named the joining
replica, which lacked those records: the controller could elect it.

A real ClusterLink on a real etcd leads t-0 (replicas 0, 1; ISR 0); broker
1 is a registration key and fetches through the ReplicaManager. The one
stand-in: the link's etcd transaction for the ISR write fails, after or
instead of reaching etcd.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aetcd.exceptions import ConnectionTimeoutError
from tidelog.records import encode_batch, iter_batches
from tidelog_broker.cluster_link import ClusterLink
from tidelog_broker.partition_manager import PartitionManager
from tidelog_server.etcd.records import BrokerRegistration, PartitionState, TopicAssignment

from tests.support.etcd import EtcdProcess
from tests.unit.broker.in_process_broker import WAIT_S, InProcessBroker, eventually

TOPIC = "t"
#: The leader's log end once the joining replica has been proposed.
LEO = 10


def run_leader(
    etcd: EtcdProcess,
    tmp_path: Path,
    scenario: Callable[[PartitionManager, ClusterLink], Awaitable[None]],
) -> None:
    """Broker 0 leading t-0 through a started ClusterLink; stopped after."""

    async def run() -> None:
        broker = InProcessBroker(etcd, f"/isr-{uuid.uuid4().hex}", tmp_path, 0)
        manager, link = broker.manager, broker.link
        try:
            await broker.start()
            keys = link.keys
            await link.client.put(
                keys.broker(1), BrokerRegistration(broker_id=1, host="127.0.0.1", port=2).encode()
            )
            topic = TopicAssignment(TOPIC, uuid.uuid4().hex, ((0, 1),), {})
            await link.client.put(keys.topic(TOPIC), topic.encode())
            state = PartitionState(leader=0, leader_epoch=1, isr=(0,))
            await link.client.put(keys.partition_state(TOPIC, 0), state.encode())

            def leading() -> bool:
                replication = manager.replicas.replication(TOPIC, 0)
                return (
                    replication is not None
                    and replication.is_leader
                    and link.view.registration_of(1) is not None
                )

            await eventually(leading, "broker 0 leads t-0")
            await scenario(manager, link)
        finally:
            await broker.stop()

    asyncio.run(run())


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_an_isr_write_of_unknown_outcome_is_settled_before_the_hw_moves(
    etcd: EtcdProcess, tmp_path: Path, applied: bool
) -> None:
    async def scenario(manager: PartitionManager, link: ClusterLink) -> None:
        real_transaction = link.client.transaction
        go = asyncio.Event()
        failed = 0

        async def transaction(*args: Any, **kwargs: Any) -> Any:
            nonlocal failed
            if failed:
                return await real_transaction(*args, **kwargs)
            failed += 1
            await go.wait()
            if applied:
                await real_transaction(*args, **kwargs)
            raise ConnectionTimeoutError("deadline exceeded")

        link.client.transaction = transaction  # type: ignore[method-assign]
        # Broker 1, with an empty log, is caught up: it is proposed for the
        # ISR, and its write waits. Then the leader gets LEO records.
        manager.replicas.on_follower_fetch(TOPIC, 0, 1, 0)
        replication = manager.replicas.replication(TOPIC, 0)
        assert replication is not None and replication.isr_change_pending
        data = bytearray(encode_batch([b"v%d" % i for i in range(LEO)]))
        manager.partition_log(TOPIC, 0).append(data, list(iter_batches(data)))
        acks_all = asyncio.ensure_future(
            manager.replicas.wait_for_high_watermark(TOPIC, 0, LEO - 1, 1, WAIT_S)
        )
        go.set()
        if applied:
            # etcd's ISR names broker 1, whose log is empty: the HW waits
            # for it, before and after the watch brings the ISR back.
            await eventually(lambda: replication.isr == [0, 1], "the watch brings ISR [0, 1]")
            assert replication.high_watermark == 0
            assert not acks_all.done()
            manager.replicas.on_follower_fetch(TOPIC, 0, 1, LEO)
        # Not applied: the settling write fences it off, the proposal ends,
        # and the HW moves over ISR [0] at once.
        await acks_all
        assert replication.high_watermark == LEO
        state = await link.client.get(link.keys.partition_state(TOPIC, 0))
        assert state is not None
        assert PartitionState.decode(state.value).isr == ((0, 1) if applied else (0,))

    run_leader(etcd, tmp_path, scenario)
