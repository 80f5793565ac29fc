"""Several etcd endpoints (tidelog_server.etcd.client.EtcdClient) against a
real three-member etcd cluster with one member SIGKILLed.

The client uses the first member given; when it dies, reads, writes that
never left the process, lease keep-alives and watches move to the next one:
a session keeps its lease (and the keys bound to it), a prefix watch misses
no change, an election is still read. Each test starts its own cluster
(a killed member stays dead).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aetcd.exceptions
import pytest
from tidelog_server.etcd import (
    Election,
    EtcdClient,
    PrefixWatcher,
    Session,
    WatchBatch,
    connect,
    is_unavailable,
    parse_endpoints,
)
from tidelog_server.etcd.client import MAX_ENDPOINTS, EtcdEndpointError

from tests.support.etcd import EtcdCluster

#: Generous: a loaded 2-core CI machine can stall for seconds.
DEADLINE_S = 20.0
TTL_S = 2
# A hung member is noticed only by a keep-alive's deadline (TTL/3), and the
# move to another member must then land within the rest of the TTL: 2 s
# leaves ~1.3 s, too little on a loaded 2-core machine (seen lost in CI).
HUNG_MEMBER_TTL_S = 6
PREFIX = b"/endpoints/"


@pytest.fixture
def etcd3(tmp_path: Path) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster.start(tmp_path / "etcd", members=3)
    try:
        yield cluster
    finally:
        cluster.stop()


@asynccontextmanager
async def client_of(endpoints: str) -> AsyncIterator[EtcdClient]:
    client = connect(endpoints)
    try:
        yield client
    finally:
        await client.close()


async def retrying(write: Callable[[], Awaitable[object]]) -> None:
    """A write as the services make it: retried after an unavailable error
    (a write forwarded to a leader that just died has an unknown outcome, so
    the client raises it rather than retrying it itself)."""
    async with asyncio.timeout(DEADLINE_S):
        while True:
            try:
                await write()
                return
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                await asyncio.sleep(0.1)


def survivors(cluster: EtcdCluster) -> str:
    """The members still alive (for a second client that checks)."""
    return ",".join(m.endpoint for m in cluster.members if m.proc is not None)


# ------------------------------------------------------------ parsing


def test_endpoints_parse_as_a_comma_separated_list_and_one_address_still_works() -> None:
    assert parse_endpoints("127.0.0.1:2379") == [("127.0.0.1", 2379)]
    assert parse_endpoints("etcd-0.etcd:2379, etcd-1.etcd:2379,http://etcd-2.etcd:2379") == [
        ("etcd-0.etcd", 2379),
        ("etcd-1.etcd", 2379),
        ("etcd-2.etcd", 2379),
    ]


@pytest.mark.parametrize(
    "text", ["", "host", "host:", ":2379", "a:1,,b:2", "a:1,", "host:99999", "host:port"]
)
def test_bad_endpoints_are_refused_with_the_value_named(text: str) -> None:
    with pytest.raises(EtcdEndpointError, match="host:port"):
        parse_endpoints(text)


def test_the_number_of_endpoints_is_bounded() -> None:
    many = ",".join(f"h{i}:2379" for i in range(MAX_ENDPOINTS + 1))
    with pytest.raises(EtcdEndpointError, match="MAX_ENDPOINTS"):
        parse_endpoints(many)


# ------------------------------------------------------------ fail-over


#: The member the client uses is the raft leader (the survivors must also
#: elect a new one) or a follower.
ROLES = pytest.mark.parametrize("role", ["leader", "follower"])


def lead(cluster: EtcdCluster, role: str) -> None:
    cluster.make_leader(0 if role == "leader" else 1)


@ROLES
def test_reads_and_writes_move_to_a_live_member_when_the_first_dies(
    etcd3: EtcdCluster, role: str
) -> None:
    lead(etcd3, role)

    async def run() -> None:
        async with client_of(etcd3.endpoint) as client:
            await client.put(PREFIX + b"before", b"1")
            assert client.endpoint == etcd3.members[0].endpoint
            etcd3.kill(0)
            # The first read after the death: no error reaches the caller,
            # even when the dead member led the cluster (the read waits out
            # the election on the next members).
            assert (await client.get(PREFIX + b"before")).value == b"1"
            await retrying(lambda: client.put(PREFIX + b"after", b"2"))
            assert client.endpoint != etcd3.members[0].endpoint
        async with client_of(survivors(etcd3)) as other:
            assert (await other.get(PREFIX + b"after")).value == b"2"

    asyncio.run(run())


@ROLES
def test_a_session_keeps_its_lease_when_its_member_dies(etcd3: EtcdCluster, role: str) -> None:
    lead(etcd3, role)

    async def run() -> None:
        async with client_of(etcd3.endpoint) as client:
            session = await Session.create(client, TTL_S)
            await client.put(PREFIX + b"registration", b"me", lease=session.lease_id)
            etcd3.kill(0)
            # Several TTLs: the keep-alive must have moved to a live member.
            await asyncio.sleep(TTL_S * 3)
            assert not session.lost.is_set() and session.valid()
            async with client_of(survivors(etcd3)) as other:
                kv = await other.get(PREFIX + b"registration")
                assert kv is not None and kv.lease == session.lease_id
                info = await other.get_lease_info(session.lease_id)
                assert info.TTL > 0
            await session.close()

    asyncio.run(run())


@ROLES
def test_a_session_keeps_its_lease_when_its_member_hangs(etcd3: EtcdCluster, role: str) -> None:
    """A member that stops answering (SIGSTOP: no error, no reset, only
    silence) is left after one keep-alive deadline (TTL/3), well before the
    lease could expire."""
    lead(etcd3, role)

    async def run() -> None:
        async with client_of(etcd3.endpoint) as client:
            session = await Session.create(client, HUNG_MEMBER_TTL_S)
            await client.put(PREFIX + b"registration", b"me", lease=session.lease_id)
            hung = etcd3.members[0]
            assert hung.proc is not None
            os.kill(hung.proc.pid, signal.SIGSTOP)
            try:
                # Past the lease's TTL: it lives only if refreshed elsewhere.
                await asyncio.sleep(HUNG_MEMBER_TTL_S * 1.5)
                assert not session.lost.is_set() and session.valid()
                async with client_of(survivors_but(etcd3, 0)) as other:
                    kv = await other.get(PREFIX + b"registration")
                    assert kv is not None and kv.lease == session.lease_id
                assert client.endpoint != hung.endpoint
            finally:
                os.kill(hung.proc.pid, signal.SIGCONT)
            await session.close()

    asyncio.run(run())


def survivors_but(cluster: EtcdCluster, index: int) -> str:
    return ",".join(m.endpoint for i, m in enumerate(cluster.members) if i != index)


def test_a_prefix_watch_resumes_on_a_live_member_without_missing_a_change(
    etcd3: EtcdCluster,
) -> None:
    async def run() -> None:
        seen: dict[bytes, bytes | None] = {}
        arrived = asyncio.Event()

        async def on_batch(batch: WatchBatch) -> None:
            for change in batch.changes:
                seen[change.key] = change.value
            if PREFIX + b"k3" in seen:
                arrived.set()

        async with client_of(etcd3.endpoint) as client:
            watcher = PrefixWatcher(client, PREFIX, on_batch, name="test")
            task = asyncio.create_task(watcher.run())
            try:
                await asyncio.wait_for(watcher.synced.wait(), DEADLINE_S)
                async with client_of(survivors(etcd3)) as writer:
                    await writer.put(PREFIX + b"k1", b"1")
                    etcd3.kill(0)
                async with client_of(survivors(etcd3)) as writer:
                    await retrying(lambda: writer.put(PREFIX + b"k2", b"2"))
                    await retrying(lambda: writer.put(PREFIX + b"k3", b"3"))
                await asyncio.wait_for(arrived.wait(), DEADLINE_S)
                assert seen == {PREFIX + b"k1": b"1", PREFIX + b"k2": b"2", PREFIX + b"k3": b"3"}
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())


async def campaign_until_elected(election: Election, value: bytes) -> None:
    """As the coordinator's controller does: a cut watch (the member died)
    ends the campaign with an unavailable error, and it is campaigned again."""
    while True:
        try:
            await election.campaign(value)
            return
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            await asyncio.sleep(0.1)


def test_an_election_is_read_and_won_after_a_member_dies(etcd3: EtcdCluster) -> None:
    async def run() -> None:
        async with client_of(etcd3.endpoint) as first, client_of(etcd3.endpoint) as second:
            one = Election(await Session.create(first, TTL_S), PREFIX + b"election/")
            two = Election(await Session.create(second, TTL_S), PREFIX + b"election/")
            await asyncio.wait_for(one.campaign(b"one"), DEADLINE_S)
            waiting = asyncio.create_task(campaign_until_elected(two, b"two"))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            etcd3.kill(0)
            # The raw range read (limit, sort by create revision) fails over too.
            assert await Election.leader(second, PREFIX + b"election/") == b"one"
            await retrying(one.resign)
            # The waiting candidate campaigned again on a live member (same
            # key, same place) and saw the deletion there.
            await asyncio.wait_for(waiting, DEADLINE_S)
            assert await two.is_leader()
            await one.session.close()
            await two.session.close()

    asyncio.run(run())


def test_a_write_that_may_have_reached_a_dead_member_is_not_retried(
    etcd3: EtcdCluster,
) -> None:
    """An ambiguous failure of a write (the connection broke after sending)
    fails over but is raised: retrying a transaction could apply it twice."""

    async def run() -> None:
        async with client_of(etcd3.endpoint) as client:
            attempts = 0

            async def broken_mid_flight() -> None:
                nonlocal attempts
                attempts += 1
                raise aetcd.exceptions.ConnectionFailedError("Socket closed")

            with pytest.raises(aetcd.exceptions.ConnectionFailedError):
                await client.call(broken_mid_flight, repeatable=False)
            assert attempts == 1
            assert client.current == 1  # moved on for the next call
            attempts = 0
            with pytest.raises(aetcd.exceptions.ConnectionFailedError):
                await client.call(broken_mid_flight, repeatable=True)
            assert attempts == 3  # once per member, then raised

    asyncio.run(run())


def test_one_endpoint_never_fails_over() -> None:
    client = connect("127.0.0.1:1")
    client.fail_over(client.generation, "test")
    assert client.current == 0 and client.generation == 0
