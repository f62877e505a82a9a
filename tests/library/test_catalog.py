"""The SQLite library: migrations, crash safety, corrupt files, sources, origin, aliases, rm rules."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app.core.errors import LibraryError, ModelNotFoundError, RemoveRefusedError
from app.core.paths import Paths
from app.library.catalog import Catalog
from app.library.db import SCHEMA_VERSION, Database, migrate
from app.library.remove import remove_model
from app.library.store import Library
from tests.conftest import REPO
from tests.support.fakehub import FakeHub
from tests.support.modelgen import DIMS_DEFAULT, llama_tensors, write_hf_dir, write_piper_voice


def _paths() -> Paths:
    return Paths.from_env()


def _tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as c:
        return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


# ---- schema and migrations -------------------------------------------------------------------------


def test_new_file_gets_the_whole_schema_in_wal_mode(tmp_path: Path) -> None:
    db = Database(tmp_path / "library.db")
    assert db.query("PRAGMA user_version")[0][0] == SCHEMA_VERSION
    assert db.query("PRAGMA journal_mode")[0][0] == "wal"
    db.close()
    assert {"models", "files", "origin", "headers", "pins", "footprints", "meta"} <= _tables(
        tmp_path / "library.db"
    )


def test_migration_from_the_previous_version_keeps_rows(tmp_path: Path) -> None:
    path = tmp_path / "library.db"
    c = sqlite3.connect(path, isolation_level=None)
    migrate(c, target=1)  # from the first version: every later step runs over the rows
    c.execute(
        "INSERT INTO models(id, format, kind, status, source, location, path, added_at) "
        "VALUES ('m', 'gguf', 'chat', 'ok', 'import_link', '/x', '/x/m.gguf', 1.5)"
    )
    c.execute(
        "INSERT INTO files(model_id, rel_path, size, sha256, mtime_ns) VALUES ('m', 'm.gguf', 3, 'ab', 7)"
    )
    c.close()
    assert "pins" not in _tables(path)
    db = Database(path)
    assert db.query("PRAGMA user_version")[0][0] == SCHEMA_VERSION
    [row] = db.query("SELECT id, added_at, last_used_at FROM models")
    assert (row["id"], row["added_at"], row["last_used_at"]) == ("m", 1.5, None)
    assert db.query("SELECT sha256 FROM files")[0][0] == "ab"
    assert db.query("SELECT COUNT(*) FROM speeds")[0][0] == 0  # step 3: measured speeds
    db.close()


def test_failed_migration_rolls_back_to_the_old_version(tmp_path: Path) -> None:
    path = tmp_path / "library.db"
    c = sqlite3.connect(path, isolation_level=None)
    migrate(c, target=1)
    c.execute("CREATE TABLE pins (x)")  # makes step 2 fail half way through (after its ALTER TABLE)
    with pytest.raises(sqlite3.OperationalError):
        migrate(c)
    assert c.execute("PRAGMA user_version").fetchone()[0] == 1
    cols = [r[1] for r in c.execute("PRAGMA table_info(models)")]
    assert "last_used_at" not in cols  # the ALTER TABLE of the failed step was rolled back too
    c.close()


def test_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "library.db"
    Database(path).close()
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA user_version = 99")
    before = path.read_bytes()
    with pytest.raises(LibraryError, match=r"library\.db is schema version 99.*upgrade Switchyard"):
        Database(path)
    assert path.read_bytes() == before


# ---- corrupt files ----------------------------------------------------------------------------------


def _models(tmp_path: Path, model_store: Path) -> Path:
    d = tmp_path / "models"
    d.mkdir(exist_ok=True)
    shutil.copy(model_store / "tiny.gguf", d / "tiny.gguf")
    return d


@pytest.mark.parametrize("damage", ["not-sqlite", "damaged-pages"])
def test_corrupt_file_is_set_aside_and_rebuilt(tmp_path: Path, model_store: Path, damage: str) -> None:
    paths = _paths()
    paths.home.mkdir(parents=True)
    if damage == "not-sqlite":
        paths.library_db.write_bytes(b"this is not a database\n" * 200)
    else:
        lib = Library.open(paths)
        Catalog([_models(tmp_path, model_store)], library=lib).scan()
        lib.close()
        data = bytearray(paths.library_db.read_bytes())
        data[100 : len(data)] = b"\xff" * (len(data) - 100)  # keep the magic, destroy every page
        paths.library_db.write_bytes(bytes(data))
    original = paths.library_db.read_bytes()
    lib = Library.open(paths)
    [notice] = lib.notices
    assert str(paths.library_db) in notice and "moved to" in notice and "rebuilt" in notice
    [aside] = list(paths.home.glob("library.db.corrupt-*"))
    assert aside.read_bytes() == original  # never overwritten: the old bytes are kept aside
    cat = Catalog([_models(tmp_path, model_store)], library=lib)
    cat.scan()
    assert [r["id"] for r in lib.rows()] == ["tiny"]
    lib.close()


def test_cli_says_the_library_was_set_aside(tmp_path: Path, model_store: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (home / "library.db").write_text("garbage")
    env = dict(os.environ, SWITCHYARD_HOME=str(home))
    out = subprocess.run(
        [str(REPO / ".venv/bin/switchyard"), "ls", "--models-dir", str(_models(tmp_path, model_store))],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert f"{home / 'library.db'} could not be used (it is not an SQLite database)" in out.stderr
    assert "tiny" in out.stdout


# ---- a kill in the middle of a write -------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from app.library.db import Database
    from app.library.model import FileInfo, ModelEntry
    from app.library.store import Library

    lib = Library(Database(Path(sys.argv[1])))
    n = 0
    while True:
        n += 1
        entries = []
        for m in range(8):
            files = tuple(FileInfo(f"gen{n}/f{i}.gguf", n * 1000 + i, n) for i in range(60))
            entries.append(ModelEntry(f"m{m}", Path(f"/x/m{m}.gguf"), None, f"gen {n}", source="models_dir",
                                      location=Path("/x"), files=files))
        lib.sync(entries)
        print(n, flush=True)
    """
)


def test_kill_mid_write_leaves_a_whole_library(tmp_path: Path) -> None:
    db = tmp_path / "library.db"
    Database(db).close()
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(db)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    seen = 0
    while seen < 15 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen = int(line)
    time.sleep(0.037)  # land somewhere inside a later write
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert seen >= 15, "the writer did not get going"
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        models = c.execute("SELECT id, problem FROM models ORDER BY id").fetchall()
        assert [m[0] for m in models] == [f"m{i}" for i in range(8)]
        gens = {m[1] for m in models}
        assert len(gens) == 1, f"one scan is one transaction: all models from the same scan, got {gens}"
        gen = int(gens.pop().split()[1])
        assert gen >= seen
        for mid, _ in models:
            rows = c.execute("SELECT rel_path, size FROM files WHERE model_id = ?", (mid,)).fetchall()
            assert len(rows) == 60
            assert all(r[0].startswith(f"gen{gen}/") and r[1] // 1000 == gen for r in rows)
    Database(db).close()  # and it opens without being set aside
    assert not list(tmp_path.glob("library.db.corrupt-*"))


# ---- models folders --------------------------------------------------------------------------------


def test_models_dir_lists_every_format_and_serves_those_with_lanes(tmp_path: Path, model_store: Path) -> None:
    root = _models(tmp_path, model_store)
    write_hf_dir(root / "org" / "st-model", DIMS_DEFAULT.config(), llama_tensors(DIMS_DEFAULT))
    write_piper_voice(root / "voices")
    lib = Library.open(_paths())
    cat = Catalog([root], library=lib)
    entries = {e.id: e for e in cat.scan()}
    assert set(entries) == {"tiny", "org/st-model", "voices/en_US-test-medium"}
    st = entries["org/st-model"]
    assert (st.format, st.kind, st.status) == ("safetensors", "chat", "ok")
    assert (entries["voices/en_US-test-medium"].format, entries["voices/en_US-test-medium"].kind) == (
        "piper",
        "speech",
    )
    # a Piper voice has a lane (engines/piper.py); so does a safetensors folder (mistral.rs, vLLM, SGLang:
    # which of them can start here is the supervisor's question, not the catalog's)
    assert sorted(cat.ids()) == ["org/st-model", "tiny", "voices/en_US-test-medium"]
    assert cat.get("org/st-model").path == root / "org" / "st-model"
    rows = {r["id"]: r for r in lib.rows()}
    assert rows["tiny"]["source"] == "models_dir" and rows["tiny"]["format"] == "gguf"
    assert rows["tiny"]["size"] == (root / "tiny.gguf").stat().st_size
    assert {f["path"] for f in rows["org/st-model"]["files"]} == {
        "org/st-model/config.json",
        "org/st-model/model.safetensors",
    }
    # a file that went away is dropped from the library on the next scan
    (root / "tiny.gguf").unlink()
    cat.scan()
    assert "tiny" not in {r["id"] for r in lib.rows()}
    lib.close()


def test_headers_are_read_again_only_when_the_file_changes(tmp_path: Path, model_store: Path) -> None:
    root = _models(tmp_path, model_store)
    p = root / "tiny.gguf"
    lib = Library.open(_paths())
    assert Catalog([root], library=lib).scan()[0].ok
    st = p.stat()
    with p.open("r+b") as fh:  # break the header in place, same size, same mtime
        fh.write(b"XXXX")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    fresh = Catalog([root], library=lib)  # a new catalog (another process) reuses library.db's header
    assert fresh.scan()[0].ok
    assert lib.sync(fresh.scan()) == 0  # nothing changed: nothing written
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    [entry] = Catalog([root], library=lib).scan()
    assert not entry.ok and "not a GGUF" in (entry.problem or "")
    lib.close()


def test_pins_and_footprints_live_in_the_library(tmp_path: Path, model_store: Path) -> None:
    paths = _paths()
    paths.home.mkdir(parents=True)
    paths.pins_file.write_text(json.dumps({"tiny": "llama.cpp"}))
    fp = {"file": "/x/tiny.gguf", "size": 1, "mtime_ns": 2, "at": 3.0, "measured": {"totals": {"weights": 5}}}
    paths.footprints_file.write_text(json.dumps({"tiny": fp}))
    lib = Library.open(paths)
    assert lib.footprint("tiny") == fp
    assert not paths.footprints_file.exists() and (paths.home / "footprints.json.imported").exists()
    Catalog([_models(tmp_path, model_store)], library=lib).scan()
    assert lib.pins() == {"tiny": "llama.cpp"}
    paths.pins_file.write_text(json.dumps({}))
    Catalog([_models(tmp_path, model_store)], library=lib).scan()
    assert lib.pins() == {}
    lib.close()
    # imported once: a footprints.json that reappears is not read again over newer figures
    paths.footprints_file.write_text(json.dumps({"tiny": {**fp, "at": 9.0}}))
    lib = Library.open(paths)
    assert lib.footprint("tiny") == fp
    lib.close()


def test_rm_of_a_models_dir_file_needs_delete_files(tmp_path: Path, model_store: Path) -> None:
    paths = _paths()
    root = _models(tmp_path, model_store)
    lib = Library.open(paths)
    cat = Catalog([root], library=lib)
    cat.scan()
    with pytest.raises(RemoveRefusedError, match="--delete-files"):
        remove_model("tiny", catalog=cat, library=lib, imported_root=paths.imported)
    assert (root / "tiny.gguf").exists()
    done = remove_model("tiny", catalog=cat, library=lib, imported_root=paths.imported, delete_files=True)
    assert done.deleted == [str(root / "tiny.gguf")] and not (root / "tiny.gguf").exists()
    assert lib.rows() == []
    lib.close()


# ---- the Hugging Face cache ---------------------------------------------------------------------------

_DOWNLOAD = textwrap.dedent(
    """
    import json, sys
    from huggingface_hub import hf_hub_download
    for repo, name in json.loads(sys.argv[3]):
        hf_hub_download(repo, name, cache_dir=sys.argv[1], endpoint=sys.argv[2])
    """
)


def hf_download(hub: FakeHub, cache: Path, files: list[tuple[str, str]]) -> None:
    """The real huggingface_hub client, in a child so it reads HF_HUB_OFFLINE=0 at import."""
    env = dict(os.environ, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
    out = subprocess.run(
        [sys.executable, "-c", _DOWNLOAD, str(cache), hub.url, json.dumps(files)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


@pytest.fixture
def hf_cache(fake_hub: FakeHub, model_store: Path, tmp_path: Path) -> tuple[FakeHub, Path, dict[str, str]]:
    tiny, tiny2 = model_store / "tiny.gguf", model_store / "tiny2.gguf"
    commits = {
        "org/tiny-GGUF": fake_hub.add_repo(
            "org/tiny-GGUF", {"tiny-Q4_K_M.gguf": tiny, "tiny-Q8_0.gguf": tiny2, "README.md": b"# tiny\n"}
        ),
        "org/split-GGUF": fake_hub.add_repo(
            "org/split-GGUF",
            {
                "Q4_K_M/model-Q4_K_M-00001-of-00002.gguf": tiny,
                "Q4_K_M/model-Q4_K_M-00002-of-00002.gguf": tiny2,
            },
        ),
    }
    st = tmp_path / "st-src"
    write_hf_dir(st, DIMS_DEFAULT.config(), llama_tensors(DIMS_DEFAULT))
    commits["org/st-model"] = fake_hub.add_repo(
        "org/st-model", {"config.json": st / "config.json", "model.safetensors": st / "model.safetensors"}
    )
    cache = Path(os.environ["HF_HUB_CACHE"])
    hf_download(
        fake_hub,
        cache,
        [
            ("org/tiny-GGUF", "tiny-Q4_K_M.gguf"),
            ("org/tiny-GGUF", "tiny-Q8_0.gguf"),
            ("org/tiny-GGUF", "README.md"),
            ("org/split-GGUF", "Q4_K_M/model-Q4_K_M-00001-of-00002.gguf"),
            ("org/split-GGUF", "Q4_K_M/model-Q4_K_M-00002-of-00002.gguf"),
            ("org/st-model", "config.json"),
            ("org/st-model", "model.safetensors"),
        ],
    )
    return fake_hub, cache, commits


def test_hf_cache_models_with_origin_sha256_and_aliases(
    hf_cache: tuple[FakeHub, Path, dict[str, str]],
) -> None:
    hub, cache, commits = hf_cache
    lib = Library.open(_paths())
    cat = Catalog([], library=lib, hf_cache=cache)
    entries = {e.id: e for e in cat.scan()}
    assert set(entries) == {
        "org/tiny-GGUF/tiny-Q4_K_M",
        "org/tiny-GGUF/tiny-Q8_0",
        "org/split-GGUF/model-Q4_K_M",
        "org/st-model",
    }
    split = entries["org/split-GGUF/model-Q4_K_M"]
    assert split.ok and len(split.parts) == 2  # multi-part as one model
    assert entries["org/st-model"].format == "safetensors" and entries["org/st-model"].status == "ok"
    rows = {r["id"]: r for r in lib.rows()}
    q8 = rows["org/tiny-GGUF/tiny-Q8_0"]
    assert q8["source"] == "hf_cache"
    assert q8["origin"]["repo"] == "org/tiny-GGUF" and q8["origin"]["commit"] == commits["org/tiny-GGUF"]
    assert q8["origin"]["revision"] == "main" and q8["origin"]["history"] == []
    assert q8["files"] == [
        {
            "path": "tiny-Q8_0.gguf",
            "size": hub.file("org/tiny-GGUF", "tiny-Q8_0.gguf").size,
            "sha256": hub.file("org/tiny-GGUF", "tiny-Q8_0.gguf").sha256,
            "mtime_ns": q8["files"][0]["mtime_ns"],
        }
    ]
    st_files = {f["path"]: f["sha256"] for f in rows["org/st-model"]["files"]}
    assert st_files["model.safetensors"] == hub.file("org/st-model", "model.safetensors").sha256
    assert st_files["config.json"] is None  # a git (non-LFS) file: its blob is named by sha1, not sha256
    # aliases: repo:QUANT (any case), and the repo alone when it holds one GGUF model
    assert cat.get("org/tiny-GGUF:Q8_0").id == "org/tiny-GGUF/tiny-Q8_0"
    assert cat.get("org/tiny-GGUF:q4_k_m").id == "org/tiny-GGUF/tiny-Q4_K_M"
    assert cat.get("org/split-GGUF").id == "org/split-GGUF/model-Q4_K_M"
    with pytest.raises(ModelNotFoundError, match="names several models"):
        cat.get("org/tiny-GGUF")
    with pytest.raises(ModelNotFoundError):
        cat.get("org/tiny-GGUF:Q2_K")
    # `switchyard pull` marks the repositories it downloaded: their models are listed as `download`
    lib.mark_download("org/tiny-GGUF")
    assert {e.id: e.source for e in cat.scan()}["org/tiny-GGUF/tiny-Q8_0"] == "download"
    assert lib.rows("org/tiny-GGUF/tiny-Q8_0")[0]["source"] == "download"
    assert lib.rows("org/st-model")[0]["source"] == "hf_cache"
    lib.close()


def test_new_revision_is_current_and_old_one_is_history_then_rm(
    hf_cache: tuple[FakeHub, Path, dict[str, str]], model_store: Path
) -> None:
    hub, cache, commits = hf_cache
    new_q8 = (model_store / "embed.gguf").read_bytes()
    second = hub.commit("org/tiny-GGUF", {"tiny-Q8_0.gguf": new_q8})
    hf_download(hub, cache, [("org/tiny-GGUF", "tiny-Q4_K_M.gguf"), ("org/tiny-GGUF", "tiny-Q8_0.gguf")])
    paths = _paths()
    lib = Library.open(paths)
    cat = Catalog([], library=lib, hf_cache=cache)
    cat.scan()
    q8 = lib.rows("org/tiny-GGUF/tiny-Q8_0")[0]
    assert q8["origin"]["commit"] == second and q8["origin"]["history"] == [commits["org/tiny-GGUF"]]
    assert q8["files"][0]["sha256"] == hashlib.sha256(new_q8).hexdigest()
    assert cat.get("org/tiny-GGUF/tiny-Q8_0").kind == "embedding"  # the new revision's file is served

    repo_dir = cache / "models--org--tiny-GGUF"
    q4_blob = repo_dir / "blobs" / hub.file("org/tiny-GGUF", "tiny-Q4_K_M.gguf").sha256
    old_q8_blob = repo_dir / "blobs" / hashlib.sha256((model_store / "tiny2.gguf").read_bytes()).hexdigest()
    new_q8_blob = repo_dir / "blobs" / hashlib.sha256(new_q8).hexdigest()
    # Q4_K_M is the same blob in both snapshots: its link goes, the blob stays for the old snapshot
    done = remove_model("org/tiny-GGUF:Q4_K_M", catalog=cat, library=lib, imported_root=paths.imported)
    assert done.deleted == [str(repo_dir / "snapshots" / second / "tiny-Q4_K_M.gguf")]
    assert q4_blob.exists()
    done = remove_model("org/tiny-GGUF/tiny-Q8_0", catalog=cat, library=lib, imported_root=paths.imported)
    assert str(new_q8_blob) in done.deleted and not new_q8_blob.exists()
    assert old_q8_blob.exists()  # the older revision still uses it
    assert not (repo_dir / "snapshots" / second).exists()  # emptied snapshot goes, with refs/main
    assert not (repo_dir / "refs" / "main").exists()
    # with refs/main gone the remaining (older) snapshot is what the cache holds; huggingface_hub agrees
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(cache)
    assert not info.warnings
    [repo] = [r for r in info.repos if r.repo_id == "org/tiny-GGUF"]
    assert {r.commit_hash for r in repo.revisions} == {commits["org/tiny-GGUF"]}
    ids = {e.id for e in cat.scan()}
    assert "org/tiny-GGUF/tiny-Q8_0" in ids  # from the older snapshot, now the only one
    lib.close()


def test_measured_footprints_are_recorded_in_the_library(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from app.lanes.footprint import Footprint
    from app.library.footprints import LibraryFootprints

    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    plan = SimpleNamespace(
        params=SimpleNamespace(model_path=str(model)),
        public=lambda: {"params": {"ctx_size": 1}},
        predicted=lambda: {"total": 5},
    )
    fp = Footprint()
    fp.add("CPU", "kv_cache", 7)
    lib = Library.open(_paths())
    LibraryFootprints(lib).record(SimpleNamespace(plan=plan, measured=fp, model_id="m"))
    lib.close()
    lib = Library.open(_paths())  # kept across restarts
    got = LibraryFootprints(lib).get("m", path=model)
    assert got is not None and got["measured"]["totals"]["kv_cache"] == 7 and got["predicted"] == {"total": 5}
    model.write_bytes(b"y" * 11)
    assert LibraryFootprints(lib).get("m", path=model) is None  # another file now: its figures are not these
    lib.close()


def test_a_scan_of_other_folders_keeps_what_it_did_not_look_at(tmp_path: Path, model_store: Path) -> None:
    a = _models(tmp_path, model_store)
    b = tmp_path / "other"
    b.mkdir()
    shutil.copy(model_store / "embed.gguf", b / "embed.gguf")
    lib = Library.open(_paths())
    Catalog([a], library=lib).scan()
    added = lib.rows("tiny")[0]["added_at"]
    lib.touch("tiny", at=123.0)
    Catalog([b], library=lib).scan()  # e.g. `switchyard ls --models-dir other` beside a server on `models`
    rows = {r["id"]: r for r in lib.rows()}
    assert set(rows) == {"tiny", "embed"}
    assert rows["tiny"]["added_at"] == added and rows["tiny"]["last_used_at"] == 123.0
    lib.close()
