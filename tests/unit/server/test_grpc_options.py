"""The servers' ping policy against the clients' keepalive (tidelog_server.grpc_options).

The gateway's upstream channels ping every 5 s, also while no call is
active. A server with gRPC's default policy counts each of those pings on an
idle connection as a strike and, after the third, sends GOAWAY
too_many_pings (seen after about two idle minutes). Waiting for the GOAWAY
takes minutes, so the test reads the strikes themselves from gRPC's debug log
of a child process: a real broker (standalone: its server options are the
coordinator's and the gateway's, from tidelog_server.grpc_options) and a real
gateway channel that makes one call and then stays idle.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import asyncio, sys
from pathlib import Path
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tidelog_broker.config import BrokerConfig
from tidelog_broker.server import BrokerServer
from tidelog_gateway.channels import Channels

DATA_DIR, IDLE_S = Path(sys.argv[1]), float(sys.argv[2])

async def main():
    broker = BrokerServer(BrokerConfig(broker_id=0, port=0, data_dir=DATA_DIR))
    await broker.start()
    channels = Channels(max_message_bytes=1 << 20)
    try:
        health = health_pb2_grpc.HealthStub(channels.channel(f"127.0.0.1:{broker.bound_port}"))
        await health.Check(health_pb2.HealthCheckRequest(), timeout=30)
        # No call from here on: only the channel's keepalive pings.
        await asyncio.sleep(IDLE_S)
    finally:
        await channels.close()
        await broker.stop()

asyncio.run(main())
"""

# frame_ping.cc, on the server, for each ping it receives (before counting it).
RECEIVED_PING = re.compile(
    r"SERVER\[\S+\]: received ping \d+: now=@(?P<now>\d+)ms "
    r"transport_idle=\d next_allowed_ping=@(?P<allowed>-∞|\d+ms)"
)


def test_idle_keepalive_pings_of_the_gateway_channels_are_no_strikes(tmp_path: Path) -> None:
    env = dict(os.environ, GRPC_VERBOSITY="debug", GRPC_TRACE="http_keepalive")
    # Over two keepalive intervals without a call: at least two pings, the
    # second of which the default policy counts as a strike.
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "broker"), "12"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    pings = [m.groupdict() for m in RECEIVED_PING.finditer(child.stderr)]
    assert len(pings) >= 2, f"expected keepalive pings after the call, saw {pings}"
    early = [p for p in pings if p["allowed"] != "-∞" and int(p["allowed"][:-2]) > int(p["now"])]
    assert not early, f"the server counted pings as strikes (too_many_pings follows): {early}"
