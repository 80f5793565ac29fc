"""Certificates, command-line flags and a set of services that require TLS
and client certificates, as the security tests run them: one authority, a
server certificate (CN tidelog-server, a super user by default: the
services' own calls) and one client certificate per user, whose CN is the
user's principal (User:<CN>)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from tidelog_server.dev_certs import DevCertificates, create_authority, issue

from tests.support.coordinator import CoordinatorProcess, start_coordinator
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.processes import BrokerProcess, start_broker

#: The principal the secured services take as a super user.
SUPER_USER = "admin"
#: How long an ACL or quota change may take to reach every service (one etcd
#: watch event each).
PROPAGATION_DEADLINE_S = 30.0

T = TypeVar("T")


def issue_certificates(directory: Path, users: tuple[str, ...]) -> DevCertificates:
    """An authority, the services' certificate and one per user, in `directory`."""
    ca_cert, ca_key = create_authority(directory)
    issue(directory, "server", "tidelog-server", ca_cert, ca_key, ("127.0.0.1", "localhost"))
    for user in users:
        issue(directory, user, user, ca_cert, ca_key)
    return DevCertificates(directory)


def tls_args(certs: DevCertificates, *extra: str) -> list[str]:
    """A service's TLS flags (and `extra` ones after them)."""
    return [
        "--tls-certfile", str(certs.server_certfile),
        "--tls-keyfile", str(certs.server_keyfile),
        "--tls-cafile", str(certs.cafile),
        *extra,
    ]  # fmt: skip


def client_credentials(certs: DevCertificates, user: str) -> grpc.ChannelCredentials:
    """gRPC channel credentials presenting `user`'s certificate."""
    return grpc.ssl_channel_credentials(
        root_certificates=certs.cafile.read_bytes(),
        private_key=(certs.directory / f"{user}-key.pem").read_bytes(),
        certificate_chain=(certs.directory / f"{user}.pem").read_bytes(),
    )


@dataclass
class SecuredServices:
    certs: DevCertificates
    coordinator: CoordinatorProcess
    broker: BrokerProcess
    gateway: GatewayProcess


@contextlib.contextmanager
def secured_services(
    etcd_endpoint: str,
    root: Path,
    *,
    prefix: str,
    users: tuple[str, ...],
    session_ttl_s: int = 2,
) -> Iterator[SecuredServices]:
    """A coordinator, a broker and a gateway under `prefix` that require a
    client certificate (one issued for SUPER_USER and each of `users`), allow
    nothing without an ACL and take User:admin as a super user; stopped on
    exit, last started first."""
    certs = issue_certificates(root / "certs", (SUPER_USER, *users))
    args = tls_args(
        certs,
        "--tls-client-auth", "require",
        "--allow-everyone-if-no-acl-found", "false",
        "--super-users", f"User:{SUPER_USER}",
    )  # fmt: skip
    started: list[Any] = []
    try:
        coordinator = start_coordinator(
            etcd_endpoint, root / "logs", prefix=prefix, coordinator_id="c0",
            session_ttl_s=session_ttl_s, extra_args=tuple(args),
        )  # fmt: skip
        started.append(coordinator)
        broker = start_broker(
            root / "broker-0",
            extra_args=["--etcd", etcd_endpoint, "--etcd-prefix", prefix, *args],
            broker_id=0,
        )
        started.append(broker)
        gateway = start_gateway(etcd_endpoint, root / "gateway", prefix=prefix, extra_args=args)
        started.append(gateway)
        yield SecuredServices(certs, coordinator, broker, gateway)
    finally:
        for process in reversed(started):
            process.stop()


def eventually(probe: Callable[[], T], deadline_s: float = PROPAGATION_DEADLINE_S) -> T:
    """The first value `probe` returns without raising, within the deadline;
    after it, what the last try raised (an ACL change reaches each service
    one etcd watch event later)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return probe()
        except Exception:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)
