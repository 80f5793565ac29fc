"""Every flag the chart passes is one the services accept: the rendered
command lines (with Kubernetes' $(VAR) references expanded as the kubelet
would) and the broker's server.properties go through the services' own
argument parsing, and give the broker id of the pod's ordinal, the
advertised address of its stable name, and every etcd member. With TLS and
metrics on, the same holds with the mounted certificate files (made here by
tidelog_server.dev_certs) and the metrics endpoint on the pod's address; the
coordinator's shell wrapper is run by a real shell."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest
from tidelog_broker.__main__ import cluster_from_args, config_from_args
from tidelog_broker.__main__ import parse_args as broker_args
from tidelog_coordinator.__main__ import parse_args as coordinator_args
from tidelog_gateway.__main__ import parse_all as gateway_all
from tidelog_gateway.__main__ import parse_args as gateway_args
from tidelog_server.dev_certs import create_dev_certificates
from tidelog_server.metrics import MetricsOptions

from tests.deploy.chart import NAMESPACE, Chart, Rendered, container, env_value
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


# ------------------------------------------------------------ TLS and metrics

TLS_DIR = "/etc/tidelog-tls"


@pytest.fixture(scope="module")
def tls_render(chart: Chart) -> Rendered:
    return chart.render(
        "--set", "tls.enabled=true", "--set", "tls.existingSecret=tidelog-tls",
        "--set", "tls.clientAuth=require",
    )  # fmt: skip


def with_certs(argv: list[str], tmp_path: Path) -> list[str]:
    """The mounted Secret's files (tls.crt, tls.key, ca.crt) made for real."""
    certs = create_dev_certificates(tmp_path / "certs", hosts=("*.test",))
    files = {
        f"{TLS_DIR}/tls.crt": str(certs.server_certfile),
        f"{TLS_DIR}/tls.key": str(certs.server_keyfile),
        f"{TLS_DIR}/ca.crt": str(certs.cafile),
    }
    return [re.sub(f"{TLS_DIR}/[a-z.]+", lambda m: files[m.group(0)], a) for a in argv]


def test_the_broker_accepts_its_tls_and_metrics_command_line(
    tls_render: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    brokers = tls_render.one("StatefulSet", "broker")
    pod = f"{brokers['metadata']['name']}-0"
    argv = [a for a in expand(container(brokers), pod) if not a.startswith("--config=")]
    monkeypatch.setattr(socket, "gethostname", lambda: pod)
    args = broker_args(with_certs(argv, tmp_path))
    config = config_from_args(args)
    assert config.tls is not None and config.tls.client_auth == "require"
    assert (args.metrics_port, args.metrics_host) == (9404, "0.0.0.0")


def test_the_gateway_accepts_its_tls_and_metrics_command_line(
    tls_render: Rendered, tmp_path: Path
) -> None:
    ctr = container(tls_render.one("Deployment", "gateway"))
    config, metrics = gateway_all(with_certs(expand(ctr, "rel-tidelog-gateway-abc"), tmp_path))
    assert config.tls is not None and config.tls.client_auth == "require"
    assert metrics == MetricsOptions(host="0.0.0.0", port=9404)


def test_with_tls_the_coordinator_advertises_a_dns_name_its_certificate_can_carry(
    tls_render: Rendered, tmp_path: Path
) -> None:
    """A certificate cannot name a pod IP: the shell in front of the
    coordinator advertises the pod's name under the headless Service."""
    ctr = container(tls_render.one("Deployment", "coordinator"))
    shell, flag, script, program = ctr["command"]
    assert (shell, flag, program) == ("/bin/sh", "-c", "tidelog-coordinator")
    assert not any(a.startswith("--advertised-host") for a in ctr["args"])
    # The shell execs "$0" "$@": run it with a program that prints its argv.
    printer = tmp_path / "print-argv"
    printer.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    printer.chmod(0o755)
    env = {"POD_IP": "10.1.2.3", "POD_NAMESPACE": NAMESPACE, "PATH": "/usr/bin:/bin"}
    argv = subprocess.run(
        [shell, flag, script, str(printer), *expand(ctr, "rel-tidelog-coordinator-abc")],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    ).stdout.splitlines()  # fmt: skip
    config, metrics = coordinator_args(with_certs(argv, tmp_path))
    headless = tls_render.named("Service", "rel-tidelog-coordinator-headless")
    assert config.advertised_host == (
        f"10-1-2-3.{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    )
    assert config.tls is not None
    assert metrics == MetricsOptions(host="0.0.0.0", port=9404)
    # Cluster DNS answers that name only for pods behind the headless Service.
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True


# ------------------------------------------------------------ etcd authentication

ETCD_AUTH_DIR = "/etc/tidelog-etcd-auth"


def test_every_service_logs_in_to_etcd_with_the_password_file_of_a_mounted_secret(
    chart: Chart, tmp_path: Path
) -> None:
    rendered = chart.render(
        "--set", "etcd.enabled=false", "--set", "etcd.externalEndpoints={etcd-0.example:2379}",
        "--set", "etcd.auth.user=tidelog", "--set", "etcd.auth.existingSecret=etcd-password",
    )  # fmt: skip
    password_file = tmp_path / "password"
    password_file.write_text("from-the-secret\n")
    workloads = {
        "broker": rendered.one("StatefulSet", "broker"),
        "coordinator": rendered.one("Deployment", "coordinator"),
        "gateway": rendered.one("Deployment", "gateway"),
    }
    for name, workload in workloads.items():
        pod = workload["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "etcd-auth")
        assert volume["secret"]["secretName"] == "etcd-password"
        ctr = container(workload)
        assert {"name": "etcd-auth", "mountPath": ETCD_AUTH_DIR, "readOnly": True} in ctr[
            "volumeMounts"
        ]
        assert not any("password" in str(e).lower() for e in ctr.get("env", [])), name
        argv = [
            a.replace(f"{ETCD_AUTH_DIR}/password", str(password_file))
            for a in expand(ctr, f"rel-tidelog-{name}-0")
            if not a.startswith("--config=")
        ]
        if name == "broker":
            cluster = cluster_from_args(broker_args(argv))
            assert cluster is not None
            auth = cluster.etcd_auth
        elif name == "coordinator":
            auth = coordinator_args(argv)[0].etcd_auth
        else:
            auth = gateway_args(argv).etcd_auth
        assert auth is not None and auth.user == "tidelog", name
        assert auth.password() == "from-the-secret", name
