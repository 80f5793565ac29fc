"""One broker in this process for the tests of what a broker tells the
cluster: its PartitionManager and ClusterLink on a data directory, over a
real etcd under the test's own key prefix (`InProcessBroker`), and
`eventually`, the wait for what the watches bring."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidelog_broker.cluster_link import ClusterConfig, ClusterLink
from tidelog_broker.config import BrokerConfig
from tidelog_broker.partition_manager import PartitionManager
from tidelog_server.forwarding import ChannelPool

from tests.support.etcd import EtcdProcess

#: Generous: a loaded 2-core CI machine.
WAIT_S = 20.0


class InProcessBroker:
    """Broker `broker_id` on `data_dir`, registered under `prefix` once
    `start()` returns (and its view of etcd synced); `stop()` deregisters
    and closes its logs. `config`: more BrokerConfig fields."""

    def __init__(
        self, etcd: EtcdProcess, prefix: str, data_dir: Path, broker_id: int, **config: Any
    ) -> None:
        self.config = BrokerConfig(data_dir=data_dir, broker_id=broker_id, **config)
        self.manager = PartitionManager(self.config, cluster_mode=True)
        self.manager.open()
        self.link = ClusterLink(
            ClusterConfig(etcd_endpoint=etcd.endpoint, etcd_prefix=prefix),
            self.config,
            self.manager,
            ChannelPool(),
        )

    async def start(self) -> None:
        await self.link.start(port=1)
        await asyncio.wait_for(self.link.registered.wait(), WAIT_S)
        await self.link.wait_synced(WAIT_S)

    async def stop(self) -> None:
        await self.link.stop()
        self.manager.close()


async def eventually(check: Callable[[], bool], what: str) -> None:
    """Wait up to WAIT_S for `check()`; fail naming `what`."""
    async with asyncio.timeout(WAIT_S):
        while not check():
            await asyncio.sleep(0.02)
    assert check(), what
