"""This machine's peer identity and the TLS contexts of a paired link.

The server's own certificate (app/server/tls.py) proves who answers; the identity made here is the
certificate this machine presents when it calls a peer (a client certificate: the server's is made for
server authentication only). Both are pinned by the other side at pairing: a peer is trusted by its exact
certificate, never by a name or a certificate authority.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

VALID_DAYS = 3650  # pinned, never checked against a CA: its lifetime matters only as a bound


def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of the certificate (DER) as colon-separated hex pairs: the form app/server/tls.py shows
    (written again here: lanes do not import the server)."""
    der = ssl.PEM_cert_to_DER_cert(cert_pem.decode("ascii", "replace"))
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


@dataclass(frozen=True)
class Identity:
    cert: Path
    key: Path
    pem: str  # the certificate, sent to a peer at pairing
    fingerprint: str


def load_or_make(folder: Path) -> Identity:
    """The identity under `folder` (made on first use, key mode 0600)."""
    cert, key = folder / "identity-cert.pem", folder / "identity-key.pem"
    if not (cert.exists() and key.exists()):
        _write(cert, key)
    pem = cert.read_text()
    return Identity(cert, key, pem, fingerprint(pem.encode()))


def _write(cert: Path, key: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"Switchyard peer {socket.gethostname()}")])
    now = dt.datetime.now(dt.UTC)
    built = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, *[False] * 8), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(private, hashes.SHA256())
    )
    folder = cert.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = key.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    tmp.replace(key)
    tmp = cert.with_suffix(".tmp")
    tmp.write_bytes(built.public_bytes(serialization.Encoding.PEM))
    tmp.replace(cert)


def pinned_client(server_pem: str, *, identity: Identity | None) -> ssl.SSLContext:
    """A client context that trusts exactly `server_pem` (whatever name it was dialled by: the pin is the
    certificate itself) and presents `identity` when given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = (
        False  # the one trusted certificate is the check; a peer may be dialled by any address
    )
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    ctx.load_verify_locations(cadata=server_pem)
    if identity is not None:
        ctx.load_cert_chain(identity.cert, identity.key)
    return ctx


def accept_peers(ctx: ssl.SSLContext, client_pems: list[str]) -> None:
    """Make a server context ask for client certificates (optional: other clients have none) and trust the
    paired peers' ones. Certificates can be added to a live context, not taken out: a removed peer's is
    refused by fingerprint instead (app/server/admin/peers.py)."""
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    for pem in client_pems:
        ctx.load_verify_locations(cadata=pem)


def peer_fingerprint(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
    """The fingerprint of the certificate the other end of a connection presented, or None."""
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return fingerprint(ssl.DER_cert_to_PEM_cert(der).encode()) if der else None
