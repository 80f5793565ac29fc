"""A leader's ISR shrink below min.insync.replicas keeps the members it
removes as eligible leader replicas (PartitionState.elr, Kafka's KIP-966),
and an acks=all record passed by the HW only after that shrink is not
acknowledged until the ISR is back at min.insync.replicas: the ELR members,
which may lead, hold every acknowledged record.

A real ClusterLink on a real etcd leads t-0 (replicas 0, 1, 2; ISR 0, 1;
min.insync.replicas 2); brokers 1 and 2 are registration keys and fetch
through the ReplicaManager; the leader's lag check (run_isr_checks) runs
with replica.lag.time.max.ms of 300 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

from tidelog.records import encode_batch, iter_batches
from tidelog_server.etcd.records import PartitionState, TopicAssignment

from tests.support.etcd import EtcdProcess
from tests.unit.broker.in_process_broker import InProcessBroker, eventually
from tests.unit.broker.test_isr_write_against_applied_state import register

TOPIC = "t"
LEO = 10


def test_a_shrink_below_min_isr_keeps_the_removed_member_eligible(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    async def run() -> None:
        broker = InProcessBroker(
            etcd, f"/elr-{uuid.uuid4().hex}", tmp_path, 0, replica_lag_time_max_ms=300
        )
        manager, link = broker.manager, broker.link
        client, keys = link.client, link.keys
        checks: asyncio.Task[None] | None = None
        try:
            await broker.start()
            await register(link, 1)
            await register(link, 2)
            topic = TopicAssignment(
                TOPIC, uuid.uuid4().hex, ((0, 1, 2),), {"min.insync.replicas": "2"}
            )
            await client.put(keys.topic(TOPIC), topic.encode())
            await client.put(
                keys.partition_state(TOPIC, 0),
                PartitionState(leader=0, leader_epoch=1, isr=(0, 1)).encode(),
            )

            def leading() -> bool:
                r = manager.replicas.replication(TOPIC, 0)
                return r is not None and r.is_leader and link.view.registration_of(2) is not None

            await eventually(leading, "broker 0 leads t-0")
            leader = manager.replicas.replication(TOPIC, 0)
            assert leader is not None
            # Appended with the ISR at min.insync.replicas; broker 1 has none.
            data = bytearray(encode_batch([b"v%d" % i for i in range(LEO)]))
            manager.partition_log(TOPIC, 0).append(data, list(iter_batches(data)))
            acked = asyncio.ensure_future(
                manager.replicas.wait_for_high_watermark(TOPIC, 0, LEO - 1, 1, 60)
            )

            async def state() -> PartitionState:
                got = await client.get(keys.partition_state(TOPIC, 0))
                assert got is not None
                return PartitionState.decode(got.value)

            # Broker 1 lags: the leader shrinks the ISR to [0], below 2.
            checks = asyncio.create_task(manager.replicas.run_isr_checks())
            await eventually(lambda: leader.isr == [0], "the leader shrinks the ISR to [0]")
            checks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checks
            shrunk = await state()
            assert shrunk.isr == (0,)
            assert shrunk.elr == (1,), "the member removed below min ISR is not eligible"
            # The HW passed the records over the ISR [0] alone; broker 1,
            # eligible to lead, lacks them: they are not acknowledged.
            assert leader.high_watermark == LEO
            await asyncio.sleep(0.3)
            assert not acked.done(), "acknowledged with the ISR below min.insync.replicas"

            # Broker 1 catches up and joins: the ISR is at 2, no ELR, acked.
            manager.replicas.on_follower_fetch(TOPIC, 0, 1, LEO)
            await eventually(lambda: leader.isr == [0, 1], "broker 1 joins the ISR")
            expanded = await state()
            assert expanded.isr == (0, 1) and expanded.elr == ()
            await asyncio.wait_for(acked, 20)
        finally:
            if checks is not None:
                checks.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await checks
            await broker.stop()

    asyncio.run(run())
