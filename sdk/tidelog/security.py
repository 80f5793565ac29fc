"""Transport security of a client's connections, under Kafka's names.

`security_protocol` is "PLAINTEXT" (the default) or "SSL": TLS to every
server the client talks to (brokers, coordinators, the gateway), checked
against `ssl_cafile` (PEM; the system's authorities when None) and the
server's name as the client addressed it (a certificate for 127.0.0.1 needs
that IP in its subjectAltName). `ssl_certfile` and `ssl_keyfile` (PEM, both
or neither) are the client's own certificate for servers that ask for one
(mTLS). SASL is not offered: identity comes from the client certificate.

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

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL")


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
    ) -> ChannelSecurity:
        """Checks the options and reads the files (ValueError naming the option)."""
        protocol = security_protocol.upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise ValueError(
                f"security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, "
                f"got {security_protocol!r} (SASL is not supported: use client certificates)"
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
            return cls()
        return cls(
            grpc.ssl_channel_credentials(
                root_certificates=_read("ssl_cafile", ssl_cafile),
                private_key=_read("ssl_keyfile", ssl_keyfile),
                certificate_chain=_read("ssl_certfile", ssl_certfile),
            )
        )

    def aio_channel(
        self, address: str, options: Sequence[tuple[str, int | str]] = ()
    ) -> grpc.aio.Channel:
        if self.credentials is None:
            return grpc.aio.insecure_channel(address, options=options)
        return grpc.aio.secure_channel(address, self.credentials, options=options)

    def channel(self, address: str, options: Sequence[tuple[str, int | str]] = ()) -> grpc.Channel:
        """A synchronous channel (tools and tests)."""
        if self.credentials is None:
            return grpc.insecure_channel(address, options=options)
        return grpc.secure_channel(address, self.credentials, options=options)


PLAINTEXT = ChannelSecurity()
