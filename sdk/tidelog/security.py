"""Transport security of a client's connections, under Kafka's names.

`security_protocol` is "PLAINTEXT" (the default) or "SSL": TLS to every
server the client talks to (brokers, coordinators, the gateway), checked
against `ssl_cafile` (PEM; the system's authorities when None) and the
server's name as the client addressed it (a certificate for 127.0.0.1 needs
that IP in its subjectAltName). `ssl_certfile` and `ssl_keyfile` (PEM, both
or neither) are the client's own certificate for servers that ask for one
(mTLS).

"SASL_SSL" is TLS as above plus a user name and password
(`sasl_plain_username`, `sasl_plain_password`; `sasl_mechanism` "PLAIN", the
only one) sent in every call's metadata, which the servers check against
the salted hashes stored in etcd (`tidelog users add`). gRPC sends call
credentials only over TLS, so a password never travels in plain text; there
is no SASL_PLAINTEXT.

Every call also carries the client id (`client_id`, Kafka's name) as the
`tidelog-client-id` metadata, over TLS or not (tidelog._call_metadata), so
that quotas per client id apply.

`ChannelSecurity` reads the files once, when a client is created, so a
missing or unreadable file fails there, naming the option, rather than at
the first connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from tidelog._call_metadata import CLIENT_ID_METADATA_KEY, MetadataChannel, check_client_id

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN",)
#: Call metadata keys of the credentials (tidelog_server.auth reads them).
USERNAME_METADATA_KEY = "tidelog-sasl-username"
PASSWORD_METADATA_KEY = "tidelog-sasl-password"


def _read(option: str, path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{option}={path!r} cannot be read: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class ChannelSecurity:
    """How to open a channel: in plain text, or with TLS credentials."""

    credentials: grpc.ChannelCredentials | None = None
    #: Metadata every call carries (the client id), TLS or not.
    call_metadata: tuple[tuple[str, str], ...] = ()

    @property
    def tls(self) -> bool:
        return self.credentials is not None

    @classmethod
    def from_options(
        cls,
        security_protocol: str = "PLAINTEXT",
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        sasl_plain_username: str | None = None,
        sasl_plain_password: str | None = None,
        sasl_mechanism: str = "PLAIN",
        client_id: str | None = None,
    ) -> ChannelSecurity:
        """Checks the options and reads the files (ValueError naming the option)."""
        call_metadata = (
            () if client_id is None else ((CLIENT_ID_METADATA_KEY, check_client_id(client_id)),)
        )
        protocol = security_protocol.upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise ValueError(
                f"security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, "
                f"got {security_protocol!r} (credentials travel over TLS only: SASL_SSL)"
            )
        if protocol == "SASL_SSL":
            if sasl_mechanism.upper() not in SASL_MECHANISMS:
                raise ValueError(
                    f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}, "
                    f"got {sasl_mechanism!r}"
                )
            if not sasl_plain_username or sasl_plain_password is None:
                raise ValueError(
                    "security_protocol SASL_SSL needs sasl_plain_username and sasl_plain_password"
                )
        elif sasl_plain_username is not None or sasl_plain_password is not None:
            raise ValueError(
                f"sasl_plain_username/sasl_plain_password are set but security_protocol is "
                f"{protocol}: set security_protocol='SASL_SSL' to use them"
            )
        if (ssl_certfile is None) != (ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together: give both or neither")
        if protocol == "PLAINTEXT":
            given = {"ssl_cafile": ssl_cafile, "ssl_certfile": ssl_certfile}
            for name, value in given.items():
                if value is not None:
                    raise ValueError(
                        f"{name} is set but security_protocol is PLAINTEXT: "
                        "set security_protocol='SSL' to use it"
                    )
            return cls(call_metadata=call_metadata)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read("ssl_cafile", ssl_cafile),
            private_key=_read("ssl_keyfile", ssl_keyfile),
            certificate_chain=_read("ssl_certfile", ssl_certfile),
        )
        if protocol == "SASL_SSL":
            assert sasl_plain_username is not None and sasl_plain_password is not None
            metadata = (
                (USERNAME_METADATA_KEY, sasl_plain_username),
                (PASSWORD_METADATA_KEY, sasl_plain_password),
            )
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.metadata_call_credentials(_StaticMetadata(metadata))
            )
        return cls(credentials, call_metadata)

    def aio_channel(
        self, address: str, options: Sequence[tuple[str, int | str]] = ()
    ) -> grpc.aio.Channel:
        if self.credentials is None:
            channel = grpc.aio.insecure_channel(address, options=options)
        else:
            channel = grpc.aio.secure_channel(address, self.credentials, options=options)
        return MetadataChannel(channel, self.call_metadata) if self.call_metadata else channel

    def channel(self, address: str, options: Sequence[tuple[str, int | str]] = ()) -> grpc.Channel:
        """A synchronous channel (tools and tests)."""
        if self.credentials is None:
            return grpc.insecure_channel(address, options=options)
        return grpc.secure_channel(address, self.credentials, options=options)


class _StaticMetadata(grpc.AuthMetadataPlugin):
    """Adds the same metadata (the credentials) to every call."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        callback(self._metadata, None)


PLAINTEXT = ChannelSecurity()
