"""A hostile or broken hub, remote or import folder cannot make Switchyard write outside its folders.

The fake hub (tests/support/fakehub.py) answers model info with file names, commit ids and checksums written
by
the test; `switchyard pull`, the download manager and the detail view run against it for real, and the
whole temporary tree (with a sentinel file beside the cache) is compared before and after.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from app.core.errors import (
    BadRequestError,
    CachePathEscapeError,
    HubUnsafeAnswerError,
    ImportRefusedError,
    SwitchyardError,
)
from app.core.events import EventBus
from app.core.paths import Paths
from app.core.settings import Settings
from app.hub import cache_layout, safe_names
from app.hub.browse import Hub
from app.hub.download import DownloadManager, Job
from app.hub.range_reader import sparse_copy
from app.hub.transfer import TransferOptions
from app.lanes.remote.lane import MAX_LISTED, Remote
from app.lanes.remote.store import RemoteSpec, SeenModel
from app.library.importer import import_model
from app.library.opening import open_catalog
from tests.conftest import REPO as SRC
from tests.support.fakehub import FakeHub, hostile_sibling

EVIL = "evil/model-GGUF"
SENTINEL = b"the user's own file: keep these bytes\n"
FAST = TransferOptions(parts=1, backoff_s=0.01, backoff_max_s=0.02, retries=1)

# --- the validator ------------------------------------------------------------------------------------

GOOD_NAMES = [
    "model.gguf",
    "sub/dir/model-Q4_K_M.gguf",
    "Q8_0/tiny-Q8_0-00001-of-00003.gguf",
    ".gitattributes",
    "README.md",
    "onnx/model_quantized.onnx",
    "tokenizer (1).json",
    "ünïcödé/模型.safetensors",
    "a..b.gguf",
    "x" * 255,
]
BAD_NAMES = [
    "../../evil.gguf",
    "a/../../b",
    "..",
    "./model.gguf",
    "a//b",
    "a/",
    "",
    "/etc/passwd",
    "a\\..\\b",
    "..\\evil.gguf",
    "C:evil.gguf",
    "C:\\Windows\\x",
    "model.gguf:stream",
    "CON",
    "nul.txt",
    "sub/com1.gguf",
    "LPT9",
    "COM\u00b9",
    "trailing.",
    "trailing ",
    "x" * 256,
    "é" * 128,  # 256 bytes of UTF-8
    "model\x00.gguf",
    "line\nbreak",
    "esc\x1b[2J.gguf",
    "\u202egguf.exe",
    'q"uote',
    "wild*card",
    None,
    42,
]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_safe_file_names_pass_unchanged(name: str) -> None:
    assert safe_names.path_problem(name) is None
    assert safe_names.check_file_name("org/x", name) == name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_unsafe_file_names_are_refused_naming_repo_and_value(name: Any) -> None:
    assert safe_names.path_problem(name) is not None
    with pytest.raises(HubUnsafeAnswerError) as err:
        safe_names.check_file_name("org/x", name)
    msg = err.value.message
    assert "'org/x'" in msg and "nothing was written" in msg and "unsafe" in msg
    assert safe_names.shown(name)[:40] in msg
    assert "\x00" not in msg and "\n" not in msg and "\x1b" not in msg  # quoted as repr, never raw


@pytest.mark.parametrize(
    ("repo", "ok"),
    [
        ("Qwen/Qwen2.5-0.5B-Instruct-GGUF", True),
        ("bartowski/Llama-3.2-1B-Instruct-GGUF", True),
        ("org_x/model.v1", True),
        ("org/../x", False),
        ("../x", False),
        ("org/..", False),
        ("org/x/y", False),
        ("gpt2", False),
        ("/x", False),
        ("org/", False),
        ("a--b/c", False),  # models--a--b--c would also be a/b--c
        ("org/-x", False),
        ("org/x.", False),
        ("org/x\n", False),
        ("org\\x/y", False),
        ("o" * 97 + "/x", False),
    ],
)
def test_repo_ids(repo: str, ok: bool) -> None:
    assert (safe_names.repo_id_problem(repo) is None) is ok
    if not ok:
        with pytest.raises(BadRequestError):
            cache_layout.repo_folder(Path("/cache"), repo)


def test_commits_checksums_and_revisions() -> None:
    good = "0123456789abcdef0123456789abcdef01234567"
    assert safe_names.check_commit("o/r", good) == good
    for bad in ("../../x", good.upper(), good + "\n", good[:-1], good + "0", "", None):
        with pytest.raises(HubUnsafeAnswerError):
            safe_names.check_commit("o/r", bad)
    sha = hashlib.sha256(b"x").hexdigest()
    assert safe_names.check_blob_key("o/r", sha) == sha and safe_names.check_blob_key("o/r", good) == good
    for bad in ("../x", sha[:-1] + "/", sha + ".incomplete.d", "", None):
        with pytest.raises(HubUnsafeAnswerError):
            safe_names.check_blob_key("o/r", bad)
    for rev in ("main", "v1.0", "refs/pr/1", good):
        assert safe_names.check_revision(rev) == rev
    for rev in ("../../x", "a/../b", "/abs", "ma..in", "a\\b", "x\x00"):
        with pytest.raises(BadRequestError):
            safe_names.check_revision(rev)


def test_inside_follows_planted_symlinks(tmp_path: Path) -> None:
    repo, outside = tmp_path / "models--o--r", tmp_path / "elsewhere"
    (repo / "snapshots").mkdir(parents=True)
    outside.mkdir()
    assert safe_names.inside(repo, repo / "snapshots" / "new" / "f", repo="o/r")  # not there yet: fine
    (repo / "snapshots" / "c").symlink_to(outside)
    with pytest.raises(CachePathEscapeError) as err:
        safe_names.inside(repo, repo / "snapshots" / "c" / "f", repo="o/r")
    assert str(outside) in err.value.message and "'o/r'" in err.value.message


def test_refs_never_become_paths(tmp_path: Path) -> None:
    repo = tmp_path / "models--o--r"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("../../../../etc")
    assert cache_layout.read_ref(repo, "main") is None  # a ref that is no commit names nothing
    with pytest.raises(BadRequestError):
        cache_layout.write_ref(repo, "../../x", "0" * 40)
    with pytest.raises(HubUnsafeAnswerError):
        cache_layout.write_ref(repo, "main", "../x")
    assert (repo / "refs" / "main").read_text() == "../../../../etc"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models--o--r"]


def test_sparse_copy_keeps_to_its_folder(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for name in ("..", "../x.gguf", "/tmp/x.gguf", "a\\b"):
        with pytest.raises(HubUnsafeAnswerError):
            sparse_copy(work, name, b"GGUF", 16)
    assert sparse_copy(work, "x.gguf", b"GGUF", 16).stat().st_size == 16
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["work", "x.gguf"]


# --- a hostile hub, end to end ----------------------------------------------------------------------------


def snapshot_tree(root: Path, *, skip: tuple[str, ...] = ()) -> dict[str, tuple[str, bytes]]:
    """Every entry under `root` (links as links, never followed) with its bytes or target."""
    out: dict[str, tuple[str, bytes]] = {}
    for d, dirs, names in os.walk(root):
        dirs[:] = [n for n in dirs if Path(d, n).relative_to(root).as_posix() not in skip]
        for n in (*dirs, *names):
            p = Path(d, n)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p).encode())
            elif p.is_dir():
                out[rel] = ("dir", b"")
            else:
                out[rel] = ("file", p.read_bytes())
    return out


def cache_dir() -> Path:
    return Path(os.environ["HF_HUB_CACHE"])


def victim(tmp_path: Path) -> Path:
    """A file of the user's beside the cache, where `../` from a snapshot or a blob reaches."""
    v = tmp_path / "hf" / "victim.txt"
    v.parent.mkdir(parents=True, exist_ok=True)
    v.write_bytes(SENTINEL)
    return v


def hostile_cases(tmp_path: Path) -> dict[str, tuple[list[dict[str, Any]], str | None, str]]:
    """name -> (siblings, commit answered, the bad value the error must quote)."""
    body = SENTINEL  # same size as the victim: a blob "already there" is trusted by its size
    up = "sub/" + "../" * 5 + "victim.txt"  # from snapshots/<commit>/sub/ up to HF_HOME
    blob_up = "../../../victim.txt"  # from blobs/ up to HF_HOME
    absolute = str(tmp_path / "hf" / "victim.txt")
    return {
        "traversal": ([hostile_sibling(up, body, lfs=False)], None, up),
        "absolute": ([hostile_sibling(absolute, body)], None, absolute[:30]),
        "backslash": ([hostile_sibling("..\\..\\..\\..\\victim.txt", body)], None, "..\\\\..\\\\"),
        "nul": ([hostile_sibling("model\x00.gguf", body)], None, "model\\x00.gguf"),
        "control": ([hostile_sibling("model\x1b[2J.gguf", body)], None, "model\\x1b[2J"),
        "drive": ([hostile_sibling("C:model.gguf", body)], None, "C:model.gguf"),
        "commit": ([hostile_sibling("model.gguf", body)], "../../../../evilsnap", "../../../../evilsnap"),
        "lfs-sha256": ([hostile_sibling("model.gguf", body, sha256=blob_up)], None, blob_up),
        "blob-id": ([hostile_sibling("README.txt", body, lfs=False, oid=blob_up)], None, blob_up),
        "malformed": ([{"rfilename": "model.gguf", "lfs": {"size": 3}}], None, "malformed"),
    }


CASES = list(hostile_cases(Path("/")).keys())


async def _submit(tmp_path: Path, repo: str, **kw: Any) -> Job:
    async with DownloadManager(
        settings=Settings(), bus=EventBus(), state_dir=tmp_path / "jobs", options=FAST
    ) as m:
        job = await m.submit(repo, **kw)
        await m.wait(job.id)
        return job


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_hub_answer_is_refused_and_nothing_is_written(
    tmp_path: Path, fake_hub: FakeHub, case: str
) -> None:
    siblings, sha, shown = hostile_cases(tmp_path)[case]
    fake_hub.add_hostile_repo(EVIL, siblings, sha=sha, body=SENTINEL)
    v = victim(tmp_path)
    before = snapshot_tree(tmp_path, skip=("jobs",))
    with pytest.raises(HubUnsafeAnswerError) as err:
        asyncio.run(_submit(tmp_path, EVIL))
    msg = err.value.message
    assert EVIL in msg and "nothing was written" in msg and shown in msg, msg
    assert v.read_bytes() == SENTINEL and not v.is_symlink()
    assert snapshot_tree(tmp_path, skip=("jobs",)) == before
    assert not cache_layout.repo_folder(cache_dir(), EVIL).exists()  # not even a snapshot pointing out
    assert not [r for r in fake_hub.requests if r[0] == "GET"]  # refused before a byte was asked for


def test_switchyard_pull_refuses_a_hostile_hub(tmp_path: Path, fake_hub: FakeHub) -> None:
    siblings, _, up = hostile_cases(tmp_path)["traversal"]
    fake_hub.add_hostile_repo(EVIL, siblings, body=SENTINEL)
    v = victim(tmp_path)
    before = snapshot_tree(tmp_path, skip=("sy-home",))
    r = subprocess.run(
        [sys.executable, "-m", "app", "pull", EVIL, "--local"],
        cwd=SRC,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert EVIL in r.stderr and "unsafe" in r.stderr and up in r.stderr, r.stderr
    assert v.read_bytes() == SENTINEL
    assert snapshot_tree(tmp_path, skip=("sy-home",)) == before


def test_the_detail_view_refuses_a_hostile_answer(tmp_path: Path, fake_hub: FakeHub) -> None:
    fake_hub.add_hostile_repo(EVIL, [hostile_sibling("../../x.gguf", b"GGUF")])
    with pytest.raises(HubUnsafeAnswerError) as err:
        Hub(Paths.from_env(), Settings()).client().detail(EVIL, card=False)
    assert EVIL in err.value.message and "'../../x.gguf'" in err.value.message


def test_a_hostile_user_revision_is_refused_before_the_hub_is_asked(
    tmp_path: Path, fake_hub: FakeHub
) -> None:
    fake_hub.add_repo("org/fine", {"model.gguf": b"GGUF" * 10})
    for rev in ("../../../../x", "a/../../b"):
        with pytest.raises(BadRequestError):
            asyncio.run(_submit(tmp_path, "org/fine", revision=rev))
    with pytest.raises(BadRequestError):
        asyncio.run(_submit(tmp_path, "org/../../x"))
    assert fake_hub.api_calls == []


def test_search_leaves_out_hostile_ids(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/fine", {"a.txt": b"a"})
    fake_hub.add_repo("org/\x1b[2Jspoof", {"a.txt": b"a"})
    from app.hub.api import SearchQuery

    page = Hub(Paths.from_env(), Settings()).client().search(SearchQuery())
    assert [h.id for h in page.hits] == ["org/fine"]


@pytest.mark.parametrize("where", ["snapshot-dir", "blobs-dir"])
def test_a_symlink_planted_in_the_cache_is_not_written_through(
    tmp_path: Path, fake_hub: FakeHub, where: str
) -> None:
    data = os.urandom(3000)
    commit = fake_hub.add_repo("org/planted", {"sub/model.gguf": data})
    outside = tmp_path / "outside"
    outside.mkdir()
    repo_dir = cache_layout.repo_folder(cache_dir(), "org/planted")
    if where == "snapshot-dir":
        (repo_dir / "snapshots" / commit).mkdir(parents=True)
        (repo_dir / "snapshots" / commit / "sub").symlink_to(outside)
    else:
        repo_dir.mkdir(parents=True)
        (repo_dir / "blobs").symlink_to(outside)
    job = asyncio.run(_submit(tmp_path, "org/planted", file="sub/model.gguf"))
    assert job.state == "failed" and job.error_code == "cache_path_escape", job.error
    assert str(outside) in (job.error or "") and "org/planted" in (job.error or "")
    assert list(outside.iterdir()) == []
    assert cache_layout.read_ref(repo_dir, "main") is None


def test_a_normal_pull_still_lands(tmp_path: Path, fake_hub: FakeHub) -> None:
    data = os.urandom(5000)
    commit = fake_hub.add_repo("org/fine", {"sub/dir/model-Q4_K_M.gguf": data})
    job = asyncio.run(_submit(tmp_path, "org/fine"))
    assert job.state == "completed", job.error
    snap = cache_layout.repo_folder(cache_dir(), "org/fine") / "snapshots" / commit
    assert (snap / "sub" / "dir" / "model-Q4_K_M.gguf").read_bytes() == data


# --- import paths --------------------------------------------------------------------------------------


def _import(src: Path, **kw: Any) -> Any:
    paths = Paths.from_env()
    library, catalog = open_catalog(Settings(), paths)
    try:
        return import_model(src, catalog=catalog, library=library, imported_root=paths.imported, **kw)
    finally:
        library.close()


def test_import_refuses_a_symlink_out_of_the_folder(tmp_path: Path, model_store: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("api key\n")
    folder = tmp_path / "dl" / "model"
    folder.mkdir(parents=True)
    shutil.copy(model_store / "tiny.gguf", folder / "tiny.gguf")
    (folder / "notes.txt").symlink_to(secret)
    with pytest.raises(ImportRefusedError) as err:
        _import(folder)
    assert "notes.txt" in err.value.message and str(secret) in err.value.message
    imported = Paths.from_env().imported
    assert not imported.exists() or not [p for p in imported.rglob("*") if p.is_file()]


@pytest.mark.parametrize("link", [False, True])
def test_import_refuses_a_pipe_without_hanging(tmp_path: Path, model_store: Path, link: bool) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(model_store / "tiny.gguf", folder / "tiny.gguf")
    os.mkfifo(folder / "extra.gguf")
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            _import(folder, link=link)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "the import hung on a pipe"
    assert outcome and isinstance(outcome[0], ImportRefusedError), outcome
    assert "extra.gguf" in str(outcome[0]) and "not a regular file" in str(outcome[0])
    with pytest.raises(ImportRefusedError):
        _import(folder / "extra.gguf")


def test_import_of_a_hf_snapshot_follows_its_blob_links(tmp_path: Path, model_store: Path) -> None:
    repo = tmp_path / "hub" / "models--o--tiny"
    blob = repo / "blobs" / hashlib.sha256((model_store / "tiny.gguf").read_bytes()).hexdigest()
    blob.parent.mkdir(parents=True)
    shutil.copy(model_store / "tiny.gguf", blob)
    snap = repo / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "tiny.gguf").symlink_to(os.path.relpath(blob, snap))
    entry = _import(snap, name="tiny-snap")
    copied = Path(entry.location) / "tiny.gguf"
    assert copied.read_bytes() == blob.read_bytes() and not copied.is_symlink()


# --- remote lanes' model lists --------------------------------------------------------------------------


@pytest.fixture
def hostile_remote() -> Iterator[str]:
    """An OpenAI-compatible /v1/models that lists hostile ids, on its own thread and loop."""
    listed: list[Any] = [
        {"id": "good/model-1", "kind": "chat"},
        {"id": "line\nINFO forged log line"},
        {"id": "\x1b]0;pwned\x07title"},
        {"id": "x" * 5000},
        {"id": " padded "},
        {"id": ""},
        {"id": 7},
        "not an object",
        {"id": "fine-kind-dropped", "kind": "chat\x1b[2J"},
        *({"id": f"m{i}"} for i in range(MAX_LISTED + 10)),
    ]
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": listed})

    async def start() -> None:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"] = runner
        box["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"  # type: ignore[union-attr]
        ready.set()

    t = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    t.start()
    ready.wait(10)
    yield box["url"]
    asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    t.join(10)
    loop.close()


def test_a_remote_listing_hostile_model_ids_exposes_only_safe_ones(hostile_remote: str) -> None:
    async def go() -> Remote:
        remote = Remote(RemoteSpec(name="peer", url=hostile_remote), bus=EventBus(), key=(None, None))
        async with aiohttp.ClientSession() as http:
            await remote.check(http, key=(None, None))
        return remote

    remote = asyncio.run(go())
    ids = [m.id for m in remote.models()]
    assert ids[:2] == ["good/model-1", "fine-kind-dropped"] and len(ids) == MAX_LISTED
    assert all(i.isprintable() and len(i) <= 256 and i == i.strip() and i for i in ids)
    assert remote.seen[0] == SeenModel("good/model-1", "chat") and remote.seen[1].kind is None
    # 6 bad ids and a non-object; 2 + MAX_LISTED + 10 good ones, 12 of them past the cap
    assert remote.public()["refused_models"] == 7 + 12


def test_a_remote_list_kept_from_before_is_filtered_too() -> None:
    spec = RemoteSpec(
        name="peer", url="http://127.0.0.1:9/v1", seen=(SeenModel("a\nb", None), SeenModel("ok", None))
    )
    assert [m.id for m in Remote(spec, bus=EventBus(), key=(None, None)).models()] == ["ok"]


def test_errors_are_rooted() -> None:
    assert issubclass(CachePathEscapeError, HubUnsafeAnswerError)
    assert issubclass(HubUnsafeAnswerError, SwitchyardError)
