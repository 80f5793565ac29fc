"""A throwaway certificate authority and certificates for a local cluster.

`tidelog dev --tls` and the TLS tests use it; a real deployment brings its
own authority (cert-manager, a corporate CA). Everything is written as PEM
under one directory:

- `ca.pem` / `ca-key.pem`: the authority (10 years: it is thrown away with
  the cluster's data);
- `server.pem` / `server-key.pem`: one certificate every service presents,
  for the names and addresses clients dial (subjectAltName), usable both as
  a server and as a client certificate (a broker fetching from another);
- `client.pem` / `client-key.pem`: a client certificate (CN=`client_name`)
  for tools and SDK clients when the listeners ask for one.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=3650)


@dataclass(frozen=True)
class DevCertificates:
    directory: Path

    @property
    def cafile(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def server_certfile(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_keyfile(self) -> Path:
        return self.directory / "server-key.pem"

    @property
    def client_certfile(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_keyfile(self) -> Path:
        return self.directory / "client-key.pem"


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Tidelog dev"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def issue(
    directory: Path,
    stem: str,
    common_name: str,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    hosts: tuple[str, ...] = (),
) -> None:
    """`<stem>.pem` and `<stem>-key.pem`, signed by the authority, for `hosts`
    (IP addresses or DNS names) as subjectAltNames."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(directory / f"{stem}.pem", cert.public_bytes(serialization.Encoding.PEM))
    _write(directory / f"{stem}-key.pem", _key_pem(key), private=True)


def create_authority(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name("Tidelog dev authority")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / "ca.pem", cert.public_bytes(serialization.Encoding.PEM))
    _write(directory / "ca-key.pem", _key_pem(key), private=True)
    return cert, key


def create_dev_certificates(
    directory: Path,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1"),
    client_name: str = "tidelog-client",
) -> DevCertificates:
    """A new authority, a server certificate for `hosts`, a client certificate."""
    ca_cert, ca_key = create_authority(directory)
    issue(directory, "server", "tidelog-server", ca_cert, ca_key, hosts)
    issue(directory, "client", client_name, ca_cert, ca_key)
    return DevCertificates(directory)
