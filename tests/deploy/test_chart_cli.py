"""Every flag the chart passes is one the services accept: the rendered
command lines (with Kubernetes' $(VAR) references expanded as the kubelet
would) and the broker's server.properties go through the services' own
argument parsing, and give the broker id of the pod's ordinal, the
advertised address of its stable name, and every etcd member."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from tidelog_broker.__main__ import cluster_from_args, config_from_args
from tidelog_broker.__main__ import parse_args as broker_args
from tidelog_coordinator.__main__ import parse_args as coordinator_args
from tidelog_gateway.__main__ import parse_args as gateway_args

from tests.deploy.chart import NAMESPACE, Rendered, container, env_value
from tests.deploy.conftest import HELM_BUILD_TIMEOUT_S

# One worker runs every chart test: only it waits for a first build of helm.
pytestmark = [pytest.mark.timeout(HELM_BUILD_TIMEOUT_S + 300), pytest.mark.xdist_group("helm")]


def expand(ctr: dict, pod_name: str) -> list[str]:
    """The container's args as the kubelet passes them: $(VAR) replaced by
    the container's env (downward API values given for this pod)."""
    values = {
        "POD_NAME": pod_name,
        "POD_NAMESPACE": NAMESPACE,
        "POD_IP": "10.0.0.7",
        "TIDELOG_ETCD": env_value(ctr, "TIDELOG_ETCD"),
        "TIDELOG_RACK": "zone-a",
    }
    return [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in ctr["args"]]


def test_the_broker_accepts_its_command_line_and_config(
    rendered: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    brokers = rendered.one("StatefulSet", "broker")
    ctr = container(brokers)
    assert ctr["command"] == ["tidelog-broker"]
    pod = f"{brokers['metadata']['name']}-2"
    configmap = rendered.one("ConfigMap", "broker")
    properties = tmp_path / "server.properties"
    properties.write_text(configmap["data"]["server.properties"])
    argv = [f"--config={properties}" if a.startswith("--config=") else a for a in expand(ctr, pod)]
    # The pod's host name is its name: broker 2.
    monkeypatch.setattr(socket, "gethostname", lambda: pod)
    args = broker_args(argv)
    config = config_from_args(args)
    cluster = cluster_from_args(args)
    assert config.broker_id == 2
    assert config.internal_port == 9393
    assert config.advertised_host == (
        f"{pod}.{brokers['spec']['serviceName']}.{NAMESPACE}.svc.cluster.local"
    )
    assert str(config.data_dir).startswith("/var/lib/tidelog/")
    assert config.log_defaults.min_insync_replicas == 2
    assert cluster is not None and cluster.etcd_endpoint.count(",") == 2


def test_the_coordinator_accepts_its_command_line(rendered: Rendered) -> None:
    ctr = container(rendered.one("Deployment", "coordinator"))
    assert ctr["command"] == ["tidelog-coordinator"]
    config, _metrics = coordinator_args(expand(ctr, "rel-tidelog-coordinator-abc"))
    assert config.advertised_host == "10.0.0.7"
    assert config.coordinator_id == "rel-tidelog-coordinator-abc"
    assert config.etcd_endpoint.count(",") == 2


def test_the_gateway_accepts_its_command_line(rendered: Rendered) -> None:
    ctr = container(rendered.one("Deployment", "gateway"))
    assert ctr["command"] == ["tidelog-gateway"]
    config = gateway_args(expand(ctr, "rel-tidelog-gateway-abc"))
    assert config.listen_address.endswith(":9400")
    assert config.etcd_endpoint.count(",") == 2
