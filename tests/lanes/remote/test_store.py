"""Registering remotes without a network: names and URLs, where keys go (keyring, environment, this process's
memory) and that no key ever reaches remotes.json, a repr, or an engine's environment."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import keyring
import pytest
from keyring.backend import KeyringBackend

from app.core.errors import BadRequestError, RemoteExistsError, RemoteNotFoundError
from app.core.events import EventBus
from app.core.secrets import Secret
from app.lanes.proc import engine_env
from app.lanes.remote.lane import Remote
from app.lanes.remote.registry import notes_for
from app.lanes.remote.store import RemoteSpec, RemoteStore, check_name, key_env_name, normalize_url

KEY = "sk-remote-0123456789abcdef"


class MemoryKeyring(KeyringBackend):
    """An in-memory keyring backend (the system one is not reachable in tests)."""

    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.items.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.items[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.items.pop((service, username), None)


@pytest.fixture
def memory_keyring() -> Iterator[MemoryKeyring]:
    before = keyring.get_keyring()
    ring = MemoryKeyring()
    keyring.set_keyring(ring)
    try:
        yield ring
    finally:
        keyring.set_keyring(before)


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("http://gpu-box:8000/v1", "http://gpu-box:8000/v1"),
        ("http://gpu-box:8000", "http://gpu-box:8000/v1"),
        ("https://api.example.com/openai/v1/", "https://api.example.com/openai/v1"),
        ("http://[::1]:9000/v1", "http://[::1]:9000/v1"),
    ],
)
def test_urls_are_the_api_root(url: str, want: str) -> None:
    assert normalize_url(url) == want


@pytest.mark.parametrize(
    "url",
    [
        "gpu-box:8000",
        "ftp://h/v1",
        "http://user:pw@h/v1",
        "http://h/v1?key=x",
        "http://h/api",
        "http://h:x/v1",
    ],
)
def test_bad_urls_are_refused_with_an_example(url: str) -> None:
    with pytest.raises(BadRequestError) as exc:
        normalize_url(url)
    assert exc.value.param == "url" and "http" in exc.value.message


def test_names_cannot_hold_a_slash() -> None:
    assert check_name("gpu-box.2") == "gpu-box.2"
    for bad in ("a/b", "", "-x", "x" * 33):
        with pytest.raises(BadRequestError, match="NAME/MODEL"):
            check_name(bad)


def test_key_goes_to_the_keyring_never_to_the_file(tmp_path: Path, memory_keyring: MemoryKeyring) -> None:
    store = RemoteStore.at(tmp_path)
    spec, problem = store.add(RemoteSpec("box", "http://box:8000/v1", ("llama",)), Secret(KEY))
    assert problem is None and spec.key_kept == "keyring"
    assert memory_keyring.items[("switchyard", "remote:box")] == KEY
    text = (tmp_path / "remotes.json").read_text()
    assert KEY not in text and json.loads(text)["remotes"][0]["key_kept"] == "keyring"
    assert (tmp_path / "remotes.json").stat().st_mode & 0o077 == 0
    key, source = store.key("box")
    assert source == "keyring" and key is not None and key.reveal() == KEY and KEY not in repr(key)
    assert "system keyring" in notes_for(spec, key_problem=None)[0]
    with pytest.raises(RemoteExistsError, match="remote rm box"):
        store.add(RemoteSpec("box", "http://other/v1"), None)
    store.remove("box")
    assert memory_keyring.items == {} and store.specs() == []
    with pytest.raises(RemoteNotFoundError):
        store.remove("box")


def test_without_a_keyring_the_key_lives_in_this_process_only(tmp_path: Path) -> None:
    store = RemoteStore.at(tmp_path)  # the tests' keyring backend is the failing one
    spec, problem = store.add(RemoteSpec("box", "http://10.0.0.5:8000/v1"), Secret(KEY))
    assert spec.key_kept == "session" and problem and "no system keyring" in problem
    assert store.key("box")[1] == "session"
    assert RemoteStore.at(tmp_path).key("box") == (None, None)  # another process: gone
    notes = notes_for(spec, key_problem=problem)
    assert "memory only" in notes[0] and key_env_name("box") in notes[0]
    assert "plain http" in notes[1]  # a key sent in the clear to another host is pointed out
    assert KEY not in (tmp_path / "remotes.json").read_text()


def test_environment_key_wins_and_is_kept_from_engines(tmp_path: Path) -> None:
    env = {key_env_name("gpu-box.2"): "from-env", "PATH": "/bin"}
    assert key_env_name("gpu-box.2") == "SWITCHYARD_REMOTE_KEY_GPU_BOX_2"
    store = RemoteStore(tmp_path / "remotes.json", env=env)
    store.add(RemoteSpec("gpu-box.2", "http://h/v1"), Secret(KEY))
    key, source = store.key("gpu-box.2")
    assert source == "env" and key is not None and key.reveal() == "from-env"
    assert engine_env(env) == {"PATH": "/bin"}  # an engine never inherits a remote's key


def test_a_remote_shows_where_its_key_is_but_never_the_key(tmp_path: Path) -> None:
    store = RemoteStore.at(tmp_path)
    spec, _ = store.add(RemoteSpec("box", "http://box:8000/v1", ("a", "b")), Secret(KEY))
    remote = Remote(spec, bus=EventBus(), key=store.key("box"))
    doc = remote.public()
    assert doc["key"] == {"set": True, "source": "session", "kept": "session"}
    assert [m["id"] for m in doc["models"]] == ["box/a", "box/b"] and doc["state"] == "checking"
    assert KEY not in json.dumps(doc) and KEY not in repr(remote.headers().keys())
    assert remote.headers() == {"Authorization": f"Bearer {KEY}"}  # what goes to the remote, only there
