"""The service images (deploy/docker/Dockerfile, built by tools/images.py): what each
declares, a cluster of them serving clients through the gateway, and SIGTERM stopping every
service cleanly within Docker's 10 s (issue 12)."""

from __future__ import annotations

import time

import docker
import pytest
from tidelog import AdminClient, Consumer, NewTopic, Producer

from tests.containers.cluster import ContainerCluster

#: How long a service's health probe may keep failing (the kubelet's retries),
#: and the pause between two probes (the chart's periodSeconds is longer).
PROBE_DEADLINE_S = 60
PROBE_RETRY_S = 1

#: The first test builds the images when they are missing: ~5 min on a fresh machine, ~8 min
#: on a loaded one (debootstrap, wheelhouse, three images).
pytestmark = [pytest.mark.xdist_group("containers"), pytest.mark.timeout(1200)]

#: What each service image declares (deploy/docker/Dockerfile).
PORTS = {"broker": "9392/tcp", "coordinator": "9093/tcp", "gateway": "9400/tcp"}
#: Every image declares the metrics port the Helm chart serves metrics on.
METRICS_PORT = "9404/tcp"
#: The goal of issue 12 for each service image.
MAX_IMAGE_BYTES = 200_000_000
#: `docker stop`'s grace period, Docker's default (and below Kubernetes' 30 s).
STOP_TIMEOUT_S = 10


def run(client: docker.DockerClient, image: str, *command: str) -> str:
    """`command`'s output in a container of `image`, removed with its volumes afterwards."""
    container = client.containers.run(
        image, entrypoint=list(command), network_mode="none", detach=True
    )
    try:
        assert container.wait(timeout=60)["StatusCode"] == 0, container.logs()
        return str(container.logs(stderr=False).decode())
    finally:
        container.remove(force=True, v=True)


@pytest.mark.parametrize("service", sorted(PORTS))
def test_service_image_runs_as_non_root_and_declares_ports_and_data(
    images: dict[str, str], service: str
) -> None:
    client = docker.from_env()
    try:
        image = client.images.get(images[service])
        config = image.attrs["Config"]
        assert config["User"] == "tidelog"
        assert set(config["ExposedPorts"]) == {PORTS[service], METRICS_PORT}
        assert config["Entrypoint"][0] == f"tidelog-{service}"
        volumes = set(config.get("Volumes") or {})
        assert volumes == ({"/var/lib/tidelog"} if service == "broker" else set())
        assert run(client, images[service], "id", "-u").strip() == "10001"
        # Only the service's own distribution and what it needs: no other service, no pip.
        listed = run(
            client, images[service], "python3", "-c", "import importlib.metadata as m; "
            "print(' '.join(sorted(d.name for d in m.distributions())))",
        ).split()  # fmt: skip
        others = {f"tidelog-{s}" for s in PORTS if s != service}
        assert f"tidelog-{service}" in listed and "tidelog" in listed, listed
        assert not others & set(listed), listed
        assert "pip" not in listed, listed
        size = image.attrs["Size"]
        print(f"\n{images[service]}: {size / 1e6:.1f} MB")
        assert size < MAX_IMAGE_BYTES, f"{images[service]} is {size / 1e6:.1f} MB"
    finally:
        client.close()


def test_produce_and_consume_through_the_gateway_then_sigterm_stops_each_cleanly(
    cluster: ContainerCluster,
) -> None:
    assert cluster.gateway is not None and cluster.coordinator is not None
    gateway = cluster.gateway.address
    with AdminClient(bootstrap_servers=gateway) as admin:
        admin.create_topics([NewTopic("greetings", 3, 3)])
    cluster.wait_isr("greetings", [0, 1, 2], 30)
    sent = [f"hello {i}".encode() for i in range(300)]
    with Producer(bootstrap_servers=gateway, acks="all") as producer:
        for value in sent:
            producer.send("greetings", value)
        producer.flush(timeout=60)

    consumer = Consumer(
        "greetings",
        group_id="readers",
        bootstrap_servers=gateway,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=30_000,
    )
    received = []
    for record in consumer:
        received.append(record.value)
        if len(received) == len(sent):
            break
    assert sorted(received) == sorted(sent)

    # The Helm chart's exec probe (with TLS on) runs in each image: as its user, on its
    # read-only root filesystem, against the service in that container. A broker is
    # InSync only while in every ISR: a follower that fell behind on a loaded machine
    # drops out for a moment (seen in CI), and the kubelet probes again, so do we.
    for service in (cluster.gateway, *cluster.brokers.values(), cluster.coordinator):
        ready = "tidelog.broker.InSync" if service.role.startswith("broker") else ""
        deadline = time.monotonic() + PROBE_DEADLINE_S
        while True:
            probe = service.docker.exec_run(
                ["tidelog-health", f"--address={service.address}", f"--service={ready}"]
            )
            if probe.exit_code == 0 or time.monotonic() > deadline:
                break
            time.sleep(PROBE_RETRY_S)
        assert probe.exit_code == 0, (service.role, probe.output.decode(errors="replace"))

    # SIGTERM (`docker stop`) while the consumer is still a member with a stream open to the
    # gateway: the gateway drains and exits; exit code 0 means the service stopped itself
    # within the grace period (Docker sends SIGKILL after it: 137).
    stopped = {}
    for service in (cluster.gateway, *cluster.brokers.values(), cluster.coordinator):
        service.docker.stop(timeout=STOP_TIMEOUT_S)
        stopped[service.role] = service.docker.wait(timeout=30)["StatusCode"]
        if service is cluster.gateway:
            consumer.close()
    assert stopped == dict.fromkeys(stopped, 0), stopped
    for service in (cluster.gateway, *cluster.brokers.values(), cluster.coordinator):
        assert "Traceback" not in service.logs(), service.logs()[-3000:]
