"""A throwaway PKI for TLS and mTLS tests: a CA, a server and a client certificate."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None = None,
    *,
    ca: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(
    path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = path.with_suffix(".crt"), path.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def make_pki(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for localhost and 127.0.0.1, and a client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = _cert("gearshift-test-ca", ca_key, ca=True)
    ca_path, _ = _write(directory / "ca", ca, ca_key)
    server_key, client_key = _key(), _key()
    server_cert, server_key_path = _write(
        directory / "server",
        _cert("localhost", server_key, ("gearshift-test-ca", ca_key)),
        server_key,
    )
    client_cert, client_key_path = _write(
        directory / "client", _cert("client", client_key, ("gearshift-test-ca", ca_key)), client_key
    )
    return {
        "ca": ca_path,
        "server_cert": server_cert,
        "server_key": server_key_path,
        "client_cert": client_cert,
        "client_key": client_key_path,
    }
