"""A partition whose new state lost a race against its leader's own write
(an ISR change written between the controller's read and its transaction)
is decided again by a quick pass of `LeaderElector.run`, not by the next
pass that a broker change or PASS_INTERVAL_S brings; and a leader that
writes on every pass makes at most CONFLICT_REPASSES_MAX quick passes.

Real etcd, a real LeaderElector running; the leader's write is a real etcd
put made after the pass read the partition states. PASS_INTERVAL_S is made
so large that no timed pass can run during the test: a pass after the first
one comes from the conflict alone (there is no broker change after the
first listing, and the events say so).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tidelog_coordinator import leader_election
from tidelog_coordinator.leader_election import LeaderElector
from tidelog_server.etcd import WatchBatch
from tidelog_server.etcd.records import PartitionState

from tests.support.etcd import EtcdProcess
from tests.unit.coordinator.partition_states import (
    cluster_in_etcd,
    preferred_leaders,
    read_states,
)

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
PARTITIONS = 3
DEAD = 0
ALIVE = (1, 2)
#: Led by broker 1, which is alive: its leader writes its ISR.
CONFLICTED = 1
#: Generous: a quick pass comes tens of milliseconds after the conflict.
DEADLINE_S = 20.0
#: No timed pass within the test.
NEVER_S = 3600.0


def isr_write_by_the_leader(version: int) -> PartitionState:
    """Broker 1 drops lagging broker 2 from CONFLICTED's ISR; it has not
    noticed that broker 0 died (a follower's lag shows only after
    replica.lag.time.max.ms), so 0 stays in the ISR it writes."""
    return PartitionState(leader=1, leader_epoch=1, isr=(1, DEAD), version=version)


def run_elector(
    etcd: EtcdProcess, prefix: bytes, conflicting_passes: int, passes: int
) -> tuple[list[str], list[PartitionState]]:
    """Broker DEAD is gone; `LeaderElector.run` until `passes` passes ended
    (or DEADLINE_S), the leader of CONFLICTED writing its ISR during each of
    the first `conflicting_passes` passes. Returns the events in order and
    the partition states after."""

    async def run() -> tuple[list[str], list[PartitionState]]:
        leaders = preferred_leaders(PARTITIONS)
        async with cluster_in_etcd(etcd.endpoint, prefix, TOPIC, leaders, ALIVE) as (client, keys):
            elector = LeaderElector(client, keys, preferred_interval_ms=0)
            events: list[str] = []
            started = ended = 0

            real_get_prefix = client.get_prefix

            async def get_prefix_then_leader_writes(key: bytes, **kwargs: Any) -> Any:
                found = await real_get_prefix(key, **kwargs)
                if key == keys.all_partition_states and started <= conflicting_passes:
                    state = isr_write_by_the_leader(version=2 + started)
                    await client.put(keys.partition_state(TOPIC, CONFLICTED), state.encode())
                    events.append("leader writes its ISR")
                return found

            client.get_prefix = get_prefix_then_leader_writes

            real_on_brokers = elector._on_brokers

            async def on_brokers(batch: WatchBatch) -> None:
                events.append("brokers listed" if batch.reset else "brokers changed")
                await real_on_brokers(batch)

            elector._on_brokers = on_brokers  # type: ignore[method-assign]

            real_elect_once = elector.elect_once

            async def counted_elect_once(fence: Any, preferred: bool) -> int:
                nonlocal started, ended
                started += 1
                events.append(f"pass {started}")
                written = await real_elect_once(fence, preferred)
                ended += 1
                events.append(f"pass {started} wrote {written}")
                return written

            elector.elect_once = counted_elect_once  # type: ignore[method-assign]

            task = asyncio.create_task(elector.run(fence=None))
            try:
                try:
                    async with asyncio.timeout(DEADLINE_S):
                        while ended < passes:
                            await asyncio.sleep(0.02)
                except TimeoutError:
                    pytest.fail(f"{passes} passes did not end within {DEADLINE_S} s: {events}")
                if conflicting_passes >= passes:
                    # No more quick passes come after the bound: wait longer
                    # than the longest quick delay, and see none start.
                    quick = leader_election.CONFLICT_REPASSES_MAX
                    longest_s = leader_election.CONFLICT_REPASS_DELAY_S * 2 ** (quick - 1)
                    await asyncio.sleep(2 * longest_s)
            finally:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            return events, await read_states(client, keys, TOPIC, PARTITIONS)

    return asyncio.run(run())


def test_a_state_that_changed_during_a_pass_is_decided_by_a_quick_pass(
    etcd: EtcdProcess, prefix: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leader_election, "PASS_INTERVAL_S", NEVER_S)

    events, states = run_elector(etcd, prefix, conflicting_passes=1, passes=2)

    # The first pass elects partition 0's new leader and drops DEAD from
    # partition 2's ISR; CONFLICTED's write lost to the leader's. The second
    # pass follows without any broker change, the timed pass far away.
    assert events == [
        "brokers listed",
        "pass 1",
        "leader writes its ISR",
        f"pass 1 wrote {PARTITIONS - 1}",
        "pass 2",
        "pass 2 wrote 1",
    ]
    # Decided from the leader's state: its ISR shrink kept, DEAD out.
    assert states[CONFLICTED] == PartitionState(leader=1, leader_epoch=1, isr=(1,), version=4)
    assert all(s.leader in ALIVE and DEAD not in s.isr for s in states)


def test_a_leader_writing_on_every_pass_gets_a_bounded_number_of_quick_passes(
    etcd: EtcdProcess, prefix: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leader_election, "PASS_INTERVAL_S", NEVER_S)
    quick = leader_election.CONFLICT_REPASSES_MAX

    events, states = run_elector(etcd, prefix, conflicting_passes=100, passes=1 + quick)

    # Every pass lost CONFLICTED's write; after `quick` quick passes the
    # controller waits for a broker change or the timed pass, as before.
    passes = [e for e in events if e.startswith("pass ") and "wrote" not in e]
    assert len(passes) == 1 + quick, events
    assert events.count("leader writes its ISR") == 1 + quick
    assert "brokers changed" not in events
    assert DEAD in states[CONFLICTED].isr
