"""TLS for LAN use and a clean end on SIGHUP (docs/security.md#tls): a real `serve --tls` answers the
official openai client that trusts exactly its generated certificate, the CLI finds and trusts it through
server.json, plain HTTP and clear-text LAN binds are refused, a broken settings pair is a clear error, and
SIGHUP stops `serve` the way SIGTERM does."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app.core.errors import SettingsError
from app.core.paths import Paths
from app.core.settings import Settings
from app.server import tls
from tests.conftest import REPO, ServerProcess, link_models, running_server, wait_gone


def file_fingerprint(cert: Path) -> str:
    """Computed here with cryptography, not with the code under test."""
    return x509.load_pem_x509_certificate(cert.read_bytes()).fingerprint(hashes.SHA256()).hex(":").upper()


def printed(s: ServerProcess, label: str) -> str:
    return next(line.split()[-1] for line in s.stdout if line.startswith(label))


def trusting(cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert))


def switchyard(home: Path, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SWITCHYARD_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "app", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def make_pair(folder: Path, *, days: float = 30, name: str = "pair") -> tuple[Path, Path]:
    """A certificate and key made by the test itself (a user's own pair)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=60))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("tls")
    with running_server(root / "home", link_models(root / "m", model_store / "tiny.gguf"), "--tls") as s:
        yield s


# ---- a real serve --tls ---------------------------------------------------------------------------
def test_openai_client_over_https_trusting_the_generated_certificate(tls_server: ServerProcess) -> None:
    cert = tls.tls_dir(Paths(home=tls_server.home)) / "cert.pem"
    assert tls_server.url.startswith("https://127.0.0.1:")
    with httpx.Client(verify=trusting(cert)) as http:
        client = openai.OpenAI(base_url=tls_server.api, api_key="x", http_client=http, max_retries=0)
        assert "tiny" in [m.id for m in client.models.list()]
        health = http.get(tls_server.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_printed_fingerprint_is_the_certificate_files_and_server_json_records_it(
    tls_server: ServerProcess,
) -> None:
    cert = tls.tls_dir(Paths(home=tls_server.home)) / "cert.pem"
    key = cert.with_name("key.pem")
    assert printed(tls_server, "TLS fingerprint") == file_fingerprint(cert)
    assert printed(tls_server, "TLS certificate") == str(cert)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    doc = json.loads((tls_server.home / "server.json").read_text())
    assert doc["url"] == tls_server.url and doc["scheme"] == "https"
    assert doc["fingerprint"] == file_fingerprint(cert) and doc["cert"] == str(cert)


def test_plain_http_and_untrusting_clients_are_refused(tls_server: ServerProcess) -> None:
    plain = tls_server.url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(plain + "/health", timeout=10)
    # the certificate is not trusted by accident (system store): a client that was not given it fails
    with pytest.raises(urllib.error.URLError) as exc:
        urllib.request.urlopen(tls_server.url + "/health", timeout=10, context=ssl.create_default_context())
    assert isinstance(exc.value.reason, ssl.SSLCertVerificationError)


def test_cli_finds_and_trusts_the_tls_server(tls_server: ServerProcess) -> None:
    done = switchyard(tls_server.home, "ps", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["url"] == tls_server.url


def test_a_second_start_reuses_the_certificate(tmp_path: Path) -> None:
    home, models = tmp_path / "home", tmp_path / "m"
    models.mkdir()
    with running_server(home, models, "--tls") as first:
        fp = printed(first, "TLS fingerprint")
    cert = tls.tls_dir(Paths(home=home)) / "cert.pem"
    made = cert.stat().st_mtime_ns
    with running_server(home, models, "--tls") as second:
        assert printed(second, "TLS fingerprint") == fp == file_fingerprint(cert)
    assert cert.stat().st_mtime_ns == made
    assert not (home / "server.json").exists()


def test_network_bind_without_tls_refuses_naming_both_ways_out(tmp_path: Path) -> None:
    home = tmp_path / "home"
    made = switchyard(home, "keys", "create", "lan-client")  # past the refusal for a keyless LAN bind
    assert made.returncode == 0, made.stderr
    done = switchyard(home, "serve", "--host", "0.0.0.0", "--port", "0", "--models-dir", str(tmp_path))
    assert done.returncode == 2
    assert "refusing to bind 0.0.0.0 without TLS" in done.stderr
    assert "--tls" in done.stderr and "allow_plain_lan" in done.stderr
    assert "listening" not in done.stdout
    (home / "settings.json").write_text(json.dumps({"allow_plain_lan": True}))  # the other way out
    with running_server(home, tmp_path, "--host", "0.0.0.0") as plain:
        assert plain.url.startswith("http://0.0.0.0:")
    assert "Traceback" not in done.stderr


def test_garbage_settings_pair_is_a_clear_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "c.pem").write_text("not a certificate")
    (tmp_path / "k.pem").write_text("not a key")
    settings = {"tls_cert": str(tmp_path / "c.pem"), "tls_key": str(tmp_path / "k.pem")}
    (home / "settings.json").write_text(json.dumps(settings))
    done = switchyard(home, "serve", "--tls", "--port", "0")
    assert done.returncode == 2
    assert "is not a PEM certificate" in done.stderr and "tls_cert" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (home / "server.json").exists()


def test_sighup_ends_serve_cleanly(start_server: Any, tmp_path: Path, model_store: Path) -> None:
    s = start_server(link_models(tmp_path / "m", model_store / "tiny.gguf"))
    c = openai.OpenAI(base_url=s.api, api_key="x", max_retries=0, timeout=60)
    c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}], max_tokens=2)
    engines = s.engine_pids()
    assert engines and (s.home / "server.json").exists()
    assert s.stop(signal.SIGHUP) == 0  # not killed by the signal (that reads -1)
    assert not (s.home / "server.json").exists()
    assert wait_gone(engines, 5) == []
    assert "shutting down: stopping lanes" in s.stderr_text()


# ---- the certificate store and the checks, in process ---------------------------------------------
def test_self_signed_pair_names_this_machine_and_is_reused(tmp_path: Path) -> None:
    paths = Paths(home=tmp_path / "home")
    made = tls.self_signed(paths, host="127.0.0.1")
    parsed = x509.load_pem_x509_certificate(made.cert.read_bytes())
    san = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = {str(n) for n in san.get_values_for_type(x509.DNSName)}
    ips = {str(n) for n in san.get_values_for_type(x509.IPAddress)}
    assert {"localhost", socket.gethostname().lower()} <= names and {"127.0.0.1", "::1"} <= ips
    assert made.fingerprint == file_fingerprint(made.cert)
    assert stat.S_IMODE(made.key.stat().st_mode) == 0o600
    assert parsed.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=365)
    assert tls.self_signed(paths, host="127.0.0.1").fingerprint == made.fingerprint


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        ("garbage", "is damaged"),
        ("expiring", "expires on"),
        ("other_address", "does not name 192.0.2.7"),
    ],
)
def test_self_signed_pair_is_remade_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, spoil: str, why: str
) -> None:
    paths = Paths(home=tmp_path / "home")
    first = tls.self_signed(paths, host="127.0.0.1")
    host = "127.0.0.1"
    if spoil == "garbage":
        first.cert.write_text("-----BEGIN CERTIFICATE-----\nbroken\n")
    elif spoil == "expiring":
        cert, key = make_pair(tmp_path / "soon", days=1)
        first.cert.write_bytes(cert.read_bytes())
        first.key.write_bytes(key.read_bytes())
    else:
        host = "192.0.2.7"
    with caplog.at_level(logging.WARNING, logger="switchyard.tls"):
        again = tls.self_signed(paths, host=host)
    assert again.fingerprint != first.fingerprint
    assert again.fingerprint == file_fingerprint(again.cert)
    assert any(why in r.getMessage() and "making a new self-signed" in r.getMessage() for r in caplog.records)
    tls.server_context(again)  # the new pair loads


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "does not exist"),
        ("not_pem", "is not a PEM certificate"),
        ("bad_key", "is not a PEM private key"),
        ("mismatched", "is not the key of"),
        ("encrypted", "is encrypted"),
        ("expired", "expired on"),
        ("only_cert", "set both tls_cert and tls_key"),
    ],
)
def test_settings_pair_problems_are_settings_errors(tmp_path: Path, case: str, message: str) -> None:
    cert, key = make_pair(tmp_path, days=-1 if case == "expired" else 30)
    if case == "missing":
        cert = tmp_path / "nowhere.crt"
    elif case == "not_pem":
        cert.write_bytes(b"\x00\x01binary")
    elif case == "bad_key":
        key.write_text("hello")
    elif case == "mismatched":
        _, key = make_pair(tmp_path, name="other")
    elif case == "encrypted":
        loaded = serialization.load_pem_private_key(key.read_bytes(), password=None)
        key.write_bytes(
            loaded.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"pw"),
            )
        )
    settings = Settings.flat(tls_cert=str(cert), tls_key=None if case == "only_cert" else str(key))
    with pytest.raises(SettingsError) as exc:
        tls.material_for(settings, Paths(home=tmp_path / "home"), use_tls=True)
    assert message in exc.value.message


def test_a_good_settings_pair_is_served_as_given(tmp_path: Path) -> None:
    cert, key = make_pair(tmp_path)
    settings = Settings.flat(tls_cert=str(cert), tls_key=str(key))
    assert tls.wanted(settings, asked=False)  # naming a certificate turns TLS on
    got = tls.material_for(settings, Paths(home=tmp_path / "home"), use_tls=True)
    assert got is not None and got.cert == cert and got.fingerprint == file_fingerprint(cert)
    assert not got.self_signed and not (tmp_path / "home" / "tls").exists()


def test_plain_bind_rule() -> None:
    lan = Settings.flat(host="0.0.0.0")
    with pytest.raises(SettingsError):
        tls.check_plain_bind(lan, use_tls=False)
    tls.check_plain_bind(lan, use_tls=True)
    tls.check_plain_bind(Settings.flat(host="0.0.0.0", allow_plain_lan=True), use_tls=False)
    tls.check_plain_bind(Settings.flat(host="127.0.0.1"), use_tls=False)


def test_clients_trust_the_recorded_certificate_only_for_that_server(tmp_path: Path) -> None:
    paths = Paths(home=tmp_path / "home")
    paths.home.mkdir()
    doc = {"url": "https://127.0.0.1:8443", "scheme": "https", "cert": "/x/cert.pem", "pid": 1}
    paths.server_file.write_text(json.dumps(doc))
    assert tls.recorded_cert(paths, "https://127.0.0.1:8443/api/lanes") == Path("/x/cert.pem")
    assert tls.recorded_cert(paths, "https://127.0.0.1:9443/api/lanes") is None
    assert tls.recorded_cert(paths, "https://example.com:8443/") is None
    paths.server_file.write_text(json.dumps({**doc, "scheme": "http"}))
    assert tls.recorded_cert(paths, "https://127.0.0.1:8443/") is None
