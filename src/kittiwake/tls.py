"""TLS for every listener kind: the server's ssl.SSLContext built from a listener's ``tls``
table, and the user name a verified client certificate proves.

Reads the PEM files it is given when the context is built (at start-up), nothing else.
"""

from __future__ import annotations

import ssl
from typing import Any, Final

from kittiwake.config import TLSConfig

# RFC 4514 short names for the attributes subjects usually hold (Python's ssl gives long ones).
_SHORT_NAMES: Final = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


def server_context(config: TLSConfig) -> ssl.SSLContext:
    """The context a TLS listener accepts connections with; ssl.SSLError or OSError (a file
    missing or not PEM) stops the broker from starting, naming the problem."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = (
        ssl.TLSVersion.TLSv1_3 if config.min_version == "1.3" else ssl.TLSVersion.TLSv1_2
    )
    context.load_cert_chain(config.certificate, config.key or None)
    if config.ca:
        context.load_verify_locations(cafile=config.ca)
        context.verify_mode = (
            ssl.CERT_REQUIRED if config.require_client_certificate else ssl.CERT_OPTIONAL
        )
    return context


def certificate_user(peercert: dict[str, Any] | None, mode: str) -> str | None:
    """The user a verified client certificate names: its subject's common name ("cn") or
    whole subject as RFC 4514 text ("subject"); None without a certificate or a name."""
    if not peercert or mode == "none":
        return None
    subject = peercert.get("subject") or ()
    if mode == "cn":
        for rdn in subject:
            for name, value in rdn:
                if name == "commonName":
                    return str(value)
        return None
    parts = [
        "+".join(f"{_SHORT_NAMES.get(name, name)}={_escaped(str(value))}" for name, value in rdn)
        for rdn in reversed(subject)
    ]
    return ",".join(parts) or None


def _escaped(value: str) -> str:
    """An attribute value escaped as RFC 4514 §2.4 says."""
    out = "".join("\\" + c if c in ',+"\\<>;=' else c for c in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out
