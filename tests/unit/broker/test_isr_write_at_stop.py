"""A leader's ISR writes end with its registration: none lands in etcd
after the broker's registration is gone (the transaction compares its
key's create revision), and those under way when the broker stops are
cancelled before it deregisters, their proposals left standing (their
outcome unknown, the HW keeps waiting for the replicas they add).

Before, a write left running at stop retried its settling against the
closed etcd client every 0.5 s, logging, until the event loop ended; and a
write sent after the lease was revoked could still change the ISR.

A real ClusterLink on a real etcd leads t-0 (replicas 0, 1; ISR 0), as in
test_isr_write_unknown_outcome; broker 1 fetches through the
ReplicaManager. The one stand-in: the link's etcd transaction for the ISR
write, which waits, or first deletes the leader's registration (its lease
expired just then).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tidelog.records import encode_batch, iter_batches
from tidelog_broker.cluster_link import ClusterLink
from tidelog_broker.partition_manager import PartitionManager
from tidelog_server.etcd.records import PartitionState

from tests.support.etcd import EtcdProcess
from tests.unit.broker.test_isr_write_unknown_outcome import (
    LEO,
    TOPIC,
    WAIT_S,
    eventually,
    run_leader,
)


def test_an_isr_write_under_way_is_cancelled_when_the_broker_stops(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    async def scenario(manager: PartitionManager, link: ClusterLink) -> None:
        sent = asyncio.Event()
        cancelled = asyncio.Event()

        async def transaction(*_args: Any, **_kwargs: Any) -> Any:
            sent.set()
            try:
                await asyncio.Event().wait()  # etcd does not answer
            except asyncio.CancelledError:
                cancelled.set()
                raise

        link.client.transaction = transaction  # type: ignore[method-assign]
        # Broker 1, with an empty log, is proposed for the ISR; the leader
        # then gets LEO records.
        manager.replicas.on_follower_fetch(TOPIC, 0, 1, 0)
        replication = manager.replicas.replication(TOPIC, 0)
        assert replication is not None and replication.isr_change_pending
        await asyncio.wait_for(sent.wait(), WAIT_S)
        data = bytearray(encode_batch([b"v%d" % i for i in range(LEO)]))
        manager.partition_log(TOPIC, 0).append(data, list(iter_batches(data)))

        await link.stop()
        assert cancelled.is_set(), "the ISR write outlived the broker's stop"
        # Its outcome is unknown: the HW still waits for broker 1.
        assert replication.isr_change_pending
        manager.replicas.on_follower_fetch(TOPIC, 0, 1, 0)
        assert replication.high_watermark == 0

    run_leader(etcd, tmp_path, scenario)


def test_an_isr_write_after_the_leader_lost_its_registration_is_refused(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    async def scenario(manager: PartitionManager, link: ClusterLink) -> None:
        client, keys = link.client, link.keys
        real_transaction = client.transaction
        answers: list[bool] = []
        write_isr = manager.replicas.isr_writer
        assert write_isr is not None

        async def answered_write_isr(*args: Any) -> bool:
            answers.append(await write_isr(*args))
            return answers[-1]

        async def transaction(*args: Any, **kwargs: Any) -> Any:
            # The leader's lease expires between its check and the write.
            client.transaction = real_transaction  # type: ignore[method-assign]
            await client.delete(keys.broker(0))
            return await real_transaction(*args, **kwargs)

        manager.replicas.isr_writer = answered_write_isr
        client.transaction = transaction  # type: ignore[method-assign]
        manager.replicas.on_follower_fetch(TOPIC, 0, 1, 0)
        await eventually(lambda: bool(answers), "the ISR writer answers")
        assert answers == [False]
        state = await client.get(keys.partition_state(TOPIC, 0))
        assert state is not None and PartitionState.decode(state.value).isr == (0,)

    run_leader(etcd, tmp_path, scenario)
