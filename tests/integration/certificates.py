"""A throwaway public key infrastructure made at test time: a CA, a server certificate for
127.0.0.1/localhost, client certificates, and a second CA nobody trusts. PEM files in a
directory the test owns; nothing is shipped or reused between runs."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    certificate: Path
    key: Path


@dataclass(frozen=True)
class PKI:
    ca: Path
    server: Pair
    alice: Pair  # CN=alice, O=Example Devices
    rogue: Pair  # CN=alice too, but signed by a CA the broker does not trust


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = []
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Pair:
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Pair(cert_path, key_path)


def _issue(
    subject: x509.Name,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
    key: ec.EllipticCurvePrivateKey | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = key or ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
    elif server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256()), key


def make_pki(directory: Path) -> PKI:
    directory.mkdir(parents=True, exist_ok=True)
    ca_name = _name("Kittiwake Test CA")
    # Self-signed: the key that signs is the certificate's own.
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert, _ = _issue(ca_name, ca_name, ca_key, ca=True, key=ca_key)
    ca = _write(directory, "ca", ca_cert, ca_key)
    server = _write(directory, "server", *_issue(_name("localhost"), ca_name, ca_key, server=True))
    alice = _write(
        directory, "alice", *_issue(_name("alice", "Example Devices"), ca_name, ca_key)
    )
    rogue_name = _name("Rogue CA")
    rogue_key = ec.generate_private_key(ec.SECP256R1())
    rogue = _write(directory, "rogue", *_issue(_name("alice"), rogue_name, rogue_key))
    return PKI(ca.certificate, server, alice, rogue)
