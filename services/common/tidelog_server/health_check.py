"""`tidelog-health`: one gRPC health check (grpc.health.v1), for exec probes.

Kubernetes' native gRPC probes cannot speak TLS, so with TLS on the chart
probes each service with this command instead (docs/deploy.md): it dials the
service on 127.0.0.1 inside the pod, with the same mounted files the service
uses (`--tls-cafile`, `--tls-certfile`, `--tls-keyfile`: the probe presents
the service's own certificate, which listeners that require client
certificates accept), asks for one service name, and exits 0 when it is
SERVING, 1 otherwise (the reason on stderr, which the kubelet records in the
pod's events).

The certificate names the service's DNS names, never 127.0.0.1: the probe
checks the server's certificate against the name given with `--server-name`,
by default the first DNS name of `--tls-certfile` (a wildcard `*.x` is checked
as `health.x`). The server presents that same certificate, so the check
proves the listener serves a certificate of the cluster's authority for the
names clients use.

Kept light: only grpc and the health stubs are imported, as the command is
started every few seconds in each pod.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = 0
NOT_SERVING = 1
#: A wildcard name in the certificate is checked with this first label.
WILDCARD_LABEL = "health"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tidelog-health",
        description="Exit 0 when the gRPC health check of a Tidelog service says SERVING.",
    )
    parser.add_argument("--address", default="127.0.0.1:9392", help="host:port to check")
    parser.add_argument(
        "--service", default="", help='health service name ("": the whole process; default)'
    )
    parser.add_argument("--timeout-s", type=float, default=4.0, help="deadline of the check")
    parser.add_argument("--tls-cafile", type=Path, help="PEM authority: check over TLS")
    parser.add_argument("--tls-certfile", type=Path, help="PEM certificate to present")
    parser.add_argument("--tls-keyfile", type=Path, help="PEM key of --tls-certfile")
    parser.add_argument(
        "--server-name",
        help="name the server's certificate must carry (default: the first DNS name of "
        "--tls-certfile)",
    )
    args = parser.parse_args(argv)
    if (args.tls_certfile is None) != (args.tls_keyfile is None):
        parser.error("--tls-certfile and --tls-keyfile go together")
    if args.tls_certfile is not None and args.tls_cafile is None:
        parser.error("--tls-certfile needs --tls-cafile (the authority of the server)")
    if args.timeout_s <= 0:
        parser.error("--timeout-s must be > 0")
    return args


def first_dns_name(certfile: Path) -> str | None:
    """The first DNS subjectAltName of a PEM certificate (wildcard made concrete)."""
    # Imported here: only TLS checks without --server-name pay for it.
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(certfile.read_bytes())
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    for name in names.get_values_for_type(x509.DNSName):
        return WILDCARD_LABEL + name[1:] if name.startswith("*.") else name
    return None


def open_channel(args: argparse.Namespace) -> grpc.Channel:
    if args.tls_cafile is None:
        return grpc.insecure_channel(args.address)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=args.tls_cafile.read_bytes(),
        private_key=args.tls_keyfile.read_bytes() if args.tls_keyfile else None,
        certificate_chain=args.tls_certfile.read_bytes() if args.tls_certfile else None,
    )
    server_name = args.server_name
    if server_name is None and args.tls_certfile is not None:
        server_name = first_dns_name(args.tls_certfile)
    options = [] if server_name is None else [("grpc.ssl_target_name_override", server_name)]
    return grpc.secure_channel(args.address, credentials, options=options)


def check(args: argparse.Namespace) -> tuple[int, str]:
    """(exit code, what to print)."""
    try:
        channel = open_channel(args)
    except (OSError, ValueError) as exc:
        return NOT_SERVING, f"cannot read the TLS files: {exc}"
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout_s
            )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            return NOT_SERVING, f"{args.address} {args.service!r}: {code}: {details}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    code = SERVING if reply.status == health_pb2.HealthCheckResponse.SERVING else NOT_SERVING
    return code, f"{args.address} {args.service!r}: {status}"


def main(argv: Sequence[str] | None = None) -> None:
    code, message = check(parse_args(argv))
    print(message, file=sys.stdout if code == SERVING else sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
