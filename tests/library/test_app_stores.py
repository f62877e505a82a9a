"""Models other apps keep (Ollama, LM Studio, Jan, GPT4All, shared folders): listed, explained and served
in place, never written; gone from the list when the other app deletes them; refused by `rm`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import openai
import pytest

from app.core.errors import RemoveRefusedError, SettingsError
from app.core.paths import Paths
from app.core.settings import Settings, settings_from_mapping
from app.library.app_stores import app_stores
from app.library.opening import opened_catalog
from app.library.remove import remove_model
from tests.conftest import REPO, running_server
from tests.support.appstore_layouts import TEMPLATE, fingerprint, jan_model, lmstudio_model, ollama_model

SWITCHYARD = str(REPO / ".venv" / "bin" / "switchyard")


@pytest.fixture
def apps_home(tmp_path: Path) -> Path:
    return Path(os.environ["SWITCHYARD_APPS_HOME"])


def _stores(apps_home: Path, model_store: Path) -> dict[str, Path]:
    """An Ollama store, an LM Studio folder, a Jan folder and a GPT4All folder where each app keeps them."""
    tiny = model_store / "tiny.gguf"
    ollama = apps_home / ".ollama" / "models"
    ollama_model(ollama, tiny, name="tiny", quant="Q8_0")
    ollama_model(ollama, model_store / "tiny2.gguf", name="tiny2", tag="v1", namespace="someone")
    # a pull in progress: the manifest names a blob not there yet (Ollama writes blobs first; a removal
    # may delete them before the manifest): skipped, never an error
    half = ollama_model(ollama, model_store / "embed.gguf", name="half")
    doc = json.loads(half.read_text())
    doc["layers"][0]["digest"] = "sha256:" + "0" * 64
    half.write_text(json.dumps(doc))
    lms = apps_home / ".lmstudio" / "models"
    lmstudio_model(lms, tiny, publisher="lmstudio-community", repo="Tiny-GGUF", file="tiny-Q8_0.gguf")
    jan = apps_home / ".local" / "share" / "Jan" / "data" / "llamacpp" / "models"
    jan_model(jan, model_store / "tiny2.gguf", model_id="tiny-jan")
    gpt4all = apps_home / ".local" / "share" / "nomic.ai" / "GPT4All"
    gpt4all.mkdir(parents=True)
    (gpt4all / "tiny-g4a.gguf").write_bytes(tiny.read_bytes())
    (gpt4all / "incomplete-next.gguf").write_bytes(tiny.read_bytes()[:1000])
    return {"ollama": ollama, "lmstudio": lms, "jan": jan, "gpt4all": gpt4all}


def test_stores_are_found_where_each_app_keeps_them(
    apps_home: Path, model_store: Path, tmp_path: Path
) -> None:
    roots = _stores(apps_home, model_store)
    before = fingerprint(*roots.values())
    found = {s.app: s.root for s in app_stores(Settings())}
    assert found == roots
    with opened_catalog(Settings(), Paths.from_env()) as (_library, catalog):
        entries = {e.id: e for e in catalog.scan()}
    ollama = entries["ollama:tiny:latest"]
    assert ollama.ok and ollama.source == "app_store" and ollama.kind == "chat"
    assert ollama.path.parent == roots["ollama"] / "blobs"  # the blob itself, never a copy
    assert ollama.owner is not None and ollama.owner.name == "tiny:latest"
    assert (ollama.owner.family, ollama.quant, ollama.owner.template) == ("llama", "Q8_0", TEMPLATE)
    assert ollama.files[0].sha256 == ollama.path.name.removeprefix("sha256-")
    assert entries["ollama:someone/tiny2:v1"].ok
    assert not any("half" in mid for mid in entries)  # incomplete: not listed, no error
    assert entries["lmstudio:lmstudio-community/Tiny-GGUF/tiny-Q8_0"].ok
    assert entries["jan:tiny-jan"].ok
    assert entries["gpt4all:tiny-g4a"].ok
    assert not any("incomplete" in mid for mid in entries)
    public = ollama.public()
    assert public["owner"]["app"] == "ollama" and public["owner"]["read_only"] is True
    assert fingerprint(*roots.values()) == before


def test_a_model_the_other_app_deletes_drops_out_without_an_error(apps_home: Path, model_store: Path) -> None:
    roots = _stores(apps_home, model_store)
    with opened_catalog(Settings(), Paths.from_env()) as (library, catalog):
        assert "ollama:tiny:latest" in {e.id for e in catalog.scan()}
        assert "ollama:tiny:latest" in {r["id"] for r in library.rows()}
        # `ollama rm tiny` deletes the manifest, then the blobs nothing else uses
        manifest = roots["ollama"] / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
        manifest.unlink()
        (roots["lmstudio"] / "lmstudio-community" / "Tiny-GGUF" / "tiny-Q8_0.gguf").unlink()
        ids = {e.id for e in catalog.scan()}
        assert (
            "ollama:tiny:latest" not in ids and "lmstudio:lmstudio-community/Tiny-GGUF/tiny-Q8_0" not in ids
        )
        assert "ollama:tiny:latest" not in {r["id"] for r in library.rows()}
        assert "gpt4all:tiny-g4a" in ids


def test_rm_refuses_and_says_which_app_removes_it(apps_home: Path, model_store: Path, tmp_path: Path) -> None:
    roots = _stores(apps_home, model_store)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "mine.gguf").write_bytes((model_store / "tiny.gguf").read_bytes())
    settings = Settings.flat(shared_model_dirs=(shared,))
    before = fingerprint(*roots.values(), shared)
    paths = Paths.from_env()
    with opened_catalog(settings, paths) as (library, catalog):
        catalog.scan()
        with pytest.raises(RemoveRefusedError, match="ollama rm tiny:latest"):
            remove_model("ollama:tiny:latest", catalog=catalog, library=library, imported_root=paths.imported)
        for mid in ("gpt4all:tiny-g4a", "mine"):
            with pytest.raises(RemoveRefusedError, match="never changes"):
                remove_model(
                    mid, catalog=catalog, library=library, imported_root=paths.imported, delete_files=True
                )
        assert catalog.get("mine").owner is not None
    assert fingerprint(*roots.values(), shared) == before


def test_app_store_settings_are_checked(tmp_path: Path, apps_home: Path, model_store: Path) -> None:
    with pytest.raises(SettingsError, match="not an app whose store"):
        settings_from_mapping({"app_stores": ["ollama", "kobold"]})
    with pytest.raises(SettingsError, match="app_store_paths must map"):
        settings_from_mapping({"app_store_paths": ["x"]})
    elsewhere = tmp_path / "big-disk" / "ollama"
    ollama_model(elsewhere, model_store / "tiny.gguf", name="moved")
    _stores(apps_home, model_store)
    s = settings_from_mapping({"app_stores": ["ollama"], "app_store_paths": {"ollama": str(elsewhere)}})
    with opened_catalog(s, Paths.from_env()) as (_library, catalog):
        ids = {e.id for e in catalog.scan()}
    assert "ollama:moved:latest" in ids and "ollama:tiny:latest" not in ids and "jan:tiny-jan" not in ids


def test_served_explained_and_listed_in_place(apps_home: Path, model_store: Path, tmp_path: Path) -> None:
    """A real `switchyard serve` answers from the Ollama blob and the LM Studio file, explains them, and
    `switchyard ls --origin` says where each came from; every store file's bytes and mtime unchanged."""
    roots = _stores(apps_home, model_store)
    before = fingerprint(*roots.values())
    empty = tmp_path / "own-models"
    empty.mkdir()
    home = tmp_path / "serve-home"
    with running_server(home, empty) as server:
        client = openai.OpenAI(base_url=server.api, api_key="none")
        listed = {m.id for m in client.models.list()}
        assert {"ollama:tiny:latest", "lmstudio:lmstudio-community/Tiny-GGUF/tiny-Q8_0"} <= listed
        for mid in ("ollama:tiny:latest", "lmstudio:lmstudio-community/Tiny-GGUF/tiny-Q8_0"):
            got = client.chat.completions.create(
                model=mid,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=16,
                extra_body={"grammar": 'root ::= "in place"'},
            )
            assert got.choices[0].message.content == "in place"
        explained = client.get(f"{server.url}/api/models/ollama:tiny:latest/explain", cast_to=object)
        assert isinstance(explained, dict) and explained["decision"]["lane"] == "llama.cpp", explained
    env = dict(os.environ, SWITCHYARD_HOME=str(home))
    out = subprocess.run(
        [SWITCHYARD, "ls", "--origin", "--models-dir", str(empty)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("ollama:tiny:latest"))
    assert "Ollama (tiny:latest), read-only" in line and str(roots["ollama"] / "blobs") in line
    assert "LM Studio (lmstudio-community/Tiny-GGUF/tiny-Q8_0.gguf)" in out.stdout
    assert fingerprint(*roots.values()) == before
