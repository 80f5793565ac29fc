"""A leader-election pass that fails the same way on every pass logs the
error once per interval (RateLimitedLog), not once per pass."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from tidelog_coordinator.leader_election import LeaderElector
from tidelog_server.etcd.keys import Keys

from tests.integration.coordinator.helpers import etcd_client
from tests.support.etcd import EtcdProcess

pytestmark = pytest.mark.timeout(60)

PASSES = 4
DEADLINE_S = 30.0


def test_a_repeating_election_error_is_logged_once(
    etcd: EtcdProcess, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    keys = Keys(prefix)

    async def run() -> int:
        async with etcd_client(etcd.endpoint) as client:
            # A topic key no pass can parse: every pass fails the same way.
            await client.put(keys.topic("damaged"), b"{not json")
            elector = LeaderElector(client, keys, preferred_interval_ms=0)
            passes = 0
            real_elect_once = elector.elect_once

            async def counting_elect_once(fence: Any, preferred: bool) -> int:
                nonlocal passes
                passes += 1
                return await real_elect_once(fence, preferred)

            elector.elect_once = counting_elect_once  # type: ignore[method-assign]
            task = asyncio.create_task(elector.run(fence=None))
            try:
                async with asyncio.timeout(DEADLINE_S):
                    while passes < PASSES + 1:  # PASSES have failed completely
                        await asyncio.sleep(0.05)
            finally:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            return passes

    with caplog.at_level(logging.ERROR, logger="tidelog.coordinator.election"):
        passes = asyncio.run(run())
    failures = [r for r in caplog.records if "leader election pass failed" in r.getMessage()]
    assert passes > PASSES
    assert len(failures) == 1, [r.getMessage() for r in failures]
