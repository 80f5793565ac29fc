"""Group commit of offsets (tidelog_coordinator.offset_committer) against a
real etcd: concurrent commits share transactions, each keeps its own fence,
a failed transaction fails every commit in it, the queue is bounded."""

from __future__ import annotations

import asyncio

import pytest
from tidelog.errors import CoordinatorNotAvailableError
from tidelog_coordinator.offset_committer import OffsetCommitter
from tidelog_server.etcd import connect

from tests.support.etcd import EtcdProcess


def _puts(prefix: bytes, name: str, count: int, value: bytes = b"v") -> list[tuple[bytes, bytes]]:
    return [(prefix + f"{name}/{i}".encode(), value) for i in range(count)]


async def _values(client: object, prefix: bytes) -> dict[bytes, bytes]:
    return {kv.key: kv.value for kv in await client.get_prefix(prefix)}  # type: ignore[attr-defined]


def test_concurrent_commits_share_transactions_and_keep_their_own_fence(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    async def run() -> None:
        client = connect(etcd.endpoint)
        committer = OffsetCommitter(client)
        tx = client.transactions
        fence = prefix + b"fence"
        await client.put(fence, b"1")
        holds = tx.version(fence) > 0
        fails = tx.version(fence) == 0
        try:
            results = await asyncio.gather(
                *(
                    committer.submit(holds if i % 3 else fails, _puts(prefix, f"c{i}", 3))
                    for i in range(60)
                )
            )
            assert results == [bool(i % 3) for i in range(60)]
            # Fewer transactions than commits: they were coalesced.
            assert committer.commits == 60
            assert committer.transactions < 60
            stored = await _values(client, prefix + b"c")
            expected = {k for i in range(60) if i % 3 for k, _ in _puts(prefix, f"c{i}", 3)}
            assert set(stored) == expected
        finally:
            await committer.close()
            await client.close()

    asyncio.run(run())


def test_a_failed_transaction_fails_every_commit_in_it(etcd: EtcdProcess, prefix: bytes) -> None:
    async def run() -> None:
        client = connect(etcd.endpoint)
        # The committer believes etcd takes 1000 operations per transaction;
        # this etcd takes 128 (its default), so a batch of 200 commits is
        # refused by etcd as a whole, though each commit alone would pass.
        committer = OffsetCommitter(client, max_txn_ops=1000, coalesce_max=1000)
        tx = client.transactions
        holds = tx.version(prefix + b"none") == 0
        try:
            results = await asyncio.gather(
                *(committer.submit(holds, _puts(prefix, f"c{i}", 1)) for i in range(200)),
                return_exceptions=True,
            )
            assert all(isinstance(r, Exception) for r in results), results
            assert "too many operations" in str(results[0])
            assert await _values(client, prefix) == {}
            # The committer carries on: the next commit is written.
            assert await committer.submit(holds, _puts(prefix, "after", 1))
            assert set(await _values(client, prefix)) == {prefix + b"after/0"}
        finally:
            await committer.close()
            await client.close()

    asyncio.run(run())


def test_commits_of_the_same_key_are_written_in_arrival_order(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    async def run() -> None:
        client = connect(etcd.endpoint)
        committer = OffsetCommitter(client)
        holds = client.transactions.version(prefix + b"none") == 0
        try:
            # etcd refuses a transaction that puts one key twice: each of
            # these must start a new transaction, in order.
            results = await asyncio.gather(
                *(committer.submit(holds, _puts(prefix, "k", 2, str(i).encode())) for i in range(5))
            )
            assert results == [True] * 5
            assert committer.transactions == 5
            assert set((await _values(client, prefix)).values()) == {b"4"}
        finally:
            await committer.close()
            await client.close()

    asyncio.run(run())


def test_a_commit_larger_than_one_transaction_is_written_whole_and_fenced(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    async def run() -> None:
        client = connect(etcd.endpoint)
        committer = OffsetCommitter(client, max_txn_ops=16)
        tx = client.transactions
        try:
            assert await committer.submit(
                tx.version(prefix + b"none") == 0, _puts(prefix, "a", 300)
            )
            assert len(await _values(client, prefix + b"a")) == 300
            assert committer.transactions > 1
            # A failing fence writes nothing, however many transactions.
            assert not await committer.submit(
                tx.version(prefix + b"none") > 0, _puts(prefix, "b", 300)
            )
            assert await _values(client, prefix + b"b") == {}
        finally:
            await committer.close()
            await client.close()

    asyncio.run(run())


def test_a_full_queue_refuses_a_commit_naming_the_limit(etcd: EtcdProcess, prefix: bytes) -> None:
    async def run() -> None:
        client = connect(etcd.endpoint)
        committer = OffsetCommitter(client, queue_max=5)
        holds = client.transactions.version(prefix + b"none") == 0
        try:
            # Ten commits arrive before the committer runs: five wait, five
            # are refused.
            results = await asyncio.gather(
                *(committer.submit(holds, _puts(prefix, f"c{i}", 1)) for i in range(10)),
                return_exceptions=True,
            )
            refused = [r for r in results if isinstance(r, CoordinatorNotAvailableError)]
            assert results[:5] == [True] * 5
            assert len(refused) == 5
            assert "commit queue is 5" in str(refused[0])
            assert len(await _values(client, prefix)) == 5
        finally:
            await committer.close()
            await client.close()

    asyncio.run(run())


def test_closing_fails_the_commits_still_queued(etcd: EtcdProcess, prefix: bytes) -> None:
    async def run() -> None:
        client = connect(etcd.endpoint)
        committer = OffsetCommitter(client)
        holds = client.transactions.version(prefix + b"none") == 0
        try:
            pending = [
                asyncio.ensure_future(committer.submit(holds, _puts(prefix, f"c{i}", 1)))
                for i in range(3)
            ]
            await asyncio.sleep(0)  # queued, not yet written
            await committer.close()
            for future in pending:
                with pytest.raises(CoordinatorNotAvailableError, match="shutting down"):
                    await future
            with pytest.raises(CoordinatorNotAvailableError, match="shutting down"):
                await committer.submit(holds, _puts(prefix, "late", 1))
        finally:
            await client.close()

    asyncio.run(run())
