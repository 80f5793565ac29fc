"""PrefixWatcher (tidelog_server.etcd.watch) against a real etcd.

The changes of one watch response arrive as one batch: every change of a
transaction together, and a backlog of several transactions (the watch
starting behind etcd) together, in revision order, with `revision` the last
one's. Batches keep the watcher's guarantees across an etcd restart in the
middle of a burst: nothing missed, nothing delivered twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from tidelog_server.etcd import EtcdClient, PrefixWatcher, WatchBatch, connect, is_unavailable

from tests.support.etcd import EtcdProcess, running_etcd

#: Generous: a loaded 2-core CI machine can stall for seconds.
DEADLINE_S = 20.0


@asynccontextmanager
async def client_of(etcd: EtcdProcess) -> AsyncIterator[EtcdClient]:
    client = connect(etcd.endpoint)
    try:
        yield client
    finally:
        await client.close()


@asynccontextmanager
async def watching(
    client: EtcdClient, prefix: bytes, on_batch: Callable[[WatchBatch], Awaitable[None]]
) -> AsyncIterator[PrefixWatcher]:
    watcher = PrefixWatcher(client, prefix, on_batch, name="test")
    task = asyncio.create_task(watcher.run())
    try:
        yield watcher
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.02)


async def put_all_at_once(client: EtcdClient, keys: list[bytes], value: bytes) -> int:
    """Put `keys` in one transaction, once: a retry after an unavailable error
    (outcome unknown) finds the first key created and writes nothing more.
    Returns the transaction's revision (0 when an earlier try had landed)."""
    tx = client.transactions
    async with asyncio.timeout(DEADLINE_S):
        while True:
            try:
                ok, responses = await client.transaction(
                    compare=[tx.create(keys[0]) == 0],
                    success=[tx.put(key, value) for key in keys],
                    failure=[],
                )
                return int(responses[0].response_put.header.revision) if ok else 0
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                await asyncio.sleep(0.1)


def test_the_changes_of_one_transaction_arrive_as_one_batch(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    async def run() -> None:
        batches: list[WatchBatch] = []
        changed = asyncio.Event()

        async def on_batch(batch: WatchBatch) -> None:
            batches.append(batch)
            if not batch.reset:
                changed.set()

        keys = [prefix + b"k%03d" % i for i in range(100)]
        async with client_of(etcd) as client:
            await client.put(prefix + b"gone", b"x")
            async with watching(client, prefix, on_batch) as watcher:
                await asyncio.wait_for(watcher.synced.wait(), DEADLINE_S)
                tx = client.transactions
                ok, responses = await client.transaction(
                    compare=[],
                    success=[tx.put(key, b"v") for key in keys] + [tx.delete(prefix + b"gone")],
                    failure=[],
                )
                assert ok
                revision = responses[0].response_put.header.revision
                await asyncio.wait_for(changed.wait(), DEADLINE_S)
                assert watcher.revision == revision

        listing, batch = batches[0], batches[1]
        assert listing.reset and [c.key for c in listing.changes] == [prefix + b"gone"]
        assert not batch.reset
        assert batch.revision == revision
        assert [c.key for c in batch.changes] == [*keys, prefix + b"gone"]
        assert [c.value for c in batch.changes] == [b"v"] * 100 + [None]
        assert {c.mod_revision for c in batch.changes} == {revision}

    asyncio.run(run())


def test_a_backlog_of_transactions_arrives_as_one_batch_in_revision_order(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    """The watch starts behind etcd (writes land while the listing is being
    applied): etcd sends the missed revisions in one response, and the
    consumer gets them in one batch, several changes of one key included."""

    async def run() -> None:
        batches: list[WatchBatch] = []
        written = asyncio.Event()
        changed = asyncio.Event()

        async def on_batch(batch: WatchBatch) -> None:
            batches.append(batch)
            if batch.reset:
                await written.wait()
            else:
                changed.set()

        a, b, c = prefix + b"a", prefix + b"b", prefix + b"c"
        async with client_of(etcd) as client, watching(client, prefix, on_batch) as watcher:
            await asyncio.wait_for(until(lambda: bool(batches)), DEADLINE_S)
            tx = client.transactions
            await client.transaction(
                compare=[], success=[tx.put(a, b"1"), tx.put(b, b"1")], failure=[]
            )
            await client.put(a, b"2")
            await client.delete(b)
            last = (await client.put(c, b"1")).header.revision
            written.set()
            await asyncio.wait_for(changed.wait(), DEADLINE_S)
            assert watcher.revision == last

        assert len(batches) == 2
        batch = batches[1]
        assert not batch.reset and batch.revision == last
        assert [(ch.key, ch.value) for ch in batch.changes] == [
            (a, b"1"),
            (b, b"1"),
            (a, b"2"),
            (b, None),
            (c, b"1"),
        ]
        revisions = [ch.mod_revision for ch in batch.changes]
        assert revisions == sorted(revisions) and revisions[-1] == last
        assert revisions[0] == revisions[1] < revisions[2] < revisions[3] < revisions[4]

    asyncio.run(run())


def test_an_etcd_restart_in_the_middle_of_a_burst_loses_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    """A backlog arrives as one batch; while the consumer applies it, more
    transactions land, etcd restarts, and more land: the watch is re-created
    from the last delivered revision and every change arrives exactly once,
    in revision order."""
    prefix = b"/burst/"
    transactions, keys_per_transaction = 20, 10

    def keys_of(burst: str, t: int) -> list[bytes]:
        return [prefix + f"{burst}{t:02d}-{k:02d}".encode() for k in range(keys_per_transaction)]

    async def run(etcd: EtcdProcess) -> None:
        batches: list[WatchBatch] = []
        backlog_written = asyncio.Event()
        restarted = asyncio.Event()

        async def on_batch(batch: WatchBatch) -> None:
            batches.append(batch)
            if batch.reset:
                await backlog_written.wait()
            elif len(batches) == 2:
                await restarted.wait()

        expected = transactions * keys_per_transaction * 3
        async with (
            client_of(etcd) as watch_client,
            client_of(etcd) as writer,
            watching(watch_client, prefix, on_batch) as watcher,
        ):
            await asyncio.wait_for(until(lambda: bool(batches)), DEADLINE_S)
            for t in range(transactions):
                await put_all_at_once(writer, keys_of("a", t), b"a")
            backlog_written.set()
            await asyncio.wait_for(until(lambda: len(batches) == 2), DEADLINE_S)
            for t in range(transactions):
                await put_all_at_once(writer, keys_of("b", t), b"b")
            await asyncio.to_thread(etcd.restart)
            for t in range(transactions):
                await put_all_at_once(writer, keys_of("c", t), b"c")
            restarted.set()
            await asyncio.wait_for(
                until(lambda: sum(len(b.changes) for b in batches[1:]) >= expected),
                DEADLINE_S,
            )
            listing = await writer.get_prefix(prefix)
            final_revision = listing.header.revision
            await asyncio.wait_for(until(lambda: watcher.revision == final_revision), DEADLINE_S)

        assert batches[0].reset and not batches[0].changes
        # The backlog, as one batch (etcd sent it in one response).
        assert len(batches[1].changes) == transactions * keys_per_transaction
        assert [b.reset for b in batches[1:]] == [False] * (len(batches) - 1)
        delivered = [(ch.key, ch.mod_revision) for b in batches[1:] for ch in b.changes]
        assert sorted(delivered) == sorted((kv.key, kv.mod_revision) for kv in listing)
        revisions = [revision for _, revision in delivered]
        assert revisions == sorted(revisions)
        for batch in batches[1:]:
            assert batch.revision == batch.changes[-1].mod_revision

    with running_etcd(tmp_path / "etcd") as etcd:
        asyncio.run(run(etcd))


def test_a_batch_the_consumer_failed_to_apply_is_followed_by_a_new_listing(
    etcd: EtcdProcess, prefix: bytes
) -> None:
    """The consumer raises on a batch of changes (it may hold part of it): the
    watcher lists again, so that what it knows matches etcd. Before, it resumed
    after that batch, and the consumer never learnt what the batch held."""

    async def run() -> None:
        known: dict[bytes, bytes | None] = {}
        failed: list[WatchBatch] = []
        resets = 0

        async def on_batch(batch: WatchBatch) -> None:
            nonlocal resets
            if batch.reset:
                resets += 1
                known.clear()
            elif not failed:
                failed.append(batch)
                raise RuntimeError("the consumer's bug, once")
            for change in batch.changes:
                known[change.key] = change.value

        async with client_of(etcd) as client, watching(client, prefix, on_batch) as watcher:
            await asyncio.wait_for(watcher.synced.wait(), DEADLINE_S)
            await client.put(prefix + b"one", b"1")
            async with asyncio.timeout(DEADLINE_S):
                await until(lambda: resets == 2)
                await until(lambda: known.get(prefix + b"one") == b"1")
            await client.put(prefix + b"two", b"2")
            async with asyncio.timeout(DEADLINE_S):
                await until(lambda: known.get(prefix + b"two") == b"2")
        assert [c.key for c in failed[0].changes] == [prefix + b"one"]

    asyncio.run(run())
