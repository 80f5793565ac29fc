"""The controller's election pass (LeaderElector.elect_once) against a real
etcd: the partitions of a broker that died get new leaders in transactions
of up to etcd's --max-txn-ops states each, not one transaction per
partition (10,000 partitions, one at a time, kept the partitions whose only
in-sync replica had come back offline for ~30 s in the fuzzer's cluster);
a partition whose state changes meanwhile does not hold back the others,
and the pass names it (run() then passes again soon:
test_leader_election_conflict).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import Any

from tidelog_coordinator.leader_election import DEFAULT_MAX_TXN_OPS, LeaderElector
from tidelog_server.etcd.keys import Keys
from tidelog_server.etcd.records import PartitionState

from tests.support.etcd import EtcdProcess
from tests.unit.coordinator.partition_states import (
    CountingClient,
    cluster_in_etcd,
    preferred_leaders,
    read_states,
)

PARTITIONS = 600
DEAD = 0
ALIVE = (1, 2)


Pass = tuple[int, Counter[str], list[PartitionState], tuple[str, ...]]


def run_pass(etcd: EtcdProcess, prefix: bytes, before: Any = None, deposed: bool = False) -> Pass:
    """Broker DEAD led a third of PARTITIONS and is gone; one pass. `before`
    (client, keys) runs after the pass read the states and before it writes;
    `deposed`: the pass's controller fence fails. Returns the states written,
    the etcd calls, the states after and the pass's `conflicted`."""

    async def run() -> Pass:
        leaders = preferred_leaders(PARTITIONS)
        async with cluster_in_etcd(etcd.endpoint, prefix, "big", leaders, ALIVE) as (raw, keys):
            counting = CountingClient(raw)
            elector = LeaderElector(counting, keys, preferred_interval_ms=0)  # type: ignore[arg-type]
            if before is not None:
                real_get_prefix = raw.get_prefix

                async def get_prefix_then_interfere(key: bytes, **kwargs: Any) -> Any:
                    found = await real_get_prefix(key, **kwargs)
                    if key == keys.all_partition_states:
                        await before(raw, keys)
                    return found

                raw.get_prefix = get_prefix_then_interfere
            fence = None
            if deposed:
                fence = raw.transactions.value(keys.election + b"gone") == b"me"
            written = await elector.elect_once(fence, preferred=False)
            states = await read_states(raw, keys, "big", PARTITIONS)
            return written, counting.calls, states, elector.conflicted

    return asyncio.run(run())


def test_a_dead_brokers_partitions_get_new_leaders_in_a_few_transactions(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    written, calls, states, conflicted = run_pass(etcd, prefix)

    # Every partition changes: the dead broker leaves each ISR, and leads a third.
    assert written == PARTITIONS
    assert all(s.leader in ALIVE and DEAD not in s.isr for s in states)
    led_by_dead = [s for p, s in enumerate(states) if preferred_leaders(PARTITIONS)[p] == DEAD]
    assert all(s.leader_epoch == 2 for s in led_by_dead)
    transactions = math.ceil(PARTITIONS / (DEFAULT_MAX_TXN_OPS - 1))
    assert calls == {"get_prefix": 3, "transaction": transactions}, calls
    assert conflicted == ()


def test_a_state_changed_meanwhile_is_skipped_and_the_rest_written(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    changed = 0  # first in key order: in the first, full, batch
    by_the_leader = PartitionState(leader=1, leader_epoch=1, isr=(1,), version=2)

    async def leader_shrinks_its_isr(client: Any, keys: Keys) -> None:
        await client.put(keys.partition_state("big", changed), by_the_leader.encode())

    written, calls, states, conflicted = run_pass(etcd, prefix, before=leader_shrinks_its_isr)

    assert written == PARTITIONS - 1
    assert states[changed] == by_the_leader  # the next pass decides again
    assert conflicted == (f"big-{changed}",)  # which run() passes again soon
    assert all(DEAD not in s.isr for p, s in enumerate(states) if p != changed)
    # The batch holding it failed and was written partition by partition.
    batch = DEFAULT_MAX_TXN_OPS - 1
    transactions = math.ceil(PARTITIONS / batch) + batch
    assert calls == {"get_prefix": 3, "transaction": transactions}, calls


def test_a_deposed_controller_stops_at_its_first_failed_batch(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    written, calls, states, conflicted = run_pass(etcd, prefix, deposed=True)

    assert written == 0
    assert all(DEAD in s.isr for s in states)
    # The first batch, then the fence alone: not one transaction per partition.
    assert calls == {"get_prefix": 3, "transaction": 2}, calls
    assert conflicted == ()  # not the controller: nothing to pass again for
