"""Session and Election (tidelog_server.etcd) against a real etcd.

A session ends (`lost`) when etcd says its lease is gone, and the leadership
bound to it ends with it; a candidate waits for its predecessor only, so a
deletion wakes the next candidate and nobody else; a leader's fenced write
fails once its key is gone; a re-campaign keeps its place with a new value.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aetcd
from tidelog_server.etcd import Election, ElectionKeyLostError, Session, connect

from tests.support.etcd import EtcdProcess

#: Generous: a loaded 2-core CI machine can stall for seconds.
DEADLINE_S = 15.0
TTL_S = 2


@asynccontextmanager
async def etcd_client(etcd: EtcdProcess) -> AsyncIterator[aetcd.Client]:
    client = connect(etcd.endpoint)
    try:
        yield client
    finally:
        await client.close()


class CountingElection(Election):
    """Counts how often the candidate looks for its predecessor (one look
    per wake-up)."""

    looks = 0

    async def _predecessor(self) -> tuple[bytes, int] | None:
        self.looks += 1
        return await super()._predecessor()


async def candidates_under(client: aetcd.Client, prefix: bytes) -> list[bytes]:
    listing = await client.get_prefix(prefix, sort_order="ascend", sort_target="create")
    return [kv.key for kv in listing]


async def until(check: asyncio.Future[object] | asyncio.Task[object], what: str) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(check), DEADLINE_S)
    except TimeoutError:
        raise AssertionError(f"not within {DEADLINE_S} s: {what}") from None


def test_a_session_keeps_its_lease_alive_past_its_ttl(etcd: EtcdProcess, prefix: bytes) -> None:
    async def run() -> None:
        async with etcd_client(etcd) as client:
            session = await Session.create(client, TTL_S)
            try:
                await client.put(prefix + b"k", b"v", lease=session.lease_id)
                await asyncio.sleep(TTL_S * 2)
                assert await client.get(prefix + b"k") is not None
                assert session.valid() and not session.lost.is_set()
            finally:
                await session.close()
            # close() revokes: the key goes at once.
            assert await client.get(prefix + b"k") is None

    asyncio.run(run())


def test_losing_the_lease_ends_the_session_and_the_leadership(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    async def run() -> None:
        async with etcd_client(etcd) as client, etcd_client(etcd) as other:
            session = await Session.create(client, TTL_S)
            try:
                election = Election(session, prefix)
                await asyncio.wait_for(election.campaign(b"me"), DEADLINE_S)
                assert await election.is_leader()
                assert await Election.leader(client, prefix) == b"me"

                await other.revoke_lease(session.lease_id)  # etcd ends the lease
                lost = asyncio.ensure_future(session.lost.wait())
                await until(lost, "the session to notice its lease is gone")
                assert not session.valid()
                assert not await election.is_leader()
                assert await Election.leader(client, prefix) is None
                tx = client.transactions
                ok, _ = await client.transaction(
                    compare=[election.leader_compare()],
                    success=[tx.put(prefix + b"fenced", b"x")],
                    failure=[],
                )
                assert not ok and await client.get(prefix + b"fenced") is None
            finally:
                await session.close()

    asyncio.run(run())


def test_a_deposed_leaders_fenced_write_fails_and_the_next_one_leads(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    async def run() -> None:
        async with etcd_client(etcd) as client:
            first = await Session.create(client, TTL_S)
            second = await Session.create(client, TTL_S)
            try:
                old = Election(first, prefix)
                await asyncio.wait_for(old.campaign(b"old"), DEADLINE_S)
                new = Election(second, prefix)
                waiting = asyncio.ensure_future(new.campaign(b"new"))
                await asyncio.sleep(0.3)
                assert not waiting.done()

                # The old leader's key goes (as after a pause longer than its
                # TTL) while its session object does not know yet.
                await client.delete(old.key)
                await until(waiting, "the next candidate to lead")
                tx = client.transactions
                ok, _ = await client.transaction(
                    compare=[old.leader_compare()],
                    success=[tx.put(prefix + b"data", b"from the old leader")],
                    failure=[],
                )
                assert not ok
                ok, _ = await client.transaction(
                    compare=[new.leader_compare()],
                    success=[tx.put(prefix + b"data", b"from the new leader")],
                    failure=[],
                )
                assert ok
                got = await client.get(prefix + b"data")
                assert got is not None and got.value == b"from the new leader"
                # Campaigning on with the key gone says so, not "you lead".
                try:
                    await old._predecessor()
                except ElectionKeyLostError:
                    pass
                else:
                    raise AssertionError("a candidate without its key still campaigns")
            finally:
                await first.close()
                await second.close()

    asyncio.run(run())


def test_a_deletion_wakes_only_the_candidate_right_after_it(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    async def run() -> None:
        async with etcd_client(etcd) as client:
            sessions = [await Session.create(client, TTL_S) for _ in range(4)]
            try:
                elections = [CountingElection(s, prefix) for s in sessions]
                await asyncio.wait_for(elections[0].campaign(b"0"), DEADLINE_S)
                waiting = {}
                for i in (1, 2, 3):
                    waiting[i] = asyncio.ensure_future(elections[i].campaign(str(i).encode()))
                    # One at a time, so that create revisions follow i.
                    while len(await candidates_under(client, prefix)) < i + 1:
                        await asyncio.sleep(0.02)
                while any(elections[i].looks < 1 for i in (1, 2, 3)):
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.3)
                assert [elections[i].looks for i in (1, 2, 3)] == [1, 1, 1]

                # Candidate 1 gives up: only candidate 2 (watching it) wakes,
                # finds candidate 0 before it and waits again.
                waiting[1].cancel()
                await client.delete(elections[1].key)
                while elections[2].looks < 2:
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.5)
                assert elections[2].looks == 2 and not waiting[2].done()
                assert elections[3].looks == 1 and not waiting[3].done()

                # The leader resigns: candidate 2 leads, candidate 3 sleeps on.
                await elections[0].resign()
                await until(waiting[2], "candidate 2 to lead")
                await asyncio.sleep(0.5)
                assert elections[3].looks == 1 and not waiting[3].done()
                assert await Election.leader(client, prefix) == b"2"
                waiting[3].cancel()
            finally:
                for session in sessions:
                    await session.close()

    asyncio.run(run())


def test_a_wake_reads_only_the_predecessor_not_every_candidate(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    """Five candidates of 1 MiB each are more than one gRPC reply may carry
    (4 MiB): a candidate that listed the prefix could not campaign at all."""

    async def run() -> None:
        big = b"x" * (1024 * 1024)
        async with etcd_client(etcd) as client:
            sessions = [await Session.create(client, TTL_S) for _ in range(6)]
            try:
                elections = [Election(s, prefix) for s in sessions]
                await asyncio.wait_for(elections[0].campaign(b"leader" + big), DEADLINE_S)
                tasks = []
                for i, election in enumerate(elections[1:], start=1):
                    tasks.append(asyncio.ensure_future(election.campaign(b"%d" % i + big)))
                    while len(await candidates_under_keys(client, prefix)) < i + 1:
                        await asyncio.sleep(0.02)
                await asyncio.sleep(0.5)
                for task in tasks:
                    assert not task.done(), task.exception()
                leader = await Election.leader(client, prefix)
                assert leader is not None and leader.startswith(b"leader")
                await elections[0].resign()
                await until(tasks[0], "candidate 1 to lead")
                assert not any(task.done() for task in tasks[1:])
                for task in tasks[1:]:
                    task.cancel()
            finally:
                for session in sessions:
                    await session.close()

    asyncio.run(run())


async def candidates_under_keys(client: aetcd.Client, prefix: bytes) -> list[bytes]:
    listing = await client.get_prefix(prefix, keys_only=True)
    return [kv.key for kv in listing]


def test_campaigning_again_with_a_new_value_keeps_the_place_and_updates_the_value(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    async def run() -> None:
        async with etcd_client(etcd) as client:
            first = await Session.create(client, TTL_S)
            second = await Session.create(client, TTL_S)
            try:
                leader = Election(first, prefix)
                await asyncio.wait_for(leader.campaign(b"v1"), DEADLINE_S)
                revision = leader.create_revision
                candidate = Election(second, prefix)
                waiting = asyncio.ensure_future(candidate.campaign(b"c1"))
                await asyncio.sleep(0.3)

                # The leader campaigns again on the same session (a retry
                # after an error) with a new value: still first, new value.
                await asyncio.wait_for(leader.campaign(b"v2"), DEADLINE_S)
                assert leader.create_revision == revision
                assert await Election.leader(client, prefix) == b"v2"
                assert await candidates_under(client, prefix) == [leader.key, candidate.key]

                # The waiting candidate does the same: its value changes, its
                # place (behind the leader) does not.
                waiting.cancel()
                again = asyncio.ensure_future(candidate.campaign(b"c2"))
                await asyncio.sleep(0.3)
                assert not again.done()
                stored = await client.get(candidate.key)
                assert stored is not None and stored.value == b"c2"
                await leader.resign()
                await until(again, "the candidate to lead")
                assert await Election.leader(client, prefix) == b"c2"
            finally:
                await first.close()
                await second.close()

    asyncio.run(run())
