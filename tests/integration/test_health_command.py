"""`tidelog-health`, the exec probe of the Helm chart with TLS on: run as a
process against a real gRPC server with Tidelog's TLS (tidelog_server.tls,
client certificates required) and the standard health service, with a
certificate that names only a wildcard DNS name (as in Kubernetes: never
127.0.0.1, the address the probe dials)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tidelog_server.dev_certs import DevCertificates, create_dev_certificates
from tidelog_server.tls import ServerTls, add_port

pytestmark = pytest.mark.timeout(120)

HEALTH = str(Path(sys.executable).parent / "tidelog-health")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return create_dev_certificates(
        tmp_path_factory.mktemp("certs"), hosts=("*.rel-tidelog-broker-headless.svc.test",)
    )


@pytest.fixture(scope="module")
def server(certs: DevCertificates) -> Iterator[str]:
    """A TLS server requiring client certificates; "" SERVING, "down" NOT_SERVING."""
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.set("down", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, grpc_server)
    tls = ServerTls(certs.server_certfile, certs.server_keyfile, certs.cafile, "require")
    port = add_port(grpc_server, "127.0.0.1:0", tls)  # type: ignore[arg-type]
    assert port
    grpc_server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        grpc_server.stop(grace=None)


def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HEALTH, *args], capture_output=True, text=True, timeout=60, check=False)


def tls(certs: DevCertificates) -> list[str]:
    return [
        f"--tls-cafile={certs.cafile}",
        f"--tls-certfile={certs.server_certfile}",
        f"--tls-keyfile={certs.server_keyfile}",
    ]


def test_serving_over_tls_with_the_services_own_certificate(
    server: str, certs: DevCertificates
) -> None:
    result = probe(f"--address={server}", *tls(certs))
    assert result.returncode == 0, result.stderr
    assert "SERVING" in result.stdout


def test_a_service_not_serving_fails_the_probe(server: str, certs: DevCertificates) -> None:
    result = probe(f"--address={server}", "--service=down", *tls(certs))
    assert result.returncode == 1
    assert "NOT_SERVING" in result.stderr


def test_without_a_client_certificate_the_listener_refuses_the_probe(
    server: str, certs: DevCertificates
) -> None:
    result = probe(f"--address={server}", f"--tls-cafile={certs.cafile}", "--timeout-s=5")
    assert result.returncode == 1
    assert "UNAVAILABLE" in result.stderr


def test_a_name_the_certificate_does_not_carry_fails_the_probe(
    server: str, certs: DevCertificates
) -> None:
    result = probe(f"--address={server}", "--server-name=other.test", "--timeout-s=5", *tls(certs))
    assert result.returncode == 1
    assert "UNAVAILABLE" in result.stderr


def test_a_plaintext_probe_of_a_tls_listener_fails(server: str) -> None:
    result = probe(f"--address={server}", "--timeout-s=5")
    assert result.returncode == 1


def test_a_missing_certificate_file_is_named(server: str, tmp_path: Path) -> None:
    missing = tmp_path / "ca.crt"
    result = probe(f"--address={server}", f"--tls-cafile={missing}")
    assert result.returncode == 1
    assert str(missing) in result.stderr


def test_a_name_in_the_certificates_wildcard_domain_passes(
    server: str, certs: DevCertificates
) -> None:
    """What the chart passes: a name its peers dial, covered by the wildcard."""
    name = "--server-name=health.rel-tidelog-broker-headless.svc.test"
    result = probe(f"--address={server}", name, *tls(certs))
    assert result.returncode == 0, result.stderr
