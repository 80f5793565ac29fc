"""Who is calling: the one place that turns a gRPC call into a principal.

In order:
1. credentials in the call's metadata (`tidelog-sasl-username`,
   `tidelog-sasl-password`; the SDK's security_protocol="SASL_SSL") are
   checked against the salted hashes in etcd (tidelog_server.credentials) and
   give "User:<name>". They are refused on a connection without TLS: a
   password is never accepted in plain text;
2. else the client certificate's subject, when the connection is TLS and the
   client presented one (mTLS): "User:<CN>";
3. else "User:ANONYMOUS", when the service allows anonymous clients
   (`--allow-anonymous`; by default only on services without TLS, so a
   plain-text cluster keeps working as before and a TLS one asks who calls);
4. else the call fails with SASL_AUTHENTICATION_FAILED (UNAUTHENTICATED).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from tidelog.errors import SaslAuthenticationError

from tidelog_server.credentials import Verifier

USERNAME_METADATA_KEY = "tidelog-sasl-username"
PASSWORD_METADATA_KEY = "tidelog-sasl-password"
CLIENT_ID_METADATA_KEY = "tidelog-client-id"
ANONYMOUS = "User:ANONYMOUS"
MAX_CLIENT_ID_CHARS = 255


@dataclass(frozen=True, slots=True)
class Caller:
    principal: str
    #: The client's address as ACLs name hosts ("127.0.0.1", "::1").
    host: str
    #: The client id the client announced ("" when none).
    client_id: str = ""


def peer_host(peer: str) -> str:
    """ "ipv4:127.0.0.1:5000" -> "127.0.0.1"; "ipv6:[::1]:5000" -> "::1"."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return rest or peer


def certificate_common_name(context: grpc.aio.ServicerContext) -> str | None:
    """The CN of the client's certificate, None without TLS or certificate."""
    auth = context.auth_context()
    names = list(auth.get("x509_common_name") or ())
    if not names:
        return None
    name = names[0]
    return name.decode() if isinstance(name, bytes) else str(name)


def is_tls(context: grpc.aio.ServicerContext) -> bool:
    kinds = context.auth_context().get("transport_security_type") or []
    return any(k in (b"ssl", "ssl") for k in kinds)


class Authenticator:
    """Principal extraction for one service (see module doc)."""

    def __init__(self, verifier: Verifier, allow_anonymous: bool) -> None:
        self.verifier = verifier
        self.allow_anonymous = allow_anonymous

    async def caller(self, context: grpc.aio.ServicerContext) -> Caller:
        """Raises SaslAuthenticationError when the call has no acceptable identity."""
        user = password = None
        client_id = ""
        for key, value in context.invocation_metadata() or ():
            if key == USERNAME_METADATA_KEY:
                user = value if isinstance(value, str) else value.decode(errors="replace")
            elif key == PASSWORD_METADATA_KEY:
                password = value.encode() if isinstance(value, str) else value
            elif key == CLIENT_ID_METADATA_KEY and isinstance(value, str):
                client_id = value[:MAX_CLIENT_ID_CHARS]
        host = peer_host(context.peer() or "")
        if user is not None:
            if not is_tls(context):
                raise SaslAuthenticationError(
                    "credentials are refused on a connection without TLS: "
                    "use security_protocol='SASL_SSL'"
                )
            if password is None or not await self.verifier.verify(user, password):
                raise SaslAuthenticationError(
                    f"authentication failed for user {user[:64]!r}: unknown user or wrong password"
                )
            return Caller(f"User:{user}", host, client_id)
        common_name = certificate_common_name(context)
        if common_name:
            return Caller(f"User:{common_name}", host, client_id)
        if self.allow_anonymous:
            return Caller(ANONYMOUS, host, client_id)
        raise SaslAuthenticationError(
            "anonymous clients are not allowed on this cluster: present a client "
            "certificate (ssl_certfile/ssl_keyfile) or a user name and password "
            "(security_protocol='SASL_SSL', sasl_plain_username, sasl_plain_password)"
        )
