"""TLS for the services' listeners and for their own outgoing calls.

One `ServerTls` per service process, from three PEM files: its certificate
(chain), its key, and the cluster's authority (`cafile`), which signs the
certificates that peers present. Every service takes the same options
(`add_tls_arguments`): `--tls-certfile`, `--tls-keyfile`, `--tls-cafile`,
`--tls-client-auth none|require`.

- Client listeners check client certificates as `--tls-client-auth` says.
- The broker's internal listener (replication) always requires a client
  certificate signed by `cafile`: only the cluster's own processes fetch
  past the high watermark.
- A service's own calls (to coordinators, brokers, the leader it follows)
  trust `cafile` and present the service's certificate as their client
  certificate (`channel_security`).

Certificates are read again when their files change (Kubernetes rotates a
mounted secret in place): a new handshake after the change uses the new
pair, connections already open keep theirs. The check is a stat of the three
files per handshake, at most once a second.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from tidelog.security import PLAINTEXT, ChannelSecurity

from tidelog_server.etcd.client import ETCD_PASSWORD_ENV, EtcdAccessError, EtcdAuth, EtcdTls

log = logging.getLogger("tidelog.tls")

CLIENT_AUTH_MODES = ("none", "require")
#: How often a handshake may look at the files' modification times.
RELOAD_CHECK_INTERVAL_S = 1.0


@dataclass(frozen=True)
class ServerTls:
    certfile: Path
    keyfile: Path
    cafile: Path | None = None
    client_auth: str = "none"

    def __post_init__(self) -> None:
        if self.client_auth not in CLIENT_AUTH_MODES:
            raise ValueError(
                f"--tls-client-auth must be one of {', '.join(CLIENT_AUTH_MODES)}, "
                f"got {self.client_auth!r}"
            )
        if self.client_auth != "none" and self.cafile is None:
            raise ValueError(f"--tls-client-auth {self.client_auth} needs --tls-cafile")
        # Fail at start, naming the file, rather than at the first handshake.
        _Pair(self).load()

    def server_credentials(
        self, *, require_client_cert: bool | None = None
    ) -> grpc.ServerCredentials:
        """Credentials for one listener; `require_client_cert` overrides
        --tls-client-auth (the internal listener requires one)."""
        require = require_client_cert
        if require is None:
            require = self.client_auth == "require"
        if require and self.cafile is None:
            raise ValueError("a listener that requires client certificates needs --tls-cafile")
        pair = _Pair(self)
        return grpc.dynamic_ssl_server_credentials(
            pair.load(),
            pair.reloaded,  # type: ignore[arg-type]  # None keeps the current pair
            require_client_authentication=require,
        )

    def channel_security(self) -> ChannelSecurity:
        """For the service's own calls: trust the cluster's authority, and
        present this service's certificate."""
        return ChannelSecurity.from_options(
            "SSL",
            None if self.cafile is None else str(self.cafile),
            str(self.certfile),
            str(self.keyfile),
        )


def client_options(tls: ServerTls | None) -> dict[str, str]:
    """The SDK settings (Producer/Consumer keyword arguments) of a client that
    a service runs itself (the gateway's), with the service's certificate."""
    if tls is None:
        return {}
    options = {
        "security_protocol": "SSL",
        "ssl_certfile": str(tls.certfile),
        "ssl_keyfile": str(tls.keyfile),
    }
    if tls.cafile is not None:
        options["ssl_cafile"] = str(tls.cafile)
    return options


class _Pair:
    """The listener's certificate configuration, and its reloading."""

    def __init__(self, tls: ServerTls) -> None:
        self._tls = tls
        self._lock = threading.Lock()
        self._stamp: tuple[float, ...] = ()
        self._checked = 0.0

    def _files(self) -> list[Path]:
        return [p for p in (self._tls.certfile, self._tls.keyfile, self._tls.cafile) if p]

    def load(self) -> grpc.ServerCertificateConfiguration:
        try:
            stamp = tuple(p.stat().st_mtime_ns for p in self._files())
            key = self._tls.keyfile.read_bytes()
            chain = self._tls.certfile.read_bytes()
            roots = self._tls.cafile.read_bytes() if self._tls.cafile else None
        except OSError as exc:
            raise ValueError(f"TLS file {exc.filename} cannot be read: {exc.strerror}") from exc
        self._stamp = stamp
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=roots)

    def reloaded(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC before each handshake: a new configuration when
        the files changed, None to keep the current one."""
        with self._lock:
            now = time.monotonic()
            if now - self._checked < RELOAD_CHECK_INTERVAL_S:
                return None
            self._checked = now
            try:
                stamp = tuple(p.stat().st_mtime_ns for p in self._files())
                if stamp == self._stamp:
                    return None
                config = self.load()
            except (OSError, ValueError) as exc:
                # Half-written files during a rotation: keep the old pair.
                log.warning("TLS files changed but cannot be loaded yet: %s", exc)
                return None
            log.info("TLS certificate reloaded from %s", self._tls.certfile)
            return config


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (all listeners; off unless --tls-certfile is given)")
    group.add_argument("--tls-certfile", type=Path, help="PEM certificate (chain) of this service")
    group.add_argument("--tls-keyfile", type=Path, help="PEM private key of --tls-certfile")
    group.add_argument(
        "--tls-cafile",
        type=Path,
        help="PEM authority of the cluster: checks client certificates, and the servers "
        "this service calls",
    )
    group.add_argument(
        "--tls-client-auth",
        choices=CLIENT_AUTH_MODES,
        default="none",
        help="client certificates on the client listener (default %(default)s); the "
        "broker's internal listener always requires one",
    )


def tls_from_args(args: argparse.Namespace) -> ServerTls | None:
    if args.tls_certfile is None and args.tls_keyfile is None:
        if args.tls_cafile is not None or args.tls_client_auth != "none":
            raise ValueError("--tls-cafile and --tls-client-auth need --tls-certfile/--tls-keyfile")
        return None
    if args.tls_certfile is None or args.tls_keyfile is None:
        raise ValueError("--tls-certfile and --tls-keyfile go together")
    return ServerTls(args.tls_certfile, args.tls_keyfile, args.tls_cafile, args.tls_client_auth)


def channel_security_of(tls: ServerTls | None) -> ChannelSecurity:
    return PLAINTEXT if tls is None else tls.channel_security()


def add_port(server: grpc.aio.Server, address: str, tls: ServerTls | None, **kwargs: bool) -> int:
    """Bind `address` in plain text, or with `tls`; the bound port (0: failed)."""
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, tls.server_credentials(**kwargs))


def add_etcd_tls_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "TLS and authentication to etcd (TLS off unless --etcd-cafile is given)"
    )
    group.add_argument("--etcd-cafile", type=Path, help="PEM authority of etcd's certificate")
    group.add_argument(
        "--etcd-certfile",
        type=Path,
        help="PEM client certificate for an etcd started with --client-cert-auth (its CN is "
        "the etcd user)",
    )
    group.add_argument("--etcd-keyfile", type=Path, help="PEM key of --etcd-certfile")
    group.add_argument(
        "--etcd-user",
        help="etcd user to log in as, for an etcd with `auth enable` (else the CN of "
        "--etcd-certfile is the etcd user); its password from --etcd-password-file or "
        f"${ETCD_PASSWORD_ENV}",
    )
    group.add_argument(
        "--etcd-password-file",
        type=Path,
        help="file holding the password of --etcd-user (a mounted Secret; read again at "
        "each login, so a rotated password is picked up)",
    )


def etcd_tls_from_args(args: argparse.Namespace) -> EtcdTls | None:
    if (args.etcd_certfile is None) != (args.etcd_keyfile is None):
        raise ValueError("--etcd-certfile and --etcd-keyfile go together")
    if args.etcd_cafile is None:
        if args.etcd_certfile is not None:
            raise ValueError("--etcd-certfile needs --etcd-cafile (TLS to etcd)")
        return None
    return EtcdTls(args.etcd_cafile, args.etcd_certfile, args.etcd_keyfile)


def etcd_auth_from_args(args: argparse.Namespace) -> EtcdAuth | None:
    """--etcd-user and its password (ValueError naming what is missing)."""
    if args.etcd_user is None:
        if args.etcd_password_file is not None:
            raise ValueError("--etcd-password-file needs --etcd-user")
        return None
    if not args.etcd_user:
        raise ValueError("--etcd-user must not be empty")
    auth = EtcdAuth(args.etcd_user, args.etcd_password_file)
    try:
        auth.password()
    except EtcdAccessError as exc:
        raise ValueError(str(exc)) from None
    return auth
