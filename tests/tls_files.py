"""A throwaway certificate authority and a server certificate it signed, written as PEM
files for the HTTPS tests (the `cryptography` package, which Ray's dependencies bring)."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA bundle a client verifies with
    cert: Path  # the server's certificate, signed by the CA
    key: Path  # its private key
    other_ca: Path  # a CA that signed nothing here: a client trusting only it must refuse


def _name(common: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _ca(common: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def make_tls_files(directory: Path, addresses: list[str]) -> TlsFiles:
    """A CA, and a server certificate for ``addresses`` (IPs or DNS names) it signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca_cert, ca_key = _ca("g2rpo test CA")
    other_cert, _ = _ca("g2rpo other CA")
    key = ec.generate_private_key(ec.SECP256R1())
    names = []
    for address in dict.fromkeys(addresses):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            names.append(x509.DNSName(address))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("g2rpo reward server"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files = TlsFiles(
        ca=directory / "ca.pem",
        cert=directory / "server.pem",
        key=directory / "server-key.pem",
        other_ca=directory / "other-ca.pem",
    )
    files.ca.write_bytes(ca_cert.public_bytes(pem))
    files.other_ca.write_bytes(other_cert.public_bytes(pem))
    files.cert.write_bytes(cert.public_bytes(pem))
    files.key.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files
