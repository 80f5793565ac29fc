"""Request-rate quota: how long N unary calls take with and without it.

A broker applies a principal's request_rate quota by answering late, never
by refusing (docs/security.md). tests/integration/test_acls.py asserts the
behaviour (every call answered, the delay reported in the trailing metadata
`tidelog-throttle-time-ms`); the time it costs is measured here, where a
loaded machine cannot make a test fail:

- unthrottled: N DescribeTopics calls to a broker, one after the other;
- throttled: the same after a quota of R requests/s for the caller
  (User:ANONYMOUS on this plain-text cluster); expected about N/R.

Usage: python -m bench.quota_bench [--calls N] [--rate R]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tidelog import AdminClient, NewTopic
from tidelog.v1 import admin_pb2, admin_pb2_grpc
from tidelog_server.quotas import THROTTLE_TIME_METADATA_KEY

from tests.support.cluster import running_cluster
from tests.support.etcd import running_etcd

TOPIC = "rated"
PRINCIPAL = "User:ANONYMOUS"
#: A quota reaches the broker through its etcd watch (~10 ms here).
QUOTA_PROPAGATION_S = 1.0


def timed_calls(address: str, calls: int) -> tuple[float, int]:
    """Seconds for `calls` DescribeTopics, and how many reported a throttle."""
    throttled = 0
    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        started = time.perf_counter()
        for _ in range(calls):
            _, call = stub.DescribeTopics.with_call(
                admin_pb2.DescribeTopicsRequest(names=[TOPIC]), timeout=120
            )
            if dict(call.trailing_metadata() or ()).get(THROTTLE_TIME_METADATA_KEY):
                throttled += 1
        return time.perf_counter() - started, throttled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as scratch,
        running_etcd(Path(scratch) / "etcd") as etcd,
        running_cluster(Path(scratch) / "cluster", etcd=etcd, brokers=1) as cluster,
        AdminClient(cluster.brokers[0].address) as admin,
    ):
        broker = cluster.brokers[0].address
        admin.create_topics([NewTopic(TOPIC, 1, 1)])
        free_s, _ = timed_calls(broker, args.calls)
        admin.alter_client_quotas(PRINCIPAL, {"request_rate": args.rate})
        time.sleep(QUOTA_PROPAGATION_S)
        rated_s, throttled = timed_calls(broker, args.calls)
        admin.alter_client_quotas(PRINCIPAL, {"request_rate": 0})
    print(f"{args.calls} DescribeTopics calls, one after the other, on one broker:")
    print(f"  no quota:                   {free_s:7.2f} s")
    print(
        f"  request_rate {args.rate:g}/s:        {rated_s:7.2f} s "
        f"(N/R = {args.calls / args.rate:.2f} s; {throttled} answers reported a throttle; "
        f"{rated_s / free_s:.0f}x the unthrottled time)"
    )


if __name__ == "__main__":
    main()
