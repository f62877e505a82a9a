"""Search, model detail, hub errors, offline mode and the proxy, against the local fake hub with the real
huggingface_hub client; and the token store (precedence, no-keyring message, 0600 file, masking)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import keyring
import keyring.backend
import keyring.backends.fail
import pytest

from app.core.errors import (
    BadRequestError,
    HubAuthError,
    HubGatedError,
    HubOfflineError,
    HubRepoNotFoundError,
    HubUnreachableError,
)
from app.core.paths import Paths
from app.core.secrets import Secret
from app.core.settings import Settings
from app.hub.api import SearchQuery, strip_front_matter
from app.hub.browse import Hub
from app.hub.token import TokenStore
from tests.support.fakehub import FakeHub, gguf_repo_files
from tests.support.modelgen import GGUFSpec, write_gguf
from tests.support.tinymodels import TinySpec, write_tiny_gguf

TOKEN = "hf_testtoken"


class MemoryKeyring(keyring.backend.KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.store.pop((service, username), None)


@pytest.fixture
def memory_keyring() -> Iterator[MemoryKeyring]:
    before = keyring.get_keyring()
    ring = MemoryKeyring()
    keyring.set_keyring(ring)
    yield ring
    keyring.set_keyring(before)


@pytest.fixture
def no_keyring() -> Iterator[None]:
    before = keyring.get_keyring()
    keyring.set_keyring(keyring.backends.fail.Keyring())
    yield
    keyring.set_keyring(before)


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("browse-ggufs")
    split = write_gguf(d / "split" / "m.gguf", GGUFSpec(split_max_tensors=6))
    return {
        "Q4_K_M": write_tiny_gguf(d / "a.gguf", TinySpec(seed=3)),
        "Q8_0": write_tiny_gguf(d / "b.gguf", TinySpec(seed=4, n_embd=128)),
        **{f"part{i}": p for i, p in enumerate(split.paths, 1)},
    }


def _hub(settings: Settings | None = None, *, env_token: str | None = None) -> Hub:
    env = dict(os.environ)
    env.pop("HF_TOKEN", None)
    if env_token:
        env["HF_TOKEN"] = env_token
    s = settings or Settings()
    return Hub(Paths.from_env(), s, tokens=TokenStore(Paths.from_env(), s, env=env))


def _populate(hub: FakeHub, ggufs: dict[str, Path]) -> None:
    files = gguf_repo_files("tiny", {"Q4_K_M": ggufs["Q4_K_M"], "Q8_0": ggufs["Q8_0"]})
    for i in range(1, 5):
        files[f"Q2_K/tiny-Q2_K-{i:05d}-of-00004.gguf"] = ggufs[f"part{i}"].read_bytes()
    files["mmproj-tiny-f16.gguf"] = ggufs["Q4_K_M"].read_bytes()
    hub.add_repo("org/tiny-GGUF", files, tags=["gguf", "license:apache-2.0"], downloads=500, likes=3)
    for i in range(5):
        hub.add_repo(
            f"acme/chat-{i}",
            {"README.md": b"# chat\n", "model.safetensors": b"\0" * 16},
            tags=["safetensors"],
            library_name="transformers",
            downloads=10 * i,
            likes=5 - i,
        )
    hub.add_repo("acme/chat-mlx", {"README.md": b"x"}, tags=["mlx"], downloads=1000, likes=0)


# ---- search ---------------------------------------------------------------------------------------------
def test_search_query_filters_sort_author(fake_hub: FakeHub, ggufs: dict[str, Path]) -> None:
    _populate(fake_hub, ggufs)
    client = _hub().client()
    by_dl = client.search(SearchQuery(text="chat", sort="downloads"))
    assert [h.id for h in by_dl.hits] == ["acme/chat-mlx", *(f"acme/chat-{i}" for i in (4, 3, 2, 1, 0))]
    assert by_dl.next_page is None
    by_likes = client.search(SearchQuery(text="chat", sort="likes", size=2))
    assert [h.id for h in by_likes.hits] == ["acme/chat-0", "acme/chat-1"]
    gguf = client.search(SearchQuery(format="gguf"))
    assert [h.id for h in gguf.hits] == ["org/tiny-GGUF"]
    assert gguf.hits[0].public()["formats"] == ["gguf"]
    mlx = client.search(SearchQuery(format="mlx", author="acme"))
    assert [h.id for h in mlx.hits] == ["acme/chat-mlx"]
    assert client.search(SearchQuery(author="nobody")).hits == []
    updated = client.search(SearchQuery(sort="updated", size=1))
    assert updated.hits[0].id == "acme/chat-mlx"  # the last one committed
    with pytest.raises(BadRequestError, match="unknown format 'onnx'"):
        client.search(SearchQuery(format="onnx"))


def test_search_pagination_across_hub_pages(fake_hub: FakeHub, ggufs: dict[str, Path]) -> None:
    _populate(fake_hub, ggufs)
    fake_hub.page_size = 2  # the hub answers 2 per response: huggingface_hub follows its Link headers
    client = _hub().client()
    seen: list[str] = []
    page: int | None = 1
    while page is not None:
        result = client.search(SearchQuery(sort="downloads", size=3, page=page))
        assert len(result.hits) <= 3
        seen += [h.id for h in result.hits]
        page = result.next_page
    assert len(seen) == 7 and len(set(seen)) == 7
    assert seen[0] == "acme/chat-mlx" and seen[1] == "org/tiny-GGUF"
    assert sum(1 for _, path in fake_hub.api_calls if path == "/api/models") > 3


# ---- detail ---------------------------------------------------------------------------------------------
def test_detail_groups_quants_with_sizes_and_sha(fake_hub: FakeHub, ggufs: dict[str, Path]) -> None:
    _populate(fake_hub, ggufs)
    d = _hub().client().detail("org/tiny-GGUF")
    doc = d.public()
    assert doc["commit"] == fake_hub.repos["org/tiny-GGUF"].head.sha
    assert doc["license"] == "apache-2.0" and doc["gated"] is False and doc["downloads"] == 500
    assert doc["card"].startswith("# tiny") and "license:" not in doc["card"]
    names = [q["name"] for q in doc["quantizations"]]
    assert sorted(names) == ["Q2_K", "Q4_K_M", "Q8_0"]
    q2 = next(q for q in doc["quantizations"] if q["name"] == "Q2_K")
    assert q2["parts"] == 4 and q2["complete"] and len(q2["files"]) == 4
    assert q2["size"] == sum(ggufs[f"part{i}"].stat().st_size for i in range(1, 5))
    q8 = next(q for q in doc["quantizations"] if q["name"] == "Q8_0")
    assert q8["files"][0]["sha256"] == fake_hub.file("org/tiny-GGUF", "tiny-Q8_0.gguf").sha256
    assert [p["path"] for p in doc["projectors"]] == ["mmproj-tiny-f16.gguf"]
    assert "gguf" in doc["formats"]


def test_front_matter_stripped() -> None:
    assert strip_front_matter("---\nlicense: mit\ntags: [a]\n---\n\n# Title\nbody") == "# Title\nbody"
    assert strip_front_matter("# no front matter\n---\n") == "# no front matter\n---\n"


def test_missing_repo_and_bad_id(fake_hub: FakeHub) -> None:
    client = _hub().client()
    with pytest.raises(HubRepoNotFoundError, match=r"nobody/nothing was not found.*switchyard hub login"):
        client.detail("nobody/nothing")
    with pytest.raises(BadRequestError, match="owner/name"):
        client.detail("../etc")


def test_gated_without_and_with_token(fake_hub: FakeHub, ggufs: dict[str, Path]) -> None:
    fake_hub.add_repo("meta/gated-GGUF", gguf_repo_files("g", {"Q4_K_M": ggufs["Q4_K_M"]}), gated="manual")
    anon = _hub().client()
    d = anon.detail("meta/gated-GGUF")
    assert d.gated == "manual"
    assert d.card is None and "accept its license" in (d.card_problem or "")
    with pytest.raises(HubGatedError) as info:
        anon.reader.gguf_header("meta/gated-GGUF", d.commit, "g-Q4_K_M.gguf")
    msg = info.value.message
    assert f"{fake_hub.url}/meta/gated-GGUF" in msg and "switchyard hub login" in msg
    assert info.value.status == 403
    # a token whose account has not accepted yet: the message says so, and never shows the token
    with_token = _hub(env_token=TOKEN).client()
    with pytest.raises(HubGatedError, match="no access yet") as info2:
        with_token.reader.gguf_header("meta/gated-GGUF", d.commit, "g-Q4_K_M.gguf")
    assert TOKEN not in info2.value.message
    fake_hub.grant(TOKEN, "meta/gated-GGUF")
    granted = with_token.detail("meta/gated-GGUF")
    assert granted.card is not None and granted.card.startswith("# g")
    assert with_token.reader.gguf_header("meta/gated-GGUF", d.commit, "g-Q4_K_M.gguf").total > 0


def test_private_repo_needs_token(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("me/private", {"README.md": b"# secret\n"}, private=True)
    with pytest.raises(HubRepoNotFoundError, match="if it is private"):
        _hub().client().detail("me/private")
    assert _hub(env_token=TOKEN).client().detail("me/private").card == "# secret\n"


def test_hub_5xx_and_unreachable(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/x", {"README.md": b"x"})
    fake_hub.faults.api_fail_5xx = 1
    with pytest.raises(HubUnreachableError, match=r"answered 503.*try again later"):
        _hub().client().detail("org/x")
    assert _hub().client().detail("org/x").id == "org/x"  # the fault was one answer only
    # search pages go through huggingface_hub's retry with backoff: one 503 is survived
    fake_hub.faults.api_fail_5xx = 1
    fake_hub.reset_counters()
    assert [h.id for h in _hub().client().search(SearchQuery()).hits] == ["org/x"]
    assert len(fake_hub.api_calls) == 2
    # a header read that gets a 503 says so (and the next one works)
    fake_hub.add_repo("org/g", {"m-Q4_0.gguf": b"GGUF" + bytes(60)})
    fake_hub.faults.fail_5xx = 1
    reader = _hub().client().reader
    with pytest.raises(HubUnreachableError, match=r"answered 503 for m-Q4_0\.gguf in org/g"):
        reader.gguf_header("org/g", "main", "m-Q4_0.gguf")
    dead = _hub(Settings.flat(hf_endpoint="http://127.0.0.1:9")).client()  # nothing listens on port 9
    with pytest.raises(HubUnreachableError, match=r"cannot reach the hub at http://127\.0\.0\.1:9"):
        dead.detail("org/x")  # (search retries a dead hub with backoff for ~20 s first; detail does not)


def test_offline_fails_fast_without_requests(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("org/x", {"README.md": b"x"})
    for hub in (_hub(Settings.flat(offline=True)), None):
        if hub is None:
            monkeypatch.setenv("HF_HUB_OFFLINE", "1")
            hub = _hub()
        client = hub.client()
        with pytest.raises(HubOfflineError, match="offline"):
            client.search(SearchQuery())
        with pytest.raises(HubOfflineError, match="offline"):
            client.detail("org/x")
        with pytest.raises(HubOfflineError):
            client.reader.gguf_header("org/x", "main", "x.gguf")
    assert fake_hub.api_calls == [] and fake_hub.requests == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # back online without a restart
    assert _hub().client().detail("org/x").id == "org/x"


def test_proxy_setting_is_what_the_client_uses(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/x", {"README.md": b"# via proxy\n"})
    # the endpoint's host does not resolve; only a client that goes through the proxy reaches it
    settings = Settings.flat(hf_endpoint="http://hub.invalid", hf_proxy=fake_hub.url)
    client = _hub(settings).client()
    assert client.config.proxy == fake_hub.url
    assert [h.id for h in client.search(SearchQuery()).hits] == ["org/x"]
    assert client.detail("org/x").card == "# via proxy\n"
    assert ("hub.invalid", "/api/models") in fake_hub.api_calls
    assert ("hub.invalid", "/api/models/org/x") in fake_hub.api_calls
    # and without the proxy the same endpoint is unreachable
    with pytest.raises(HubUnreachableError):
        _hub(Settings.flat(hf_endpoint="http://hub.invalid")).client().detail("org/x")


# ---- token store ----------------------------------------------------------------------------------------
def test_token_precedence(memory_keyring: MemoryKeyring, isolated_env: Path) -> None:
    paths = Paths.from_env()
    settings = Settings()
    store = TokenStore(paths, settings, env={})
    assert store.find().source is None and store.get() is None
    paths.home.mkdir(parents=True, exist_ok=True)
    store.file.write_text("hf_fromfile\n")
    store.file.chmod(0o600)
    assert store.find().source == "file" and store.get().reveal() == "hf_fromfile"  # type: ignore[union-attr]
    store.vault.hold("hf_token", Secret("hf_session"))
    assert store.find().source == "session"
    memory_keyring.set_password("switchyard", "hf_token", "hf_fromkeyring")
    assert store.find().source == "keyring" and store.get().reveal() == "hf_fromkeyring"  # type: ignore[union-attr]
    env_store = TokenStore(paths, settings, env={"HF_TOKEN": "hf_fromenv"})
    assert env_store.find().source == "env" and env_store.get().reveal() == "hf_fromenv"  # type: ignore[union-attr]


def test_set_stores_in_keyring_and_clear(memory_keyring: MemoryKeyring) -> None:
    store = TokenStore(Paths.from_env(), Settings(), env={})
    stored = store.set(Secret("hf_abc"))
    assert stored.where == "keyring" and stored.persistent
    assert memory_keyring.store[("switchyard", "hf_token")] == "hf_abc"
    assert not store.file.exists()
    assert store.clear() == ["keyring"]
    assert store.get() is None


def test_no_keyring_session_only_unless_file(no_keyring: None) -> None:
    paths = Paths.from_env()
    store = TokenStore(paths, Settings(), env={})
    stored = store.set(Secret("hf_session_only"))
    assert stored.where == "session" and not stored.persistent
    assert "no system keyring is available here" in stored.note and "--file" in stored.note
    assert "hf_session_only" not in stored.note
    assert store.find().source == "session" and not store.file.exists()
    # another process (a new store) does not see it
    assert TokenStore(paths, Settings(), env={}).get() is None
    # opted in: the 0600 file
    stored = TokenStore(paths, Settings.flat(hf_token_file=True), env={}).set(Secret("hf_in_file"))
    assert stored.where == "file" and stored.persistent
    f = paths.home / "hf_token"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600 and f.read_text().strip() == "hf_in_file"
    assert TokenStore(paths, Settings(), env={}).find().source == "file"
    # a file others can read is ignored, with the reason
    f.chmod(0o644)
    found = TokenStore(paths, Settings(), env={}).find()
    assert found.token is None and "readable by other users" in found.problems[0]


def test_secrets_masked(fake_hub: FakeHub) -> None:
    hub = _hub(env_token=TOKEN)
    config = hub.config()
    assert TOKEN not in repr(config) and TOKEN not in str(config.public())
    assert TOKEN not in repr(hub.tokens.find()) and TOKEN not in str(hub.tokens.find().public())
    status = hub.status()
    assert status["verified"] is True and status["user"] == "tester" and status["token"]["source"] == "env"
    assert TOKEN not in str(status)
    bad = _hub(env_token="hf_wrong")
    status = bad.status()
    assert status["verified"] is False and "rejected the token" in status["problem"]
    assert "hf_wrong" not in str(status)
    with pytest.raises(HubAuthError):
        bad.client().whoami()
