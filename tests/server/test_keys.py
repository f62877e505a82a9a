"""API keys: the masked Secret, the key store (keyring copy, hash on disk), the CLI and the admin API."""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail
from keyring.errors import PasswordDeleteError

from app.core.errors import BadRequestError, KeyExistsError, KeyNotFoundError, SettingsError
from app.core.paths import Paths
from app.core.secrets import SERVICE, KeyStore, Secret, keyring_secret
from tests.conftest import REPO, ServerProcess, link_models, wait_gone


class MemoryKeyring(KeyringBackend):
    """A keyring that lives in this process only (FACTS: unit tests set one with keyring.set_keyring)."""

    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.items.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.items[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        if self.items.pop((service, username), None) is None:
            raise PasswordDeleteError(username)


@pytest.fixture
def memory_keyring() -> Iterator[MemoryKeyring]:
    before = keyring.get_keyring()
    kr = MemoryKeyring()
    keyring.set_keyring(kr)
    yield kr
    keyring.set_keyring(before)


@pytest.fixture
def no_keyring() -> Iterator[None]:
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(before)


def test_secret_is_masked_everywhere_it_could_be_printed() -> None:
    s = Secret("sy-12345678-supersecretvalue")
    shown = [repr(s), str(s), f"{s}", f"{s!r}", "%s" % s, repr([s]), repr({"k": s})]  # noqa: UP031
    assert all("supersecret" not in x for x in shown) and "*" in repr(s)
    assert s.reveal() == "sy-12345678-supersecretvalue"
    with pytest.raises(TypeError):
        pickle.dumps(s)


def test_create_verify_revoke_with_a_keyring(memory_keyring: MemoryKeyring, tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    created = store.create("editor")
    value = created.secret.reveal()
    assert created.keyring_problem is None and created.info.in_keyring
    assert memory_keyring.items[(SERVICE, "editor")] == value
    back = keyring_secret("editor")
    assert back is not None and back.reveal() == value
    assert "keyring" in created.note()

    text = store.path.read_text()
    assert value not in text and created.info.last4 == value[-4:]
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    rec = json.loads(text)["keys"][0]
    assert set(rec) >= {"name", "created", "last4", "salt", "hash", "scrypt"}

    server_view = KeyStore(tmp_path / "keys.json")  # a second process's view: the file alone suffices
    assert server_view.verify(Secret(value)) == "editor"
    assert server_view.cached(Secret(value)) == "editor"  # remembered: no second scrypt
    assert server_view.verify(Secret(value[:-1] + ("A" if value[-1] != "A" else "B"))) is None
    assert server_view.verify(Secret("sy-00000000-" + value[12:])) is None
    assert server_view.verify(Secret("unused")) is None and server_view.cached(Secret("unused")) is None
    assert server_view.candidate(Secret(value)) and not server_view.candidate(Secret("unused"))
    assert not server_view.candidate(Secret("sy-00000000-" + value[12:]))

    with pytest.raises(KeyExistsError):
        store.create("editor")
    with pytest.raises(BadRequestError):
        store.create("no spaces please")
    assert [k.name for k in store.entries()] == ["editor"]

    store.revoke("editor")
    assert (SERVICE, "editor") not in memory_keyring.items
    assert server_view.verify(Secret(value)) is None and server_view.cached(Secret(value)) is None
    with pytest.raises(KeyNotFoundError):
        store.revoke("editor")


def test_without_a_keyring_the_key_still_works(no_keyring: None, tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    created = store.create("laptop")
    assert created.keyring_problem and "no system keyring" in created.keyring_problem
    assert not created.info.in_keyring and "not stored anywhere" in created.note()
    assert KeyStore(store.path).verify(created.secret) == "laptop"
    assert keyring_secret("laptop") is None
    store.revoke("laptop")  # nothing to delete from a keyring: not an error
    assert not store


def test_a_damaged_key_file_is_reported_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "keys.json").write_text('{"keys": [{"name": 1}]}')
    with pytest.raises(SettingsError, match=r"keys\.json is damaged"):
        KeyStore(tmp_path / "keys.json").entries()


def keys_cli(*args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    # the autouse fixture set SWITCHYARD_HOME and the fail keyring backend in os.environ
    env = dict(os.environ, **({"SWITCHYARD_HOME": str(home)} if home else {}))
    return subprocess.run(
        [sys.executable, "-m", "app", "keys", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_create_list_revoke_round_trip_without_a_keyring() -> None:
    made = keys_cli("create", "editor")
    assert made.returncode == 0, made.stderr
    value = made.stdout.strip()
    assert value.startswith("sy-") and len(value.splitlines()) == 1
    assert "no system keyring is available" in made.stderr and "not stored anywhere" in made.stderr
    assert value not in made.stderr

    store = KeyStore.at(Paths.from_env())
    assert store.verify(Secret(value)) == "editor"  # verification works from the hash on disk

    listed = keys_cli("list")
    assert "editor" in listed.stdout and f"…{value[-4:]}" in listed.stdout and value not in listed.stdout
    doc = json.loads(keys_cli("list", "--json").stdout)
    assert [(k["name"], k["last4"], k["in_keyring"]) for k in doc["keys"]] == [("editor", value[-4:], False)]

    dup = keys_cli("create", "editor")
    assert dup.returncode == 2 and "already exists" in dup.stderr

    assert keys_cli("revoke", "editor").returncode == 0
    assert store.verify(Secret(value)) is None
    assert "no API keys" in keys_cli("list").stdout
    gone = keys_cli("revoke", "editor")
    assert gone.returncode == 2 and "no key named 'editor'" in gone.stderr


def test_admin_api_keys_and_require_api_key_on_loopback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"require_api_key": True}))
    boot = keys_cli("create", "boot", home=home)
    assert boot.returncode == 0
    admin = {"Authorization": f"Bearer {boot.stdout.strip()}"}

    s = ServerProcess(home, link_models(tmp_path / "models")).wait_ready()
    try:
        api = httpx.Client(base_url=s.url, timeout=30)
        assert api.get("/health").status_code == 200
        r = api.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert api.get("/v1/models", headers=admin).status_code == 200

        r = api.post("/api/keys", json={"name": "web"}, headers=admin)
        assert r.status_code == 201, r.text
        made = r.json()
        web = made["key"]
        assert made["name"] == "web" and made["last4"] == web[-4:] and made["in_keyring"] is False
        assert "no system keyring" in made["note"]
        assert api.get("/v1/models", headers={"x-api-key": web}).status_code == 200

        listed = api.get("/api/keys", headers=admin).json()
        assert [k["name"] for k in listed["keys"]] == ["boot", "web"] and web not in json.dumps(listed)
        assert api.post("/api/keys", json={"name": "web"}, headers=admin).status_code == 409
        assert api.post("/api/keys", json={"nom": "x"}, headers=admin).status_code == 400
        as_json = {**admin, "Content-Type": "application/json"}  # the admin API reads JSON bodies only
        assert api.post("/api/keys", content=b"{", headers=as_json).status_code == 400

        assert api.delete("/api/keys/web", headers=admin).json() == {"name": "web", "revoked": True}
        assert api.get("/v1/models", headers={"x-api-key": web}).status_code == 401
        assert api.delete("/api/keys/web", headers=admin).status_code == 404
        assert api.post("/api/keys", json={"name": "x"}).status_code == 401  # the admin API needs a key too
        assert web not in s.stderr_text() and boot.stdout.strip() not in s.stderr_text()
    finally:
        pids = s.engine_pids()
        s.stop()
        wait_gone(pids, 5)
