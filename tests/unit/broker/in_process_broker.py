"""One broker in this process for the tests of what a broker tells the
cluster: its PartitionManager and ClusterLink on a data directory, over a
real etcd under the test's own key prefix (`InProcessBroker`), what it
shows (its roles, its registration's offline listing, its failed hostings),
and `eventually`, the wait for what the watches bring."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidelog_broker.cluster_link import ClusterConfig, ClusterLink
from tidelog_broker.config import BrokerConfig
from tidelog_broker.partition_manager import PartitionManager
from tidelog_broker.replica_state import Role
from tidelog_broker.storage import files
from tidelog_server.etcd.records import BrokerRegistration
from tidelog_server.forwarding import ChannelPool

from tests.support.etcd import EtcdProcess

#: Generous: a loaded 2-core CI machine.
WAIT_S = 20.0
#: Between two looks at what the broker shows.
POLL_S = 0.02
#: The brokers' etcd session TTL (ClusterConfig's default: 2 s).
SESSION_TTL_S = 15


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
            # No test here is about session expiry: a lease of the default
            # 2 s ran out on a loaded CI machine (a fresh registration then
            # keeps the broker from leading until a controller, absent here,
            # elects it again).
            ClusterConfig(
                etcd_endpoint=etcd.endpoint, etcd_prefix=prefix, session_ttl_s=SESSION_TTL_S
            ),
            self.config,
            self.manager,
            ChannelPool(),
        )
        self.client, self.keys = self.link.client, self.link.keys

    async def start(self) -> None:
        await self.link.start(port=1)
        await asyncio.wait_for(self.link.registered.wait(), WAIT_S)
        await self.link.wait_synced(WAIT_S)

    async def stop(self) -> None:
        await self.link.stop()
        self.manager.close()

    async def crash(self) -> None:
        """Leave the data directory as a SIGKILL does: every write() made
        is in the files (the page cache outlives the process), and no log
        has its clean-shutdown marker. (Its registration goes at once, as
        when its lease expires.)"""
        await self.stop()
        for marker in self.config.data_dir.glob(f"*/{files.CLEAN_SHUTDOWN_FILE}"):
            marker.unlink()

    def role(self, topic: str, partition: int) -> Role | None:
        """Its role in `topic`-`partition`; None: it has none (not hosted)."""
        replication = self.manager.replicas.replication(topic, partition)
        return None if replication is None else replication.role

    async def listed_offline(self) -> tuple[tuple[str, int], ...]:
        """The partitions its registration in etcd lists offline."""
        got = await self.client.get(self.keys.broker(self.config.broker_id))
        return BrokerRegistration.decode(got.value).offline_partitions

    async def until_listed(self, expected: tuple[tuple[str, int], ...]) -> None:
        """Wait up to WAIT_S until its registration lists `expected` offline."""
        listed: tuple[tuple[str, int], ...] = ()

        async def lists_expected() -> bool:
            nonlocal listed
            listed = await self.listed_offline()
            return listed == expected

        try:
            async with asyncio.timeout(WAIT_S):
                while not await lists_expected():
                    await asyncio.sleep(POLL_S)
        except TimeoutError:
            raise AssertionError(f"offline listing {listed}, not {expected}") from None

    async def hosting_failed(self, topic: str) -> None:
        """Wait until its hosting of `topic` has failed (and is retried)."""
        await eventually(lambda: topic in self.link._hosting_failed, f"hosting {topic} failed")


async def eventually(check: Callable[[], bool], what: str, within_s: float = WAIT_S) -> None:
    """Wait up to `within_s` for `check()`; AssertionError naming `what`
    (a bare timeout would not say what was waited for)."""
    try:
        async with asyncio.timeout(within_s):
            while not check():
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"not within {within_s} s: {what}") from None
