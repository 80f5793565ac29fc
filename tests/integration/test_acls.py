"""Identity, ACLs and quotas (issue 14), on real processes with TLS.

The cluster (etcd, a coordinator, a broker, a gateway) requires client
certificates, so every client has a principal: User:<CN of its
certificate>, or User:<name> when it also sends a user name and password
(SASL_SSL). It runs with --allow-everyone-if-no-acl-found false and
--super-users User:admin; the services share one certificate (CN
tidelog-server), a super user by default, for their own calls.

A second, smaller deployment (etcd and one coordinator, TLS without client
certificates) shows that anonymous clients are refused by default with TLS,
and that credentials are checked against a salted hash.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tidelog import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tidelog.admin import AclBinding, AclBindingFilter
from tidelog.errors import (
    ERROR_CODE_METADATA_KEY,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    SaslAuthenticationError,
    TopicAuthorizationFailedError,
)
from tidelog.records import encode_batch
from tidelog.security import ChannelSecurity
from tidelog.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    log_pb2,
    log_pb2_grpc,
    records_pb2,
    records_pb2_grpc,
)
from tidelog_server.dev_certs import DevCertificates
from tidelog_server.etcd import connect
from tidelog_server.etcd.keys import Keys
from tidelog_server.quotas import THROTTLE_TIME_METADATA_KEY

from tests.integration.test_cli import tidelog
from tests.support.coordinator import CoordinatorProcess, start_coordinator
from tests.support.etcd import EtcdProcess
from tests.support.processes import start_broker
from tests.support.secure_cluster import (
    SecuredServices,
    eventually,
    issue_certificates,
    secured_services,
    tls_args,
)

pytestmark = pytest.mark.timeout(240)
PREFIX = "/acls"


@dataclass
class SecureCluster(SecuredServices):
    etcd: EtcdProcess

    @property
    def bootstrap(self) -> str:
        return self.broker.address

    def options(self, who: str, **extra: str) -> dict[str, str]:
        """SDK options of a client whose certificate's CN is `who`."""
        return {
            "security_protocol": extra.pop("security_protocol", "SSL"),
            "ssl_cafile": str(self.certs.cafile),
            "ssl_certfile": str(self.certs.directory / f"{who}.pem"),
            "ssl_keyfile": str(self.certs.directory / f"{who}-key.pem"),
            **extra,
        }

    def admin(self, who: str = "admin", **extra: str) -> AdminClient:
        return AdminClient(bootstrap_servers=self.bootstrap, **self.options(who, **extra))


@pytest.fixture(scope="module")
def cluster(etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    root = tmp_path_factory.mktemp("acls")
    with secured_services(
        etcd.endpoint, root, prefix=PREFIX, users=("alice", "bob", "client"), session_ttl_s=3
    ) as services:
        yield SecureCluster(
            services.certs, services.coordinator, services.broker, services.gateway, etcd
        )


def _grant(cluster: SecureCluster, *bindings: AclBinding) -> None:
    with cluster.admin() as admin:
        admin.create_acls(bindings)


def _create(cluster: SecureCluster, *names: str) -> None:
    with cluster.admin() as admin:
        admin.create_topics([NewTopic(name, 1, 1) for name in names])


def _produce(cluster: SecureCluster, who: str, topic: str, bootstrap: str = "") -> None:
    with Producer(
        bootstrap_servers=bootstrap or cluster.bootstrap, **cluster.options(who)
    ) as producer:
        producer.send(topic, b"hello").get(timeout=30)


def _read(cluster: SecureCluster, who: str, topic: str, bootstrap: str = "") -> list[bytes]:
    with Consumer(
        bootstrap_servers=bootstrap or cluster.bootstrap,
        consumer_timeout_ms=3000,
        **cluster.options(who),
    ) as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        return [record.value for record in consumer]


def test_a_principal_allowed_to_write_cannot_read(cluster: SecureCluster) -> None:
    _create(cluster, "write-only")
    _grant(cluster, AclBinding("User:alice", "Write", "topic", "write-only"))
    for bootstrap in (cluster.bootstrap, cluster.gateway.address):
        eventually(lambda b=bootstrap: _produce(cluster, "alice", "write-only", b))  # type: ignore[misc]
        with pytest.raises(TopicAuthorizationFailedError) as info:
            _read(cluster, "alice", "write-only", bootstrap)
        message = str(info.value)
        assert "User:alice" in message and "Read" in message and "'write-only'" in message
    # Bob has no ACL on the topic: not even its metadata (Describe), so no write.
    with pytest.raises(TopicAuthorizationFailedError, match=r"User:bob .* topic 'write-only'"):
        _produce(cluster, "bob", "write-only")
    # The super user reads what alice wrote.
    assert _read(cluster, "admin", "write-only") == [b"hello", b"hello"]


def test_deny_wins_over_a_prefixed_allow(cluster: SecureCluster) -> None:
    _create(cluster, "pub-open", "pub-secret", "other")
    for topic in ("pub-open", "pub-secret"):
        _produce(cluster, "admin", topic)
    _grant(
        cluster,
        AclBinding("User:bob", "Read", "topic", "pub-", pattern_type="prefixed"),
        AclBinding("User:bob", "Read", "topic", "pub-secret", permission="deny"),
    )
    assert eventually(lambda: _read(cluster, "bob", "pub-open")) == [b"hello"]
    with pytest.raises(TopicAuthorizationFailedError, match="denied by the ACL"):
        _read(cluster, "bob", "pub-secret")
    # The prefix does not reach a topic outside it.
    with pytest.raises(TopicAuthorizationFailedError, match=r"(Describe|Read) topic 'other'"):
        _read(cluster, "bob", "other")
    # Listings are filtered to what bob may Describe: implied by the prefixed
    # Read (a deny of Read does not deny Describe, as in Kafka), not "other".
    with cluster.admin("bob") as admin:
        assert admin.list_topics() == ["pub-open", "pub-secret"]


def test_an_acl_change_takes_effect_at_once(cluster: SecureCluster) -> None:
    _create(cluster, "late")
    with cluster.admin("alice") as admin:
        with pytest.raises(TopicAuthorizationFailedError, match="Describe topic 'late'"):
            admin.describe_topics(["late"])
        with cluster.admin() as root:
            root.create_acls([AclBinding("User:alice", "Describe", "topic", "late")])
            granted = time.monotonic()
            # Generous deadline: every service follows the ACL prefix with an
            # etcd watch, so this normally takes a few milliseconds.
            eventually(lambda: admin.describe_topics(["late"]), deadline_s=10)
            waited_s = time.monotonic() - granted
            print(f"ACL in force after {waited_s * 1000:.0f} ms")
            root.delete_acls([AclBindingFilter(principal="User:alice", resource_name="late")])
        eventually(lambda: _raises(TopicAuthorizationFailedError, admin.describe_topics, ["late"]))


def _raises(kind: type[Exception], fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except kind:
        return
    raise AssertionError(f"{fn} did not raise {kind.__name__}")


def test_super_users_and_cluster_operations(cluster: SecureCluster) -> None:
    # Only the super user (and whoever holds Create on the cluster) creates topics.
    with cluster.admin("bob") as admin:
        with pytest.raises(TopicAuthorizationFailedError, match="Create topic 'bobs'"):
            admin.create_topics([NewTopic("bobs", 1, 1)])
        with pytest.raises(ClusterAuthorizationFailedError, match="Alter cluster"):
            admin.create_acls([AclBinding("User:bob", "All", "topic", "*")])
    _grant(cluster, AclBinding("User:bob", "Create", "cluster", "tidelog-cluster"))
    with cluster.admin("bob") as admin:
        eventually(lambda: admin.create_topics([NewTopic("bobs", 1, 1)]))
    with cluster.admin() as admin:
        assert admin.describe_acls(AclBindingFilter(principal="User:bob", resource_type="cluster"))
        admin.delete_topics(["bobs"])


def test_metadata_auto_creates_only_what_the_caller_may_create(
    cluster: SecureCluster, tmp_path: Path
) -> None:
    """Kafka's rule: Metadata with auto-creation on creates a topic only for
    a caller with Create on it (or on the cluster). Allowed Describe but not
    Create, the caller gets UNKNOWN_TOPIC_OR_PARTITION and nothing is
    created; without Describe, TOPIC_AUTHORIZATION_FAILED."""
    _grant(
        cluster,
        AclBinding("User:alice", "Describe", "topic", "auto-", pattern_type="prefixed"),
        AclBinding("User:alice", "Create", "topic", "auto-mine"),
    )
    # A broker that auto-creates topics (the module's does not).
    args = tls_args(
        cluster.certs,
        "--tls-client-auth", "require",
        "--allow-everyone-if-no-acl-found", "false",
        "--super-users", "User:admin",
    )  # fmt: skip
    creator = start_broker(
        tmp_path / "broker-1",
        extra_args=[
            "--etcd", cluster.etcd.endpoint, "--etcd-prefix", PREFIX, "--auto-create-topics", *args
        ],
        broker_id=1,
    )  # fmt: skip
    try:
        security = ChannelSecurity.from_options(**_channel_options(cluster, "alice"))

        def metadata(address: str, topic: str) -> log_pb2.TopicMetadata:
            with security.channel(address) as channel:
                reply = log_pb2_grpc.LogStub(channel).Metadata(
                    log_pb2.MetadataRequest(topics=[topic], allow_auto_topic_creation=True),
                    timeout=60,
                )
            return reply.topics[0]

        def created(topic: str) -> None:
            assert metadata(creator.address, topic).partitions

        eventually(lambda: created("auto-mine"))  # once the ACLs reached the broker
        for address, topic in (
            (creator.address, "auto-theirs"),
            (cluster.gateway.address, "auto-gw"),
        ):
            answer = metadata(address, topic)
            assert answer.error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION, (address, answer)
        with pytest.raises(grpc.RpcError) as refused:
            metadata(creator.address, "secret")
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert dict(refused.value.trailing_metadata())[ERROR_CODE_METADATA_KEY] == (
            "TOPIC_AUTHORIZATION_FAILED"
        )
        with cluster.admin() as admin:
            topics = admin.list_topics()
            assert "auto-mine" in topics
            assert {"auto-theirs", "auto-gw", "secret"}.isdisjoint(topics), topics
            admin.delete_topics(["auto-mine"])
    finally:
        creator.stop()


def test_acls_cli_adds_lists_and_removes(
    cluster: SecureCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "TIDELOG_SECURITY_PROTOCOL": "SSL",
        "TIDELOG_SSL_CAFILE": str(cluster.certs.cafile),
        "TIDELOG_SSL_CERTFILE": str(cluster.certs.directory / "admin.pem"),
        "TIDELOG_SSL_KEYFILE": str(cluster.certs.directory / "admin-key.pem"),
    }.items():
        monkeypatch.setenv(name, value)
    tidelog(
        "acls", "add", "--allow-principal", "User:carol", "--operation", "Read",
        "--operation", "Describe", "--topic", "cli-", "--resource-pattern-type", "prefixed",
        bootstrap=cluster.bootstrap,
    )  # fmt: skip
    listed = tidelog("acls", "list", "--topic", "cli-", bootstrap=cluster.bootstrap)
    lines = listed.stdout.decode().splitlines()
    assert lines == [
        "allow User:carol Describe from * on topic:prefixed:cli-",
        "allow User:carol Read from * on topic:prefixed:cli-",
    ]
    removed = tidelog(
        "acls", "remove", "--allow-principal", "User:carol", "--operation", "Read",
        "--topic", "cli-", bootstrap=cluster.bootstrap,
    )  # fmt: skip
    assert removed.stdout.decode().count("removed") == 1
    listed = tidelog("acls", "list", "--principal", "User:carol", bootstrap=cluster.bootstrap)
    assert listed.stdout.decode().splitlines() == [
        "allow User:carol Describe from * on topic:prefixed:cli-"
    ]
    # Users: the password from stdin, listed with its mechanism only.
    tidelog(
        "users",
        "add",
        "dave",
        "--password-stdin",
        stdin=b"pw-of-dave\n",
        bootstrap=cluster.bootstrap,
    )
    users = tidelog("users", "list", bootstrap=cluster.bootstrap).stdout.decode()
    assert "dave  scrypt-n16384-r8-p1" in users and "pw-of-dave" not in users
    tidelog("users", "remove", "dave", bootstrap=cluster.bootstrap)
    assert "dave" not in tidelog("users", "list", bootstrap=cluster.bootstrap).stdout.decode()
    # Quotas: set, merged, described, removed.
    tidelog(
        "quotas", "set", "--principal", "User:dave", "--producer-byte-rate", "1000",
        bootstrap=cluster.bootstrap,
    )  # fmt: skip
    tidelog(
        "quotas", "set", "--principal", "User:dave", "--request-rate", "5",
        bootstrap=cluster.bootstrap,
    )  # fmt: skip
    described = tidelog("quotas", "describe", bootstrap=cluster.bootstrap).stdout.decode()
    assert "User:dave: producer_byte_rate=1000, request_rate=5" in described
    tidelog(
        "quotas", "set", "--principal", "User:dave", "--producer-byte-rate", "0",
        "--request-rate", "0", bootstrap=cluster.bootstrap,
    )  # fmt: skip
    assert (
        "User:dave"
        not in tidelog("quotas", "describe", bootstrap=cluster.bootstrap).stdout.decode()
    )
    # Refused as the command line's fault, naming what is wrong.
    bad = tidelog(
        "acls", "add", "--allow-principal", "carol", "--operation", "Read", "--topic", "t",
        bootstrap=cluster.bootstrap, check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and b"User:<name>" in bad.stderr


def test_sasl_credentials_are_checked_against_a_salted_hash(cluster: SecureCluster) -> None:
    password = "correct horse battery staple"
    with cluster.admin() as admin:
        assert admin.alter_user_credentials({"carol": password}) == {"carol": None}
        assert admin.describe_user_credentials() == {"carol": "scrypt-n16384-r8-p1"}
        admin.create_topics([NewTopic("carols", 1, 1)])
    _grant(cluster, AclBinding("User:carol", "Describe", "topic", "carols"))

    def as_carol(secret: str) -> AdminClient:
        return cluster.admin(
            "client",
            security_protocol="SASL_SSL",
            sasl_plain_username="carol",
            sasl_plain_password=secret,
        )

    # The certificate says User:client, the credentials User:carol: they win.
    with as_carol(password) as admin:
        names = eventually(lambda: [t.name for t in admin.describe_topics(["carols"])])
        assert names == ["carols"]
    with as_carol("wrong") as admin, pytest.raises(SaslAuthenticationError, match="carol"):
        admin.describe_topics(["carols"])
    # etcd holds a salted hash: neither the password nor anything derived
    # from it without the salt.
    stored = asyncio.run(_etcd_value(cluster.etcd.endpoint, Keys(PREFIX).user("carol")))
    assert password.encode() not in stored
    assert b"scrypt" in stored and b"salt" in stored
    with cluster.admin() as admin:
        admin.alter_user_credentials(deletions=["carol"])
    with as_carol(password) as admin:
        eventually(lambda: _raises(SaslAuthenticationError, admin.describe_topics, ["carols"]))


async def _etcd_value(endpoint: str, key: bytes) -> bytes:
    client = connect(endpoint)
    try:
        got = await client.get(key)
        assert got is not None
        return bytes(got.value)
    finally:
        await client.close()


def test_a_produce_quota_slows_the_producer_and_reports_the_throttle(
    cluster: SecureCluster,
) -> None:
    rate = 100_000  # bytes per second
    _create(cluster, "quota")
    _grant(cluster, AclBinding("User:alice", "Write", "topic", "quota"))
    with cluster.admin() as admin:
        admin.alter_client_quotas("User:alice", {"producer_byte_rate": rate})
        assert admin.describe_client_quotas("User:alice")[0].values == {"producer_byte_rate": rate}
    security = ChannelSecurity.from_options(**_channel_options(cluster, "alice"))
    batch = encode_batch([b"x" * 1000] * 20)  # ~20 KB a request
    throttles: list[int] = []
    acked = 0
    # A client that ignores the throttle time, with a producer's bound on
    # requests in flight: only the broker's holding back slows it. Unbounded,
    # the HTTP/2 windows take megabytes in the first seconds, which the
    # throttled broker then needs a minute to work through.
    in_flight = threading.Semaphore(8)
    with security.channel(cluster.bootstrap) as channel:
        stub = log_pb2_grpc.LogStub(channel)
        started = time.monotonic()

        def requests() -> Iterator[log_pb2.ProduceRequest]:
            for i in range(10_000):
                while not in_flight.acquire(timeout=0.1):
                    if time.monotonic() - started > 4:
                        return
                if time.monotonic() - started > 4:
                    return
                yield log_pb2.ProduceRequest(
                    correlation_id=i,
                    acks=1,
                    partitions=[
                        log_pb2.PartitionRecords(topic="quota", partition=0, records=batch)
                    ],
                )

        for response in stub.Produce(requests(), timeout=60):
            assert not response.partitions[0].HasField("error"), response
            acked += len(batch)
            throttles.append(response.throttle_time_ms)
            in_flight.release()
        elapsed = time.monotonic() - started
    assert max(throttles) > 0, "the broker never reported a throttle time"
    # Unthrottled, loopback takes hundreds of MB/s; throttled, the rate stays
    # near the quota. Generous: twice the quota, plus one window's burst.
    assert acked < 2 * rate * elapsed + 10 * rate, (acked, elapsed)
    with cluster.admin() as admin:
        admin.alter_client_quotas("User:alice", {"producer_byte_rate": 0})
        assert admin.describe_client_quotas("User:alice") == []


def _channel_options(cluster: SecureCluster, who: str) -> dict[str, Any]:
    options = cluster.options(who)
    return {
        "security_protocol": options["security_protocol"],
        "ssl_cafile": options["ssl_cafile"],
        "ssl_certfile": options["ssl_certfile"],
        "ssl_keyfile": options["ssl_keyfile"],
    }


@pytest.fixture(scope="module")
def open_tls(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[DevCertificates, CoordinatorProcess]]:
    """A coordinator with TLS, no client certificates, default options."""
    root = tmp_path_factory.mktemp("open")
    certs = issue_certificates(root / "certs", ())
    coordinator = start_coordinator(
        etcd.endpoint, root / "logs", prefix="/open", coordinator_id="o0",
        session_ttl_s=3, extra_args=tuple(tls_args(certs, "--super-users", "User:root")),
    )  # fmt: skip
    try:
        yield certs, coordinator
    finally:
        coordinator.stop()


def test_anonymous_clients_are_refused_by_default_with_tls(
    open_tls: tuple[DevCertificates, CoordinatorProcess],
) -> None:
    certs, coordinator = open_tls
    tls = {"security_protocol": "SSL", "ssl_cafile": str(certs.cafile)}
    with (
        AdminClient(bootstrap_servers=coordinator.address, **tls) as admin,
        pytest.raises(SaslAuthenticationError, match="anonymous clients are not allowed"),
    ):
        admin.list_topics()
    # Health checks need no identity (probes).
    channel = ChannelSecurity.from_options("SSL", str(certs.cafile)).channel(coordinator.address)
    with channel:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    # A password over plain text is never sent: the SDK refuses the option.
    with pytest.raises(ValueError, match="SASL_SSL"):
        AdminClient(
            bootstrap_servers=coordinator.address,
            sasl_plain_username="root",
            sasl_plain_password="x",
        )


def test_a_group_needs_read_on_the_group(cluster: SecureCluster) -> None:
    _create(cluster, "grouped")
    _produce(cluster, "admin", "grouped")
    _grant(cluster, AclBinding("User:bob", "Read", "topic", "grouped"))
    options = cluster.options("bob")
    with Consumer(
        bootstrap_servers=cluster.bootstrap, group_id="bobs-group", consumer_timeout_ms=20_000,
        auto_offset_reset="earliest", **options,
    ) as consumer:  # fmt: skip
        consumer.subscribe(["grouped"])
        with pytest.raises(GroupAuthorizationFailedError, match="Read group 'bobs-group'"):
            list(consumer)
    _grant(cluster, AclBinding("User:bob", "Read", "group", "bobs-", pattern_type="prefixed"))
    with Consumer(
        bootstrap_servers=cluster.bootstrap, group_id="bobs-group", consumer_timeout_ms=5_000,
        auto_offset_reset="earliest", **options,
    ) as consumer:  # fmt: skip
        consumer.subscribe(["grouped"])
        assert [r.value for r in eventually(lambda: list(consumer) or _fail())] == [b"hello"]


def _fail() -> list[Any]:
    raise AssertionError("nothing consumed yet")


def test_a_fetch_quota_holds_the_answers_back(cluster: SecureCluster) -> None:
    rate = 200_000  # bytes per second
    _create(cluster, "fquota")
    with Producer(bootstrap_servers=cluster.bootstrap, **cluster.options("admin")) as producer:
        for _ in range(3000):
            producer.send("fquota", b"y" * 1000)
        producer.flush(timeout=60)
    _grant(cluster, AclBinding("User:bob", "Read", "topic", "fquota"))
    with cluster.admin() as admin:
        admin.alter_client_quotas("User:bob", {"consumer_byte_rate": rate})
    security = ChannelSecurity.from_options(**_channel_options(cluster, "bob"))
    stop = threading.Event()

    def requests() -> Iterator[log_pb2.FetchRequest]:
        yield log_pb2.FetchRequest(
            positions=[log_pb2.FetchPosition(topic="fquota", partition=0, fetch_offset=0)],
            credit_bytes=64 * 1024 * 1024,
            max_bytes=64 * 1024,
        )
        stop.wait(60)

    fetched = 0
    throttles: list[int] = []
    with security.channel(cluster.bootstrap) as channel:
        call = log_pb2_grpc.LogStub(channel).Fetch(requests(), timeout=60)
        started = time.monotonic()
        for response in call:
            fetched += sum(len(p.records) for p in response.partitions)
            throttles.append(response.throttle_time_ms)
            if time.monotonic() - started > 4 or fetched >= 3_000_000:
                break
        elapsed = time.monotonic() - started
        stop.set()
        call.cancel()
    assert max(throttles) > 0, "the broker never reported a throttle time"
    # Unthrottled, the 3 MB arrive in well under a second on loopback.
    assert fetched < 2 * rate * elapsed + 10 * rate, (fetched, elapsed)
    with cluster.admin() as admin:
        admin.alter_client_quotas("User:bob", {"consumer_byte_rate": 0})


def test_the_gateways_records_answers_say_how_long_a_quota_holds_them_back(
    cluster: SecureCluster,
) -> None:
    """Records Produce and Consume count against the produce and fetch byte
    quotas, and their answers carry throttle_time_ms, as Log's do."""
    rate = 50_000  # bytes per second, both ways
    value = "v" * 1000
    messages, records_per_message = 25, 20  # ~500 KB: ten seconds of the quota
    total = messages * records_per_message
    _create(cluster, "rquota")
    _grant(
        cluster,
        AclBinding("User:alice", "Write", "topic", "rquota"),
        AclBinding("User:bob", "Read", "topic", "rquota"),
    )
    with cluster.admin() as admin:
        admin.alter_client_quotas("User:alice", {"producer_byte_rate": rate})
        admin.alter_client_quotas("User:bob", {"consumer_byte_rate": rate})
    try:
        produced: list[int] = []
        security = ChannelSecurity.from_options(**_channel_options(cluster, "alice"))
        with security.channel(cluster.gateway.address) as channel:
            stub = records_pb2_grpc.RecordsStub(channel)

            def produce_requests() -> Iterator[records_pb2.RecordsProduceRequest]:
                for i in range(messages):
                    yield records_pb2.RecordsProduceRequest(
                        correlation_id=i,
                        records=[
                            records_pb2.ProduceRecord(topic="rquota", value_text=value)
                            for _ in range(records_per_message)
                        ],
                    )

            for response in stub.Produce(produce_requests(), timeout=120):
                assert all(not r.HasField("error") for r in response.results), response
                produced.append(response.throttle_time_ms)
        assert max(produced) > 0, f"no Records produce answer said it was held: {produced}"

        consumed: list[int] = []
        records = 0
        stop = threading.Event()
        security = ChannelSecurity.from_options(**_channel_options(cluster, "bob"))

        def consume_requests() -> Iterator[records_pb2.ConsumeRequest]:
            yield records_pb2.ConsumeRequest(
                positions=[records_pb2.ConsumePosition(topic="rquota", partition=0, offset=0)],
                credit_records=100_000,  # never the bound here
                max_records=records_per_message,
            )
            stop.wait(120)

        with security.channel(cluster.gateway.address) as channel:
            call = records_pb2_grpc.RecordsStub(channel).Consume(consume_requests(), timeout=120)
            for response in call:
                records += len(response.records)
                consumed.append(response.throttle_time_ms)
                if max(consumed) > 0 or records >= total:
                    break
            stop.set()
            call.cancel()
        assert max(consumed) > 0, f"no Records consume answer said it was held: {consumed}"
    finally:
        with cluster.admin() as admin:
            admin.alter_client_quotas("User:alice", {"producer_byte_rate": 0})
            admin.alter_client_quotas("User:bob", {"consumer_byte_rate": 0})


def test_a_request_rate_quota_answers_late_not_never(cluster: SecureCluster) -> None:
    _create(cluster, "rated")
    _grant(cluster, AclBinding("User:alice", "Describe", "topic", "rated"))
    with cluster.admin() as admin:
        admin.alter_client_quotas("User:alice", {"request_rate": 5})
    try:
        with cluster.admin("alice") as admin:
            eventually(lambda: admin.describe_topics(["rated"]))
        security = ChannelSecurity.from_options(**_channel_options(cluster, "alice"))
        throttles = []
        with security.channel(cluster.broker.address) as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            for _ in range(50):
                # Every call is answered (slowed, never refused), and says by
                # how much it was held back. (How long 50 calls at 5 a second
                # take: bench/quota_bench.py.)
                reply, call = stub.DescribeTopics.with_call(
                    admin_pb2.DescribeTopicsRequest(names=["rated"]), timeout=60
                )
                assert [t.name for t in reply.topics] == ["rated"]
                trailers = dict(call.trailing_metadata() or ())
                throttles.append(int(trailers.get(THROTTLE_TIME_METADATA_KEY, 0)))
        # 50 calls in a burst are 10 s of a 5-a-second quota: held back
        # (46 of 50 here, ~195 ms each); a machine slow enough to make each
        # call last 200 ms would stay under the quota, so: at least one.
        assert any(t > 0 for t in throttles), throttles
    finally:
        with cluster.admin() as admin:
            admin.alter_client_quotas("User:alice", {"request_rate": 0})


def test_a_quota_of_one_client_id_throttles_that_client_and_not_another_of_the_principal(
    cluster: SecureCluster,
) -> None:
    """The SDK sends its client_id with every call (over the channels every
    client opens), so a (principal, client id) quota holds back that client
    only."""
    _create(cluster, "per-client")
    _grant(cluster, AclBinding("User:alice", "Describe", "topic", "per-client"))
    with cluster.admin() as admin:
        admin.alter_client_quotas("User:alice", {"request_rate": 5}, client_id="slow-app")
    try:

        async def throttles(client_id: str) -> list[int]:
            security = ChannelSecurity.from_options(
                **_channel_options(cluster, "alice"), client_id=client_id
            )
            channel = security.aio_channel(cluster.broker.address)
            try:
                stub: Any = admin_pb2_grpc.AdminStub(channel)
                held = []
                for _ in range(30):
                    call = stub.DescribeTopics(
                        admin_pb2.DescribeTopicsRequest(names=["per-client"]), timeout=60
                    )
                    assert [t.name for t in (await call).topics] == ["per-client"]
                    trailers = dict(await call.trailing_metadata() or ())
                    held.append(int(trailers.get(THROTTLE_TIME_METADATA_KEY, 0)))
                return held
            finally:
                await channel.close()

        def slow_app_is_held_back() -> None:
            # 30 calls in a burst are 6 s of a 5-a-second quota.
            assert any(t > 0 for t in asyncio.run(throttles("slow-app")))

        eventually(slow_app_is_held_back)  # once the quota has reached the broker
        assert asyncio.run(throttles("fast-app")) == [0] * 30
        assert asyncio.run(throttles("tidelog-python")) == [0] * 30
    finally:
        with cluster.admin() as admin:
            admin.alter_client_quotas("User:alice", {"request_rate": 0}, client_id="slow-app")


def test_streams_per_principal_are_bounded_and_the_limit_named(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """--max-streams-per-principal: one identity (here User:ANONYMOUS, on a
    plain-text coordinator) cannot hold more streams open, however many
    connections it opens; a closed stream frees its place."""
    import queue

    from tidelog.v1 import group_pb2, group_pb2_grpc

    coordinator = start_coordinator(
        etcd.endpoint, tmp_path / "logs", prefix="/streams", coordinator_id="s0",
        session_ttl_s=3, extra_args=("--max-streams-per-principal", "3"),
    )  # fmt: skip
    channels: list[grpc.Channel] = []
    ends: list[queue.Queue[None]] = []

    def open_stream(n: int) -> Any:
        """A heartbeat stream on a connection of its own, after its first answer."""
        channel = grpc.insecure_channel(
            coordinator.address, options=[("tidelog.test.connection", n)]
        )
        channels.append(channel)
        end: queue.Queue[None] = queue.Queue()
        ends.append(end)

        def requests() -> Iterator[group_pb2.GroupHeartbeatRequest]:
            yield group_pb2.GroupHeartbeatRequest(
                group_id=f"streams-{n}", subscribed_topics=["t"], session_timeout_ms=30_000
            )
            end.get()  # hold the stream open until the test ends it

        call = group_pb2_grpc.GroupStub(channel).Heartbeat(requests(), timeout=60)
        next(call)  # answered: the stream is open and counted
        return call

    try:
        calls = [open_stream(n) for n in range(3)]
        with pytest.raises(grpc.RpcError) as refused:
            open_stream(3)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        assert "--max-streams-per-principal=3" in refused.value.details()  # type: ignore[attr-defined]
        assert "User:ANONYMOUS" in refused.value.details()  # type: ignore[attr-defined]
        calls[0].cancel()
        ends[0].put(None)
        # Its place is freed once the service has seen the cancel.
        eventually(lambda: open_stream(4))
    finally:
        for end in ends:
            end.put(None)
        for channel in channels:
            channel.close()
        coordinator.stop()
