"""TLS on every listener (issue 14): a cluster whose coordinator, brokers and
gateway serve only TLS, with a throwaway authority (tidelog_server.dev_certs).

- SDK clients with `security_protocol="SSL"` produce and consume, directly
  and through the gateway; replication of an acks=all, min.insync.replicas=2
  topic runs over the brokers' internal listeners, which require a
  certificate from the cluster's authority.
- A plain-text client, and a TLS client without a certificate on the
  internal listener, are refused.
- A certificate replaced on disk is served to the next handshake without a
  restart (Kubernetes rotates mounted secrets in place).
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tidelog.security import ChannelSecurity
from tidelog_server.dev_certs import DevCertificates, create_dev_certificates, issue
from tidelog_server.tls import ServerTls

from tests.integration.test_cli import kill_dev, start_dev, tidelog, wait_banner
from tests.support.cluster import ClusterProcesses, start_checked_cluster
from tests.support.coordinator import CoordinatorProcess
from tests.support.etcd import EtcdProcess
from tests.support.gateway import GatewayProcess
from tests.support.processes import (
    BrokerProcess,
    free_ports_in_a_row,
    start_broker,
    wait_serving,
)

pytestmark = pytest.mark.timeout(180)
PREFIX = "/tls"


@dataclass
class TlsCluster:
    certs: DevCertificates
    coordinator: CoordinatorProcess
    brokers: list[BrokerProcess]
    gateway: GatewayProcess

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers)

    def client_options(self) -> dict[str, str]:
        """What an SDK client needs: the authority (no client certificate)."""
        return {"security_protocol": "SSL", "ssl_cafile": str(self.certs.cafile)}


def tls_args(certs: DevCertificates) -> list[str]:
    return [
        "--tls-certfile", str(certs.server_certfile),
        "--tls-keyfile", str(certs.server_keyfile),
        "--tls-cafile", str(certs.cafile),
        # These clients present no identity (anonymity is refused by default
        # with TLS: tests/integration/test_acls.py).
        "--allow-anonymous", "true",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def cluster(etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    root = tmp_path_factory.mktemp("tls")
    certs = create_dev_certificates(root / "certs")
    args = tls_args(certs)
    # Not start_cluster: it waits for registration over plain text.
    with ClusterProcesses(etcd, PREFIX) as processes:
        coordinator = processes.add_coordinator(root, args)
        for _ in range(2):
            processes.add_broker(root, args)
        gateway = processes.add_gateway(root, args)
        yield TlsCluster(certs, coordinator, processes.brokers, gateway)


def test_ssl_clients_produce_and_consume_with_replication_over_tls(cluster: TlsCluster) -> None:
    options = cluster.client_options()
    with AdminClient(bootstrap_servers=cluster.bootstrap, **options) as admin:
        admin.create_topics([NewTopic("secure", 2, 2, {"min.insync.replicas": "2"})])
    # acks=all with min.insync.replicas=2: answered only once a follower has
    # fetched over the internal listener, with its certificate.
    for bootstrap in (cluster.bootstrap, cluster.gateway.address):
        with Producer(bootstrap_servers=bootstrap, acks="all", **options) as producer:
            for i in range(20):
                producer.send("secure", b"v%d" % i, key=b"k%d" % i)
            producer.flush(timeout=60)
    partitions = [TopicPartition("secure", p) for p in range(2)]
    for bootstrap in (cluster.bootstrap, cluster.gateway.address):
        with Consumer(bootstrap_servers=bootstrap, consumer_timeout_ms=3000, **options) as consumer:
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            values = sorted(r.value for r in consumer)
        assert values == sorted([b"v%d" % i for i in range(20)] * 2), bootstrap


def _health(address: str, security: ChannelSecurity) -> int:
    with security.channel(address) as channel:
        return (
            health_pb2_grpc.HealthStub(channel)
            .Check(health_pb2.HealthCheckRequest(), timeout=5)
            .status
        )


def test_plain_text_is_refused_on_every_listener(cluster: TlsCluster) -> None:
    plain = ChannelSecurity.from_options("PLAINTEXT")
    addresses = [cluster.coordinator.address, cluster.gateway.address]
    addresses += [b.address for b in cluster.brokers] + [
        b.internal_address for b in cluster.brokers
    ]
    for address in addresses:
        with pytest.raises(grpc.RpcError) as info:
            _health(address, plain)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, address  # type: ignore[attr-defined]


def test_the_internal_listener_requires_a_certificate_from_the_cluster(
    cluster: TlsCluster, tmp_path: Path
) -> None:
    broker = cluster.brokers[0]
    no_certificate = ChannelSecurity.from_options("SSL", str(cluster.certs.cafile))
    # The client listener takes a client without a certificate...
    assert _health(broker.address, no_certificate) == health_pb2.HealthCheckResponse.SERVING
    # ...the internal one does not,
    with pytest.raises(grpc.RpcError) as info:
        _health(broker.internal_address, no_certificate)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    # nor one from another authority,
    stranger = create_dev_certificates(tmp_path / "stranger")
    foreign = ChannelSecurity.from_options(
        "SSL",
        str(cluster.certs.cafile),
        str(stranger.client_certfile),
        str(stranger.client_keyfile),
    )
    with pytest.raises(grpc.RpcError) as info:
        _health(broker.internal_address, foreign)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    # but the cluster's own.
    member = ChannelSecurity.from_options(
        "SSL",
        str(cluster.certs.cafile),
        str(cluster.certs.client_certfile),
        str(cluster.certs.client_keyfile),
    )
    assert _health(broker.internal_address, member) == health_pb2.HealthCheckResponse.SERVING


def _served_common_name(address: str, cafile: Path) -> str:
    """The subject CN of the certificate a new TLS handshake is given."""
    context = ssl.create_default_context(cafile=str(cafile))
    context.set_alpn_protocols(["h2"])
    host, _, port = address.rpartition(":")
    with (
        socket.create_connection((host, int(port)), timeout=5) as sock,
        context.wrap_socket(sock, server_hostname=host) as tls,
    ):
        cert = tls.getpeercert()
    assert cert is not None
    return next(v for rdn in cert["subject"] for k, v in rdn if k == "commonName")


def test_a_certificate_replaced_on_disk_is_served_without_a_restart(tmp_path: Path) -> None:
    certs = create_dev_certificates(tmp_path / "certs")
    broker = start_broker(tmp_path / "broker", extra_args=tls_args(certs))
    try:
        assert _served_common_name(broker.address, certs.cafile) == "tidelog-server"
        # Rotate in place, as Kubernetes updates a mounted secret: a new pair
        # from the same authority, written next to the old and moved over it.
        ca_cert, ca_key = _load_authority(certs)
        issue(tmp_path, "rotated", "tidelog-server-rotated", ca_cert, ca_key, ("127.0.0.1",))
        shutil.move(tmp_path / "rotated-key.pem", certs.server_keyfile)
        shutil.move(tmp_path / "rotated.pem", certs.server_certfile)
        deadline = time.monotonic() + 30
        while _served_common_name(broker.address, certs.cafile) != "tidelog-server-rotated":
            assert time.monotonic() < deadline, "the new certificate was never served"
            time.sleep(0.2)
        wait_serving(
            broker.address,
            10,
            security=ServerTls(
                certs.server_certfile, certs.server_keyfile, certs.cafile
            ).channel_security(),
        )
    finally:
        broker.stop()


def _load_authority(certs: DevCertificates):  # type: ignore[no-untyped-def]
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate(certs.cafile.read_bytes())
    key = serialization.load_pem_private_key(
        (certs.directory / "ca-key.pem").read_bytes(), password=None
    )
    return cert, key


def test_client_options_are_checked_when_the_client_is_made(tmp_path: Path) -> None:
    # Passwords travel over TLS only: there is no SASL_PLAINTEXT.
    with pytest.raises(ValueError, match="security_protocol must be one of"):
        Producer(bootstrap_servers="127.0.0.1:1", security_protocol="SASL_PLAINTEXT")
    with pytest.raises(ValueError, match="SASL_SSL needs sasl_plain_username"):
        Producer(bootstrap_servers="127.0.0.1:1", security_protocol="SASL_SSL")
    with pytest.raises(ValueError, match=r"ssl_cafile=.*cannot be read"):
        Producer(
            bootstrap_servers="127.0.0.1:1",
            security_protocol="SSL",
            ssl_cafile=str(tmp_path / "missing.pem"),
        )
    with pytest.raises(ValueError, match="ssl_certfile and ssl_keyfile go together"):
        Producer(bootstrap_servers="127.0.0.1:1", security_protocol="SSL", ssl_certfile="x")
    with pytest.raises(ValueError, match="security_protocol is PLAINTEXT"):
        Producer(bootstrap_servers="127.0.0.1:1", ssl_cafile="x")


def test_tidelog_dev_tls_runs_the_whole_cluster_encrypted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_ports_in_a_row(3)
    dev = start_dev(tmp_path / "dev", port, "--brokers", "2", "--tls")
    children: list[psutil.Process] = []
    try:
        banner = wait_banner(dev).decode()
        children = psutil.Process(dev.pid).children(recursive=True)
        exported = re.search(
            r"export (TIDELOG_SECURITY_PROTOCOL=SSL TIDELOG_SSL_CAFILE=\S+)", banner
        )
        assert exported, banner
        bootstrap = f"127.0.0.1:{port}"
        cafile = exported.group(1).split("TIDELOG_SSL_CAFILE=")[1]
        # The CLI with Kafka's option names...
        tidelog(
            "topics", "create", "tls-dev", "--replication-factor", "2",
            "--security-protocol", "SSL", "--ssl-cafile", cafile,
            bootstrap=bootstrap,
        )  # fmt: skip
        # ...and, as the banner says, with nothing but the exports.
        for assignment in exported.group(1).split():
            name, _, value = assignment.partition("=")
            monkeypatch.setenv(name, value)
        tidelog("produce", "tls-dev", bootstrap=bootstrap, stdin=b"one\ntwo\n")
        consumed = tidelog(
            "consume", "tls-dev", "--from-beginning", "--timeout-ms", "3000", bootstrap=bootstrap
        )
        assert consumed.stdout.split() == [b"one", b"two"]
        # Plain text is refused.
        with pytest.raises(grpc.RpcError):
            _health(bootstrap, ChannelSecurity.from_options("PLAINTEXT"))
        dev.send_signal(signal.SIGINT)
        assert dev.wait(timeout=60) == 0
    finally:
        kill_dev(dev, children)


def test_the_record_api_through_the_gateway_reaches_tls_brokers(cluster: TlsCluster) -> None:
    """The gateway's own clients (Records) present its certificate to the brokers."""
    from tidelog.v1 import records_pb2, records_pb2_grpc

    with AdminClient(bootstrap_servers=cluster.bootstrap, **cluster.client_options()) as admin:
        admin.create_topics([NewTopic("secure-records", 1, 2)])
    security = ChannelSecurity.from_options("SSL", str(cluster.certs.cafile))
    with security.channel(cluster.gateway.address) as channel:
        stub = records_pb2_grpc.RecordsStub(channel)
        request = records_pb2.RecordsProduceRequest(
            correlation_id=1,
            records=[
                records_pb2.ProduceRecord(topic="secure-records", value=b"r%d" % i)
                for i in range(5)
            ],
            acks=records_pb2.ACKS_ALL,
        )
        answers = list(stub.Produce(iter([request]), timeout=60))
        results = [r for a in answers for r in a.results]
        assert len(results) == 5 and all(not r.HasField("error") for r in results), answers
        consume = records_pb2.ConsumeRequest(
            positions=[records_pb2.ConsumePosition(topic="secure-records", partition=0, offset=0)],
            credit_records=5,
        )
        got: list[bytes] = []
        call = stub.Consume(iter([consume]), timeout=60)
        for response in call:
            got.extend(r.value for r in response.records)
            if len(got) >= 5:
                call.cancel()
                break
    assert got == [b"r%d" % i for i in range(5)]


def test_services_reach_an_etcd_that_requires_client_certificates(tmp_path: Path) -> None:
    """etcd with TLS and --client-cert-auth: the services connect with
    --etcd-cafile/--etcd-certfile/--etcd-keyfile, and a client without a
    certificate from etcd's authority gets nothing."""
    import asyncio

    from tidelog_server.etcd.client import EtcdTls, connect, is_unavailable

    from tests.support.etcd import EtcdServerTls

    certs = create_dev_certificates(tmp_path / "certs")
    etcd = EtcdProcess.start(
        tmp_path / "etcd",
        tls=EtcdServerTls(certs.server_certfile, certs.server_keyfile, certs.cafile),
    )
    etcd_args = [
        "--etcd-cafile", str(certs.cafile),
        "--etcd-certfile", str(certs.client_certfile),
        "--etcd-keyfile", str(certs.client_keyfile),
    ]  # fmt: skip
    cluster: ClusterProcesses | None = None
    try:
        cluster = start_checked_cluster(
            tmp_path, etcd=etcd, prefix=PREFIX, service_args=etcd_args, topic="etcd-tls"
        )

        async def read(tls: EtcdTls | None) -> object:
            client = connect(etcd.endpoint, tls)
            try:
                return await asyncio.wait_for(client.get(b"/anything"), 10)
            finally:
                await client.close()

        assert (
            asyncio.run(read(EtcdTls(certs.cafile, certs.client_certfile, certs.client_keyfile)))
            is None
        )
        stranger = create_dev_certificates(tmp_path / "stranger")
        for refused in (
            None,  # plain text
            EtcdTls(certs.cafile),  # no client certificate
            EtcdTls(certs.cafile, stranger.client_certfile, stranger.client_keyfile),
        ):
            with pytest.raises(Exception) as refusal:
                asyncio.run(read(refused))
            # A refusal (the TLS handshake fails: UNAVAILABLE, or no answer
            # within the deadline), not some other error of the test's.
            assert is_unavailable(refusal.value) or isinstance(refusal.value, TimeoutError), repr(
                refusal.value
            )
    finally:
        if cluster is not None:
            cluster.stop()
        etcd.stop()


def test_the_coordinator_reaches_tls_brokers_for_what_only_they_know(cluster: TlsCluster) -> None:
    # The coordinator asks brokers for DeleteRecords and for the log figures
    # of a DescribeTopics sent to it directly. Its calls went out in plain
    # text: refused by every TLS broker, so DeleteRecords failed and each
    # partition's figures were unknown.
    options = cluster.client_options()
    with AdminClient(bootstrap_servers=cluster.bootstrap, **options) as admin:
        admin.create_topics([NewTopic("coordinated", 1, 2)])
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all", **options) as producer:
        for i in range(5):
            producer.send("coordinated", b"v%d" % i)
        producer.flush(timeout=60)
    tp = TopicPartition("coordinated", 0)
    with AdminClient(bootstrap_servers=cluster.coordinator.address, **options) as admin:
        (described,) = admin.describe_topics(["coordinated"])
        (partition,) = described.partitions
        assert partition.error is None, partition.error
        assert partition.log_end_offset == 5
        assert admin.delete_records({tp: 2}) == {tp: 2}
        (described,) = admin.describe_topics(["coordinated"])
        assert described.partitions[0].log_start_offset == 2
