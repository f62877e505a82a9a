"""TLS for a server reachable from the network: the certificate it serves and how our clients trust it.

A pair named in settings (`tls_cert`, `tls_key`) is checked and used as given. Without one, a self-signed
pair is made under the data dir on first use and reused after; it is made again (with a log line saying
why) when it is damaged, about to expire, or does not name the address being bound. The running server
records its certificate in server.json, and the CLI (app/cli/client.py) trusts exactly that certificate for
that address.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import json
import logging
import os
import socket
import ssl
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import SettingsError
from app.core.paths import Paths
from app.core.settings import Settings

log = logging.getLogger("switchyard.tls")

VALID_DAYS = 825  # the longest lifetime Apple's clients accept for a server certificate
RENEW_BEFORE = dt.timedelta(days=7)  # remake a self-signed pair this close to its end


@dataclass(frozen=True)
class TlsMaterial:
    """A certificate and key that were checked to load and to match."""

    cert: Path
    key: Path
    fingerprint: str  # SHA-256 of the certificate (DER), as colon-separated hex pairs
    self_signed: bool


def fingerprint(cert_pem: bytes) -> str:
    """The SHA-256 fingerprint of the first certificate in `cert_pem`, as browsers and openssl show it."""
    der = ssl.PEM_cert_to_DER_cert(cert_pem.decode("ascii", "replace"))
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def wanted(settings: Settings, *, asked: bool) -> bool:
    """TLS is on when asked for (`serve --tls`) or when settings name a certificate."""
    return asked or bool(settings.security.tls_cert or settings.security.tls_key)


def check_plain_bind(settings: Settings, *, use_tls: bool) -> None:
    """Refuse a non-loopback bind in clear text: API keys would cross the network readable."""
    from app.server import auth  # here, not at the top: the CLI imports this module for its clients

    if use_tls or auth.is_loopback(settings.server.host) or settings.security.allow_plain_lan:
        return
    host = settings.server.host
    raise SettingsError(
        f"refusing to bind {host} without TLS: API keys would cross the network in clear text; "
        "start with `switchyard serve --tls` (a self-signed certificate is made, or set tls_cert and "
        'tls_key in settings.json), or set "allow_plain_lan": true in settings.json to accept plain HTTP, '
        "or bind 127.0.0.1 (the default)"
    )


def prepare(settings: Settings, paths: Paths) -> TlsMaterial:
    """The pair to serve: the one in settings, checked, or the self-signed one under the data dir."""
    if settings.security.tls_cert or settings.security.tls_key:
        if not (settings.security.tls_cert and settings.security.tls_key):
            raise SettingsError(
                "set both tls_cert and tls_key in settings.json (PEM files), or neither to use a "
                "self-signed certificate made under the data dir"
            )
        return load_pair(
            Path(settings.security.tls_cert).expanduser(), Path(settings.security.tls_key).expanduser()
        )
    return self_signed(paths, host=settings.server.host)


def material_for(settings: Settings, paths: Paths, *, use_tls: bool) -> TlsMaterial | None:
    """The pair to serve, checked to load, or None for plain HTTP (refused for a non-loopback bind unless
    `allow_plain_lan` is set)."""
    check_plain_bind(settings, use_tls=use_tls)
    if not use_tls:
        return None
    material = prepare(settings, paths)
    server_context(material)  # a pair that does not load is refused before anything starts
    return material


def server_context(material: TlsMaterial) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(material.cert, material.key)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(
            f"the TLS certificate {material.cert} and key {material.key} do not load together ({exc}); "
            "fix tls_cert and tls_key in settings.json"
        ) from exc
    return ctx


# ---- a pair named in settings ---------------------------------------------------------------------------
def _read(path: Path, what: str) -> bytes:
    fix = f"fix {what} in settings.json, or remove tls_cert and tls_key to use a self-signed certificate"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise SettingsError(f"{what} {path} does not exist; {fix}") from None
    except OSError as exc:
        raise SettingsError(f"{what} {path} cannot be read ({exc.strerror or exc}); {fix}") from None


def load_pair(cert: Path, key: Path) -> TlsMaterial:
    """Check a user's pair: both readable PEM, the key unencrypted and matching, the certificate current."""
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    cert_pem, key_pem = _read(cert, "tls_cert"), _read(key, "tls_key")
    try:
        parsed = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise SettingsError(
            f"tls_cert {cert} is not a PEM certificate (it should start with -----BEGIN CERTIFICATE-----); "
            "fix tls_cert in settings.json"
        ) from None
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise SettingsError(
            f"tls_key {key} is encrypted; give an unencrypted PEM key (openssl pkey -in KEY -out NEW)"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise SettingsError(
            f"tls_key {key} is not a PEM private key (it should start with -----BEGIN ... PRIVATE KEY-----); "
            "fix tls_key in settings.json"
        ) from None
    if _spki(private.public_key()) != _spki(parsed.public_key()):
        raise SettingsError(
            f"tls_key {key} is not the key of tls_cert {cert}; point both settings at the same pair"
        )
    if parsed.not_valid_after_utc <= dt.datetime.now(dt.UTC):
        raise SettingsError(
            f"tls_cert {cert} expired on {parsed.not_valid_after_utc:%Y-%m-%d}; renew it, or remove "
            "tls_cert and tls_key to use a self-signed certificate"
        )
    return TlsMaterial(cert=cert, key=key, fingerprint=fingerprint(cert_pem), self_signed=False)


def _spki(public: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


# ---- the self-signed pair -------------------------------------------------------------------------------
def tls_dir(paths: Paths) -> Path:
    return paths.home / "tls"


def self_signed(paths: Paths, *, host: str) -> TlsMaterial:
    """The self-signed pair under the data dir: reused while sound, made again when it is not."""
    folder = tls_dir(paths)
    cert, key = folder / "cert.pem", folder / "key.pem"
    names = subject_names(host)
    if cert.exists() or key.exists():
        problem = _reuse_problem(cert, key, names)
        if problem is None:
            return TlsMaterial(cert, key, fingerprint(cert.read_bytes()), self_signed=True)
        log.warning("making a new self-signed TLS certificate: the one at %s %s", cert, problem)
    else:
        log.info("making a self-signed TLS certificate at %s (first TLS start)", cert)
    _write_pair(cert, key, names)
    return TlsMaterial(cert, key, fingerprint(cert.read_bytes()), self_signed=True)


def subject_names(host: str) -> set[str]:
    """What the certificate must name: loopback, this machine's name, and the bound address (every one of
    this machine's addresses for a wildcard bind)."""
    from app.server import auth

    names = {"localhost", "127.0.0.1", "::1", socket.gethostname().lower()}
    bound = host.strip("[]").lower()
    if bound in ("0.0.0.0", "::"):
        names |= {a for a in auth.own_addresses() if not a.startswith("[") and "%" not in a}
    elif bound:
        names.add(bound)
    return {n for n in names if n}


def _reuse_problem(cert: Path, key: Path, names: set[str]) -> str | None:
    """Why the stored pair cannot be served again, or None when it can."""
    from cryptography import x509

    try:
        material = load_pair(cert, key)
        parsed = x509.load_pem_x509_certificate(material.cert.read_bytes())
        san = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (SettingsError, x509.ExtensionNotFound) as exc:
        return f"is damaged ({getattr(exc, 'message', exc)})"
    if parsed.not_valid_after_utc - dt.datetime.now(dt.UTC) < RENEW_BEFORE:
        return f"expires on {parsed.not_valid_after_utc:%Y-%m-%d}"
    have = {str(v).lower() for v in san.get_values_for_type(x509.DNSName)}
    have |= {str(v) for v in san.get_values_for_type(x509.IPAddress)}
    missing = sorted(n for n in names if _canonical(n) not in have)
    return f"does not name {', '.join(missing)}" if missing else None


def _canonical(name: str) -> str:
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.lower()


def _write_pair(cert: Path, key: Path, names: set[str]) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"Switchyard on {socket.gethostname()}")])
    now = dt.datetime.now(dt.UTC)
    alt: list[x509.GeneralName] = []
    for n in sorted(names):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            alt.append(x509.DNSName(n))
    ski = x509.SubjectKeyIdentifier.from_public_key(private.public_key())
    built = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # a client clock slightly behind still accepts it
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, *[False] * 8), critical=True)  # digital signature only (EC)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(private, hashes.SHA256())
    )
    key_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    cert.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_private(key, key_pem)
    tmp = cert.with_suffix(".tmp")
    tmp.write_bytes(built.public_bytes(serialization.Encoding.PEM))
    tmp.replace(cert)


def _write_private(path: Path, data: bytes) -> None:
    """Write with mode 0600 from the first byte, then move into place."""
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


# ---- clients (app/cli/client.py): trust exactly the certificate the running server recorded ----------------
def client_context(cert: Path) -> ssl.SSLContext:
    """Trust only `cert`; the partial-chain flag lets a user's CA-issued leaf be its own anchor."""
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return ctx


def recorded_cert(paths: Paths, url: str) -> Path | None:
    """The certificate server.json records for the server at `url` (same scheme, host and port)."""
    try:
        doc = json.loads(paths.server_file.read_text())
        cert = doc.get("cert")
        if doc.get("scheme") != "https" or not cert:
            return None
        have, want = urllib.parse.urlsplit(str(doc["url"])), urllib.parse.urlsplit(url)
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    same = (have.scheme, have.hostname, have.port) == (want.scheme, want.hostname, want.port)
    return Path(cert) if same else None
