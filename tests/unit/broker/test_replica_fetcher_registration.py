"""A follower fetches only while its broker holds its etcd registration
(issue 16 item 2): a frozen or superseded process, whose lease has expired,
must not report its log end offset as that replica's progress."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tidelog_broker.config import BrokerConfig
from tidelog_broker.replica_fetcher import ReplicaFetcher
from tidelog_broker.storage import LogConfig, ManualClock, PartitionLog
from tidelog_server.internal import replica_pb2

KEY = ("orders", 0)


class _Manager:
    def __init__(self, log: PartitionLog) -> None:
        self.log = log

    def partition_log(self, topic: str, partition: int) -> PartitionLog:
        return self.log


class _Call:
    """A ReplicaFetch stream that answers every request with nothing."""

    def __init__(self) -> None:
        self.requests: list[replica_pb2.ReplicaFetchRequest] = []
        self.written = asyncio.Event()

    async def write(self, request: replica_pb2.ReplicaFetchRequest) -> None:
        self.requests.append(request)
        self.written.set()

    async def read(self) -> replica_pb2.ReplicaFetchResponse:
        await asyncio.sleep(0.01)
        return replica_pb2.ReplicaFetchResponse()

    def cancel(self) -> None:
        pass


def test_no_fetch_while_unregistered_and_fetching_again_once_registered(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "orders-0", *KEY, LogConfig(), ManualClock())
    registered = False

    async def run() -> None:
        nonlocal registered
        fetcher = ReplicaFetcher(
            1,
            _Manager(log),  # type: ignore[arg-type]
            BrokerConfig(broker_id=2, data_dir=tmp_path),
            lambda _leader: "127.0.0.1:1",
            lambda: registered,
        )
        fetcher.partitions = {KEY: 3}
        call = _Call()
        task = asyncio.create_task(fetcher._fetch_loop(call, "127.0.0.1:1"))
        try:
            # Several backoff periods: nothing is sent for a lapsed registration.
            await asyncio.sleep(0.5)
            assert call.requests == []
            registered = True
            await asyncio.wait_for(call.written.wait(), 10)
            assert call.requests[0].replica_id == 2
            assert call.requests[0].partitions[0].current_leader_epoch == 3
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    try:
        asyncio.run(run())
    finally:
        log.close()
