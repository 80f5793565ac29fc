"""The broker's command line (tidelog_broker.__main__): the broker id from a
StatefulSet pod's host name, and several etcd endpoints."""

from __future__ import annotations

import socket

import pytest
from tidelog.errors import TidelogError
from tidelog_broker.__main__ import (
    broker_id_from_hostname,
    cluster_from_args,
    config_from_args,
    parse_args,
)


@pytest.mark.parametrize(
    ("hostname", "broker_id"),
    [
        ("tidelog-broker-0", 0),
        ("tidelog-broker-12", 12),
        ("my-release-tidelog-broker-3.tidelog-broker-headless.ns.svc.cluster.local", 3),
    ],
)
def test_the_broker_id_is_the_pod_ordinal(hostname: str, broker_id: int) -> None:
    assert broker_id_from_hostname(hostname) == broker_id


@pytest.mark.parametrize("hostname", ["broker", "broker-", "broker-x", "7", "a.broker-2"])
def test_a_host_name_without_an_ordinal_is_refused_with_advice(hostname: str) -> None:
    with pytest.raises(TidelogError, match=r"does not end in -<ordinal>.*--broker-id"):
        broker_id_from_hostname(hostname)


def test_the_flag_reads_this_hosts_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "tidelog-broker-4")
    config = config_from_args(parse_args(["--broker-id-from-hostname"]))
    assert config.broker_id == 4
    with pytest.raises(TidelogError, match="not both"):
        config_from_args(parse_args(["--broker-id-from-hostname", "--broker-id", "1"]))


def test_etcd_takes_several_endpoints_and_refuses_a_bad_one() -> None:
    cluster = cluster_from_args(parse_args(["--etcd", "e0:2379,e1:2379,e2:2379"]))
    assert cluster is not None and cluster.etcd_endpoint == "e0:2379,e1:2379,e2:2379"
    with pytest.raises(TidelogError, match="--etcd: etcd endpoint must be host:port"):
        cluster_from_args(parse_args(["--etcd", "e0:2379,e1"]))
