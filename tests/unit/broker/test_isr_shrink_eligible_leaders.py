"""A leader's ISR shrink below min.insync.replicas keeps the members it
removes as eligible leader replicas (PartitionState.elr, Kafka's KIP-966),
and an acks=all record passed by the HW only after that shrink is not
acknowledged: it is answered NOT_ENOUGH_REPLICAS_AFTER_APPEND at once (as
Kafka's DelayedProduce), and the idempotent producer's retry of it is
refused before the append while the ISR is short, then, once the ISR is
back at min.insync.replicas, answered with the original offsets: the ELR
members, which may lead, hold every acknowledged record.

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

import pytest
from tidelog.errors import NotEnoughReplicasAfterAppendError, NotEnoughReplicasError
from tidelog.records import encode_batch
from tidelog_server.etcd.records import PartitionState, TopicAssignment

from tests.support.etcd import EtcdProcess
from tests.unit.broker.in_process_broker import InProcessBroker, eventually
from tests.unit.broker.test_isr_write_against_applied_state import register

TOPIC = "t"
LEO = 10
PRODUCER_ID = 7
#: The acks=all wait's timeout: the answer must come well before it.
REQUEST_TIMEOUT_S = 60


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
            # An idempotent producer's batch, appended with the ISR at
            # min.insync.replicas; broker 1 has none of it.
            data = encode_batch(
                [b"v%d" % i for i in range(LEO)],
                producer_id=PRODUCER_ID,
                producer_epoch=0,
                base_sequence=0,
            )
            appended = manager.append(TOPIC, 0, data, acks=-1)
            assert (appended.base_offset, appended.last_offset) == (0, LEO - 1)

            def acks_all(last_offset: int) -> asyncio.Future[None]:
                return asyncio.ensure_future(
                    manager.replicas.wait_for_high_watermark(
                        TOPIC, 0, last_offset, 1, REQUEST_TIMEOUT_S
                    )
                )

            acked = acks_all(appended.last_offset)

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
            # eligible to lead, lacks them: they are not acknowledged, and
            # the producer hears so now, not at the request timeout.
            assert leader.high_watermark == LEO
            with pytest.raises(NotEnoughReplicasAfterAppendError) as after_append:
                await asyncio.wait_for(acked, REQUEST_TIMEOUT_S / 3)
            assert after_append.value.code_name == "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
            assert after_append.value.retriable
            for named in ("t-0", "[0]", "min.insync.replicas 2"):
                assert named in after_append.value.message, after_append.value.message

            # The producer's retry, while the ISR is short: refused before
            # the append, nothing written twice.
            with pytest.raises(NotEnoughReplicasError):
                manager.append(TOPIC, 0, data, acks=-1)
            assert manager.partition_log(TOPIC, 0).log_end_offset == LEO

            # Broker 1 catches up and joins: the ISR is at 2, no ELR.
            manager.replicas.on_follower_fetch(TOPIC, 0, 1, LEO)
            await eventually(lambda: leader.isr == [0, 1], "broker 1 joins the ISR")
            expanded = await state()
            assert expanded.isr == (0, 1) and expanded.elr == ()
            # The retry now: a duplicate, acknowledged with the original
            # offsets, written once.
            retried = manager.append(TOPIC, 0, data, acks=-1)
            assert (retried.base_offset, retried.last_offset) == (0, LEO - 1)
            assert manager.partition_log(TOPIC, 0).log_end_offset == LEO
            await asyncio.wait_for(acks_all(retried.last_offset), REQUEST_TIMEOUT_S / 3)
        finally:
            if checks is not None:
                checks.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await checks
            await broker.stop()

    asyncio.run(run())
