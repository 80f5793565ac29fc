"""Fixtures for the cluster in containers: a Docker engine, the images, a cluster per test.

`images` (once per session) finds the Docker engine (DOCKER_HOST, else the one
tools/docker-engine.sh started or the system's) and runs tools/images.py, which builds the
service images and etcd's only when their inputs changed; without an engine, or where the
images cannot be built (no debootstrap, not root), every test here is skipped with the
reason and how to fix it (`.ci/run` starts an engine; so does `make images`).

`cluster` starts etcd, a coordinator, three brokers and a gateway as containers
(tests/containers/cluster.py) and removes them and their volumes at the end. Containers
and volumes are named after the run and the test, and a last sweep at the end of the
session removes anything labelled with the run's id that a test left behind.

All the tests here share the engine and the images: each module carries
`pytest.mark.xdist_group("containers")` so that pytest-xdist runs them in one worker (and
builds the images once), and a timeout that leaves room for a first, cold build.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.containers.cluster import RUN_LABEL, ContainerCluster

# The reaper container (ryuk) would have to be pulled, and no registry is reachable: each
# test removes what it made, and the session's sweep removes the rest.
os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"

ROOT = Path(__file__).resolve().parents[2]
HOW_TO_GET_ONE = (
    "start one with `tools/docker-engine.sh start` (as root: it installs docker.io and "
    "starts dockerd) and export the DOCKER_HOST it prints; .ci/run does this"
)
_clusters = itertools.count()


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """The engine's address, put in DOCKER_HOST for testcontainers and docker-py."""
    if shutil.which("docker") is None:
        pytest.skip(f"no docker command: {HOW_TO_GET_ONE}")
    found = subprocess.run(
        [str(ROOT / "tools/docker-engine.sh"), "host"], capture_output=True, text=True
    )
    if found.returncode != 0:
        pytest.skip(f"no Docker engine answers: {HOW_TO_GET_ONE}")
    before = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = found.stdout.strip()
    yield os.environ["DOCKER_HOST"]
    if before is None:
        del os.environ["DOCKER_HOST"]
    else:
        os.environ["DOCKER_HOST"] = before


@pytest.fixture(scope="session")
def images(docker_host: str) -> dict[str, str]:
    """name (broker, coordinator, gateway, etcd) -> image tag, built when missing."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools/images.py"), "--json"],
        capture_output=True,
        text=True,
    )
    if done.returncode == 3:
        pytest.skip(f"the images cannot be built here: {done.stderr.strip()}")
    assert done.returncode == 0, f"tools/images.py failed:\n{done.stderr[-4000:]}"
    built = json.loads(done.stdout)
    return {name: info["image"] for name, info in built.items()}


@pytest.fixture(scope="session")
def run_id(docker_host: str) -> Iterator[str]:
    """This session's id in container and volume names; at the end, whatever still carries
    it is removed."""
    run = uuid.uuid4().hex[:8]
    yield run
    client = docker.from_env()
    try:
        selector = {"label": f"{RUN_LABEL}={run}"}
        for container in client.containers.list(all=True, filters=selector):
            container.remove(force=True, v=True)
        for volume in client.volumes.list(filters=selector):
            volume.remove(force=True)
    finally:
        client.close()


@pytest.fixture
def cluster(images: dict[str, str], run_id: str) -> Iterator[ContainerCluster]:
    """etcd, a coordinator, three brokers and a gateway, as containers."""
    containers = ContainerCluster(images, run_id, f"c{next(_clusters)}")
    try:
        containers.start(brokers=3)
        yield containers
    finally:
        containers.stop()
