"""Certificates and command-line flags for services that require TLS and
client certificates, as the security tests run them: one authority, a
server certificate (CN tidelog-server, a super user by default: the
services' own calls) and one client certificate per user, whose CN is the
user's principal (User:<CN>)."""

from __future__ import annotations

from pathlib import Path

import grpc
from tidelog_server.dev_certs import DevCertificates, create_authority, issue


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
