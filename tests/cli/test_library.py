"""`switchyard import / ls / rm` as a user runs them, the library admin API, and an HF cache model served."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import REPO, link_models, running_server
from tests.library.test_catalog import hf_download
from tests.support.fakehub import FakeHub
from tests.support.modelgen import DIMS_DEFAULT, llama_tensors, write_hf_dir

SWITCHYARD = str(REPO / ".venv" / "bin" / "switchyard")


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SWITCHYARD_HOME=str(home))
    return subprocess.run([SWITCHYARD, *args], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)


def ls(home: Path, *extra: str) -> dict[str, dict[str, Any]]:
    out = cli(home, "ls", "--json", *extra)
    assert out.returncode == 0, out.stderr
    return {m["id"]: m for m in json.loads(out.stdout)["models"]}


def call(url: str, method: str = "GET", body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_import_copy_link_refusals_and_rm(tmp_path: Path, model_store: Path) -> None:
    home = tmp_path / "home"
    models = tmp_path / "models"
    models.mkdir()
    src = tmp_path / "outside" / "my-model.gguf"
    src.parent.mkdir()
    shutil.copy(model_store / "tiny.gguf", src)
    before = src.read_bytes()

    out = cli(home, "import", str(src), "--models-dir", str(models))
    assert out.returncode == 0, out.stderr
    assert "imported my-model" in out.stdout
    copied = home / "models" / "imported" / "my-model" / "my-model.gguf"
    assert copied.read_bytes() == before and src.read_bytes() == before
    out = cli(home, "import", str(src), "--link", "--name", "org/linked", "--models-dir", str(models))
    assert out.returncode == 0, out.stderr

    listed = ls(home, "--models-dir", str(models))
    assert listed["my-model"]["source"] == "import_copy" and listed["my-model"]["status"] == "ok"
    assert listed["my-model"]["files"][0]["sha256"] == hashlib.sha256(before).hexdigest()
    assert listed["org/linked"]["source"] == "import_link" and listed["org/linked"]["path"] == str(src)
    table = cli(home, "ls", "--models-dir", str(models)).stdout
    assert "import_copy" in table and "import_link" in table and "SOURCE" in table

    # a folder is copied whole, and listed with its format
    st = tmp_path / "outside" / "st-model"
    write_hf_dir(st, DIMS_DEFAULT.config(), llama_tensors(DIMS_DEFAULT))
    out = cli(home, "import", str(st), "--name", "org/st", "--models-dir", str(models))
    assert out.returncode == 0, out.stderr
    assert (home / "models" / "imported" / "org" / "st" / "model.safetensors").exists()
    got = ls(home, "--models-dir", str(models))["org/st"]
    assert (got["format"], got["status"], got["source"]) == ("safetensors", "ok", "import_copy")
    assert {f["path"] for f in got["files"]} == {"config.json", "model.safetensors"}
    assert all(f["sha256"] for f in got["files"])
    assert cli(home, "rm", "org/st", "--models-dir", str(models)).returncode == 0
    assert not (home / "models" / "imported" / "org").exists()

    # refusals: not a model, an id that climbs out, an id already taken
    junk = tmp_path / "outside" / "notes.txt"
    junk.write_text("hello")
    out = cli(home, "import", str(junk))
    assert out.returncode == 2 and "cannot be imported" in out.stderr and str(junk) in out.stderr
    out = cli(home, "import", str(src), "--name", "../../escaped")
    assert out.returncode == 2 and "not a usable model id" in out.stderr
    assert not (home / "escaped").exists() and not (tmp_path / "escaped").exists()
    out = cli(home, "import", str(src), "--models-dir", str(models))
    assert out.returncode == 2 and "already in the library" in out.stderr and "--name" in out.stderr

    # rm: a link is unregistered and the user's file kept; a copy is deleted
    out = cli(home, "rm", "org/linked", "--models-dir", str(models))
    assert out.returncode == 0, out.stderr
    assert "unregistered org/linked" in out.stdout and src.read_bytes() == before
    out = cli(home, "rm", "my-model", "--models-dir", str(models))
    assert out.returncode == 0, out.stderr
    assert not copied.parent.exists() and src.exists()
    assert set(ls(home, "--models-dir", str(models))) == set()


def test_rm_is_refused_while_loaded_and_the_api_keeps_to_the_library(
    tmp_path: Path, model_store: Path
) -> None:
    home = tmp_path / "home"
    models = link_models(tmp_path / "models", model_store / "tiny.gguf", model_store / "embed.gguf")
    with running_server(home, models) as s:
        code, lib = call(s.url + "/api/library")
        assert code == 200 and {m["id"] for m in lib["models"]} == {"tiny", "embed"}
        assert lib["library"] == str(home / "library.db")
        code, _ = call(s.url + "/api/models/tiny/load", "POST", {})
        assert code == 200
        out = cli(home, "rm", "tiny", "--delete-files")
        assert out.returncode == 2
        assert "loaded in lane 'tiny'" in out.stderr and "unload it first" in out.stderr
        assert (models / "tiny.gguf").exists()
        code, err = call(s.url + "/api/library/tiny", "DELETE")
        assert code == 409 and err["error"]["code"] == "model_loaded"
        code, one = call(s.url + "/api/library/tiny")
        assert code == 200 and one["last_used_at"] is not None and one["files"][0]["path"] == "tiny.gguf"

        # nothing from a request reaches outside the library
        victim = tmp_path / "victim.gguf"
        shutil.copy(model_store / "tiny.gguf", victim)
        for bad in ("..%2F..%2Fvictim", "../../victim", "%2e%2e/%2e%2e/victim.gguf"):
            code, _ = call(f"{s.url}/api/library/{bad}?delete_files=true", "DELETE")
            assert code in (400, 404), bad
        code, err = call(s.url + "/api/library/import", "POST", {"path": str(victim), "name": "../../../x"})
        assert code == 400 and "not a usable model id" in err["error"]["message"]
        code, err = call(s.url + "/api/library/import", "POST", {"path": str(tmp_path)})
        assert code == 400 and "holds the library's own folder" in err["error"]["message"], err
        (tmp_path / "docs").mkdir()
        (tmp_path / "docs" / "a.txt").write_text("not a model")
        code, err = call(s.url + "/api/library/import", "POST", {"path": str(tmp_path / "docs")})
        assert (
            code == 400
            and err["error"]["code"] == "import_refused"
            and "no model found" in err["error"]["message"]
        )
        assert victim.exists() and not (home / "x").exists() and not (tmp_path / "x").exists()
        code, made = call(s.url + "/api/library/import", "POST", {"path": str(victim), "link": True})
        assert code == 201 and made["id"] == "victim" and made["source"] == "import_link"
        code, gone = call(s.url + "/api/library/victim", "DELETE")
        assert code == 200 and gone["action"] == "unregistered" and victim.exists()

        code, _ = call(s.url + "/api/models/tiny/unload", "POST", {})
        assert code == 200
        out = cli(home, "rm", "tiny")
        assert out.returncode == 2 and "--delete-files" in out.stderr  # the user's own file
        out = cli(home, "rm", "tiny", "--delete-files")
        assert out.returncode == 0, out.stderr
        assert not (models / "tiny.gguf").exists()
        code, _ = call(s.url + "/api/library/tiny")
        assert code == 404


def test_a_model_in_the_hf_cache_is_served(fake_hub: FakeHub, tmp_path: Path, model_store: Path) -> None:
    commit = fake_hub.add_repo("org/tiny-GGUF", {"tiny-Q4_K_M.gguf": model_store / "tiny.gguf"})
    hf_download(fake_hub, Path(os.environ["HF_HUB_CACHE"]), [("org/tiny-GGUF", "tiny-Q4_K_M.gguf")])
    home = tmp_path / "home"
    empty = tmp_path / "models"
    write_hf_dir(empty / "org" / "st-model", DIMS_DEFAULT.config(), llama_tensors(DIMS_DEFAULT))
    listed = ls(home, "--models-dir", str(empty))
    assert listed["org/st-model"]["status"] == "ok"
    m = listed["org/tiny-GGUF/tiny-Q4_K_M"]
    assert m["source"] == "hf_cache" and m["origin"]["commit"] == commit and m["quant"] == "Q4_K_M"
    assert f"org/tiny-GGUF@{commit[:7]}" in cli(home, "ls", "--models-dir", str(empty)).stdout
    with running_server(home, empty) as s:
        client = openai.OpenAI(base_url=s.api, api_key="none")
        assert "org/tiny-GGUF/tiny-Q4_K_M" in {x.id for x in client.models.list()}
        r = client.chat.completions.create(
            model="org/tiny-GGUF:Q4_K_M",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            extra_body={"grammar": 'root ::= "hello"'},
        )
        assert r.choices[0].message.content == "hello"
        assert "org/st-model" in {x.id for x in client.models.list()}
        # listed and routed, but this folder has no tokenizer: the lane says what is missing (or, where
        # mistral.rs is not installed, what to install), before any engine starts
        with pytest.raises(openai.APIStatusError) as exc:
            client.with_options(max_retries=0).chat.completions.create(
                model="org/st-model", messages=[{"role": "user", "content": "x"}]
            )
        assert exc.value.status_code == 503
        assert isinstance(exc.value.body, dict) and exc.value.body["code"] == "engine_unavailable"
        missing = "tokenizer.json" if importlib.util.find_spec("mistralrs") else "pip install mistralrs"
        assert missing in exc.value.message
