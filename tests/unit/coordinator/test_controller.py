"""ReplicaLifecycle (tidelog_coordinator.controller) against a real etcd.

A retry of the lifecycle loop (here: a waiting candidate's watch cut by an
etcd restart) must not leave a second candidacy behind: the replica keeps
its session and its place, so when the controller goes, it takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from tidelog_coordinator.config import CoordinatorConfig
from tidelog_coordinator.controller import ReplicaLifecycle
from tidelog_coordinator.group_coordinator import GroupCoordinator
from tidelog_coordinator.offset_store import OffsetStore
from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys

from tests.support.etcd import EtcdProcess

#: Generous: a loaded 2-core CI machine can stall for seconds.
DEADLINE_S = 20.0


def lifecycle(endpoint: str, prefix: str, replica: str) -> ReplicaLifecycle:
    # A TTL well above what an etcd restart takes on a loaded machine: the
    # test is about a retried campaign, not about a lost lease (close()
    # revokes the lease, so a hand-over does not wait for it).
    client = connect(endpoint)
    keys = Keys(prefix)
    config = CoordinatorConfig(etcd_prefix=prefix, coordinator_id=replica, session_ttl_s=10)
    groups = GroupCoordinator(client, keys, lambda: False, lambda: 0)
    offsets = OffsetStore(client, keys, config, groups)
    return ReplicaLifecycle(client, keys, config, "127.0.0.1", 1, offsets)


async def eventually(check: object, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not await check():  # type: ignore[operator]
        if loop.time() > deadline:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        await asyncio.sleep(0.05)


async def stop(replicas: list[ReplicaLifecycle], tasks: list[asyncio.Task[None]]) -> None:
    """Cancel, close; bounded, so that a failing test fails instead of hanging.
    A cancelled lifecycle must end (stopping a coordinator waits for it)."""
    for task in tasks:
        task.cancel()
    _, pending = await asyncio.wait(tasks, timeout=DEADLINE_S)
    for replica in replicas:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(replica.close(), DEADLINE_S)
            await asyncio.wait_for(replica.client.close(), DEADLINE_S)
    assert not pending, f"cancelled lifecycles still running: {pending}"


def test_a_retried_campaign_leaves_no_phantom_candidate(tmp_path: Path) -> None:
    etcd = EtcdProcess.start(tmp_path / "etcd")

    async def run() -> None:
        prefix = "/controller-retry"
        first = lifecycle(etcd.endpoint, prefix, "c0")
        second = lifecycle(etcd.endpoint, prefix, "c1")
        election_prefix = first.keys.election
        tasks = [asyncio.create_task(first.run())]
        try:
            await asyncio.wait_for(first.elected.wait(), DEADLINE_S)
            tasks.append(asyncio.create_task(second.run()))

            async def candidates() -> list[bytes]:
                return [kv.key for kv in await first.client.get_prefix(election_prefix)]

            async def both_campaign() -> bool:
                return second.election is not None and len(await candidates()) == 2

            await eventually(both_campaign, "the second replica to stand as a candidate")
            campaign = second.election

            # The second replica's watch on its predecessor is cut: its
            # campaign fails and the lifecycle loop retries.
            await asyncio.to_thread(etcd.restart)

            async def campaigned_again() -> bool:
                election = second.election
                return (
                    election is not campaign
                    and election is not None
                    and election.create_revision != 0
                    and not first.session.lost.is_set()  # type: ignore[union-attr]
                )

            await eventually(campaigned_again, "the second replica to campaign again")
            await asyncio.sleep(1.0)  # let any extra candidacy show up
            assert len(await candidates()) == 2, await candidates()

            # The controller goes: the second replica takes over.
            await first.close()
            await asyncio.wait_for(second.elected.wait(), DEADLINE_S)
            assert await candidates() == [second.election.key]  # type: ignore[union-attr]
        finally:
            await stop([first, second], tasks)

    try:
        asyncio.run(run())
    finally:
        etcd.stop()


def test_close_ends_the_loop_instead_of_starting_a_new_session(tmp_path: Path) -> None:
    etcd = EtcdProcess.start(tmp_path / "etcd")

    async def run() -> None:
        replica = lifecycle(etcd.endpoint, "/controller-close", "c0")
        task = asyncio.create_task(replica.run())
        try:
            await asyncio.wait_for(replica.elected.wait(), DEADLINE_S)
            await replica.close()
            await asyncio.wait_for(task, DEADLINE_S)  # run() returns
            listing = await replica.client.get_prefix(b"/controller-close/")
            assert [kv.key for kv in listing] == []
        finally:
            await stop([replica], [task])

    try:
        asyncio.run(run())
    finally:
        etcd.stop()
