"""Hosting many new partitions leaves the broker's event loop free
(ClusterLink, LogManager.host_partitions_off_loop).

A topic of 3,000 partitions (RF 2) on three brokers cost a broker its etcd
session: each opened ~2,000 logs (~1-3 ms of opens, mkdir and fsyncs each)
and wrote each new leader's epoch history, all on its event loop, back to
back, so its lease keepalive did not run for seconds. Now logs open in
worker threads and the states are applied in slices that yield to the loop.

Each test runs another task beside the hosting (what the keepalive is) and
asserts that it ran while the hosting was under way, not only before and
after. The link is driven with watch batches directly (never started); the
etcd endpoint is real but nothing is read from it.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from tidelog_broker.loop_slices import LoopSlices
from tidelog_broker.storage import files
from tidelog_broker.storage.leader_epoch import LeaderEpochCache
from tidelog_broker.topic_store import TopicSpec
from tidelog_server.etcd.watch import Change, WatchBatch

from tests.support.etcd import EtcdProcess
from tests.unit.broker.test_cluster_link_reconcile import (
    ME,
    OTHER,
    PARTITIONS,
    TOPIC,
    counting_link,
    state_change,
    topic_change,
)

DEADLINE_S = 60.0
#: New partitions hosted at once by the cancellation test: more than are
#: opened on the loop itself (log_manager.INLINE_OPEN_MAX), so a thread opens them.
OPENED = 8


async def announce_topic(link: Any) -> Any:
    """Deliver TOPIC (PARTITIONS partitions, RF 2) through the topics watch,
    as every test here starts; returns the link's etcd keys for its states."""
    await link._on_topics(WatchBatch(True, [topic_change(link.keys, PARTITIONS, 2)]))
    return link.keys


def leader_of(p: int) -> int:
    """The preferred replica of partition p (topic_change's assignment)."""
    return ME if p % 2 == 0 else OTHER


def test_a_new_topics_states_back_to_back_let_the_loop_run_while_hosting(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    # etcd's watch delivers a new topic's states one after another with no
    # wait in between: the broker used to host them all before anything
    # else (its lease keepalive) ran again.
    async def run() -> None:
        async with counting_link(etcd, tmp_path) as (manager, link, calls):
            keys = await announce_topic(link)
            seen: set[int] = set()
            done = asyncio.Event()

            async def keepalive() -> None:
                while not done.is_set():
                    seen.add(len(manager.logs.hosted_partitions(TOPIC)))
                    await asyncio.sleep(0)

            async def watch() -> None:
                for p in range(PARTITIONS):
                    state = state_change(keys, p, leader_of(p), 0, 3 + p)
                    await link._on_states(
                        WatchBatch(False, [Change(state.key, state.value, 3 + p, 3 + p)])
                    )
                done.set()

            async with asyncio.timeout(DEADLINE_S):
                await asyncio.gather(keepalive(), watch())
            assert any(0 < count < PARTITIONS for count in seen), sorted(seen)
            assert manager.logs.hosted_partitions(TOPIC) == list(range(PARTITIONS))
            assert calls == {(TOPIC, p): 1 for p in range(PARTITIONS)}

    asyncio.run(run())


def test_a_listing_of_many_states_is_applied_in_slices(etcd: EtcdProcess, tmp_path: Path) -> None:
    # A broker (re)starting lists every state at once: their roles (each
    # new leader writes its epoch history, two fsyncs) are applied a slice
    # at a time, with the loop free in between.
    async def run() -> None:
        async with counting_link(etcd, tmp_path) as (_manager, link, calls):
            link._slices = LoopSlices(slice_s=0.0)  # test seam: yield at every pause
            keys = await announce_topic(link)
            states = [state_change(keys, p, leader_of(p), 0, 3) for p in range(PARTITIONS)]
            hosting = asyncio.create_task(link._on_states(WatchBatch(True, states)))
            applied: set[int] = set()
            async with asyncio.timeout(DEADLINE_S):
                while not hosting.done():
                    applied.add(len(calls))
                    await asyncio.sleep(0)
            await hosting
            assert any(0 < count < PARTITIONS for count in applied), sorted(applied)
            assert calls == {(TOPIC, p): 1 for p in range(PARTITIONS)}

    asyncio.run(run())


def test_a_new_topics_leaders_record_their_epochs_without_an_fsync_on_the_loop(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    # Each new leader's epoch history was two fsyncs: on a busy disk, ~1 s
    # each, and they held the loop (seen in bench.replication_bench: two
    # brokers lost their sessions after two such fsyncs in a row). The
    # history now reaches the disk with the log's flush (leader_epoch).
    async def run() -> None:
        async with counting_link(etcd, tmp_path) as (manager, link, _calls):
            keys = await announce_topic(link)
            on_loop: list[Path] = []
            real_fsync = os.fsync

            def recording_fsync(fd: int) -> None:
                if threading.current_thread() is threading.main_thread():
                    on_loop.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
                real_fsync(fd)

            os.fsync = recording_fsync
            try:
                states = [state_change(keys, p, leader_of(p), 0, 3) for p in range(PARTITIONS)]
                await link._on_states(WatchBatch(True, states))
            finally:
                os.fsync = real_fsync
            led = [p for p in range(PARTITIONS) if leader_of(p) == ME]
            log_dirs = {manager.partition_log(TOPIC, p).directory for p in led}
            # The broker's own metadata file may be fsynced (once per batch).
            assert [path for path in on_loop if path in log_dirs or path.parent in log_dirs] == []
            for p in led:
                partition_log = manager.partition_log(TOPIC, p)
                assert partition_log.leader_epochs.entries == [(0, 0)]
                partition_log.flush()
                assert LeaderEpochCache.load(partition_log.directory).entries == [(0, 0)]

    asyncio.run(run())


def test_a_topic_deleted_while_its_logs_open_is_not_left_behind(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    # The topic's deletion arrives (topics watch) while its logs are being
    # opened in a worker thread for the states watch: it waits its turn,
    # then closes and deletes what was opened; nothing stays hosted or on disk.
    async def run() -> None:
        async with counting_link(etcd, tmp_path) as (manager, link, _calls):
            keys = await announce_topic(link)
            opening, release = threading.Event(), threading.Event()
            open_logs = manager.logs._open_logs

            def gated_open_logs(*args: object, **kwargs: object) -> object:
                opening.set()
                release.wait(DEADLINE_S)
                return open_logs(*args, **kwargs)  # type: ignore[arg-type]

            manager.logs._open_logs = gated_open_logs  # type: ignore[method-assign,assignment]
            states = [state_change(keys, p, leader_of(p), 0, 3) for p in range(PARTITIONS)]
            hosting = asyncio.create_task(link._on_states(WatchBatch(True, states)))
            async with asyncio.timeout(DEADLINE_S):
                while not opening.is_set():
                    await asyncio.sleep(0.01)
            deleted = asyncio.create_task(
                link._on_topics(WatchBatch(False, [Change(keys.topic(TOPIC), None, 20)]))
            )
            await asyncio.sleep(0.05)
            assert not deleted.done()  # it waits for the hosting in flight
            release.set()
            async with asyncio.timeout(DEADLINE_S):
                await asyncio.gather(hosting, deleted)
            assert TOPIC not in manager.logs.topic_names()
            assert manager.logs.local_topics() == {}
            assert link._followed == {}

    asyncio.run(run())


def test_a_few_new_partitions_are_hosted_in_the_same_turn_of_the_loop(tmp_path: Path) -> None:
    # A small topic is hosted without a hop to a worker thread (which takes
    # tens of ms on a loaded machine): requests that follow its creation
    # find it. The coroutine finishes without ever suspending.
    from tidelog_broker.config import BrokerConfig
    from tidelog_broker.log_manager import INLINE_OPEN_MAX
    from tidelog_broker.partition_manager import PartitionManager

    manager = PartitionManager(BrokerConfig(data_dir=tmp_path, broker_id=ME), cluster_mode=True)
    manager.open()
    try:
        hosting = manager.logs.host_partitions_off_loop(
            TopicSpec(TOPIC, INLINE_OPEN_MAX, {}), range(INLINE_OPEN_MAX)
        )
        try:
            hosting.send(None)
        except StopIteration:
            pass
        else:
            hosting.close()
            raise AssertionError("hosting a few partitions waited for something")
        assert manager.logs.hosted_partitions(TOPIC) == list(range(INLINE_OPEN_MAX))
    finally:
        manager.close()


def test_hosting_cancelled_while_logs_open_in_a_thread_closes_them(tmp_path: Path) -> None:
    # A broker stopping cancels the hosting; the logs a worker thread was
    # opening then must be closed (a clean shutdown), not left open.
    from tidelog_broker.config import BrokerConfig
    from tidelog_broker.partition_manager import PartitionManager

    manager = PartitionManager(BrokerConfig(data_dir=tmp_path, broker_id=ME), cluster_mode=True)
    manager.open()
    opening, release = threading.Event(), threading.Event()
    open_logs = manager.logs._open_logs

    def gated_open_logs(*args: object, **kwargs: object) -> object:
        opening.set()
        release.wait(DEADLINE_S)
        return open_logs(*args, **kwargs)  # type: ignore[arg-type]

    manager.logs._open_logs = gated_open_logs  # type: ignore[method-assign,assignment]

    async def run() -> None:
        hosting = asyncio.create_task(
            manager.logs.host_partitions_off_loop(TopicSpec(TOPIC, OPENED, {}), range(OPENED))
        )
        async with asyncio.timeout(DEADLINE_S):
            while not opening.is_set():
                await asyncio.sleep(0.01)
        hosting.cancel()
        await asyncio.gather(hosting, return_exceptions=True)
        release.set()
        # The thread finishes its slice; its logs are closed on the loop.
        async with asyncio.timeout(DEADLINE_S):
            while not all(clean_shutdown(tmp_path, p) for p in range(OPENED)):
                await asyncio.sleep(0.01)

    try:
        asyncio.run(run())
        assert manager.logs.hosted_partitions(TOPIC) == []
    finally:
        manager.close()


def clean_shutdown(data_dir: Path, partition: int) -> bool:
    """Whether the log of TOPIC-`partition` was closed (it marks a clean shutdown)."""
    return (data_dir / files.log_dir_name(TOPIC, partition) / files.CLEAN_SHUTDOWN_FILE).exists()
