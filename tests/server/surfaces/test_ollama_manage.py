"""Ollama's model management (/api/pull, /api/delete, /api/copy, /api/create): the official ollama client
against a real `switchyard serve` and the fake hub, plus the parsing helpers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from app.core.errors import BadRequestError, RemoveRefusedError
from app.hub import cache_layout
from app.library.catalog import Catalog
from app.library.db import Database
from app.library.remove import remove_model
from app.library.store import Library
from app.server.surfaces.ollama.manage import alias_name, modelfile_source, parse_pull_name
from tests.support.fakehub import FakeHub, gguf_repo_files

REPO = "org/tiny-GGUF"
PIN = {"grammar": 'root ::= "the answer is 42"'}
HI = [{"role": "user", "content": "hi"}]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def repo_dir() -> Path:
    return cache_layout.repo_folder(Path(os.environ["HF_HUB_CACHE"]), REPO)


def names(client: ollama.Client) -> set[str]:
    return {m.model for m in client.list().models if m.model}


def answer(client: ollama.Client, model: str) -> str:
    return client.chat(model=model, messages=HI, options=PIN).message.content or ""


def refused(call: Any, status: int) -> str:
    with pytest.raises(ollama.ResponseError) as info:
        call()
    assert info.value.status_code == status, info.value.error
    return str(info.value.error)


@pytest.fixture
def files(fake_hub: FakeHub, model_store: Path) -> dict[str, bytes]:
    files = gguf_repo_files("tiny", {"Q8_0": model_store / "tiny.gguf", "Q4_K_M": model_store / "tiny2.gguf"})
    fake_hub.add_repo(REPO, files)
    return files


@pytest.fixture
def url(start_server: Any, tmp_path: Path, files: dict[str, bytes]) -> str:
    (tmp_path / "models").mkdir()
    return str(start_server(tmp_path / "models").url)


@pytest.fixture
def client(url: str) -> ollama.Client:
    return ollama.Client(host=url, timeout=60)


def test_pull_streams_progress_lands_verified_and_answers(
    client: ollama.Client, files: dict[str, bytes], fake_hub: FakeHub
) -> None:
    data = files["tiny-Q8_0.gguf"]
    lines = list(client.pull(f"hf.co/{REPO}:Q8_0", stream=True))
    statuses = [p.status for p in lines]
    short = f"pulling {sha(data)[:12]}"
    assert statuses[0] == "pulling manifest" and short in statuses
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    layers = [p for p in lines if p.status == short]
    assert {p.digest for p in layers} == {f"sha256:{sha(data)}"} and {p.total for p in layers} == {len(data)}
    assert layers[-1].completed == len(data)
    # in the HF cache layout: blobs/<sha256> holding exactly the published bytes, linked from the snapshot
    commit = fake_hub.repos[REPO].head.sha
    blob = repo_dir() / "blobs" / sha(data)
    assert sha(blob.read_bytes()) == sha(data)
    assert (repo_dir() / "snapshots" / commit / "tiny-Q8_0.gguf").resolve() == blob.resolve()
    assert not (repo_dir() / "blobs" / sha(files["tiny-Q4_K_M.gguf"])).exists()  # only the quant asked for
    # the pulled name is listed and answers, as after an Ollama pull
    assert f"hf.co/{REPO}:Q8_0" in names(client)
    assert answer(client, f"hf.co/{REPO}:Q8_0") == "the answer is 42"


def test_copy_is_listed_answers_everywhere_and_delete_is_refused_while_loaded(
    client: ollama.Client, url: str, files: dict[str, bytes]
) -> None:
    assert client.pull(f"hf.co/{REPO}:Q8_0").status == "success"  # stream false: one line at the end
    pulled = f"hf.co/{REPO}:Q8_0"
    assert client.copy(pulled, "mine").status == "success"
    assert {"mine:latest", pulled} <= names(client)
    assert answer(client, "mine:latest") == "the answer is 42"
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "mine", "messages": HI, "max_tokens": 4},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    assert "exists already" in refused(lambda: client.copy(pulled, "mine"), 400)
    assert "not found" in refused(lambda: client.copy("nope", "other"), 404)
    # the model's lane is loaded: deleting the model is refused, deleting the copy's name is not
    assert "unload it first" in refused(lambda: client.delete(pulled), 409)
    assert client.delete("mine").status == "success"
    assert "mine:latest" not in names(client) and pulled in names(client)
    client.generate(model=pulled, prompt="", keep_alive=0)  # Ollama's unload
    assert client.delete(pulled).status == "success"
    assert pulled not in names(client)
    assert not (repo_dir() / "blobs" / sha(files["tiny-Q8_0.gguf"])).exists()
    assert "not found" in refused(lambda: client.delete(pulled), 404)


def test_pull_refusals_come_before_the_stream(client: ollama.Client) -> None:
    assert "name one" in refused(lambda: client.pull(f"hf.co/{REPO}"), 400)  # two quantizations
    msg = refused(lambda: list(client.pull(f"hf.co/{REPO}:Q2_K", stream=True)), 404)
    assert "Q4_K_M" in msg and "Q8_0" in msg
    assert "hf.co/ORG/REPO" in refused(lambda: client.pull("llama3.2"), 400)
    assert refused(lambda: client.pull("hf.co/org/missing-GGUF"), 404)
    assert client.pull(f"huggingface.co/{REPO}:q4_k_m").status == "success"
    assert "huggingface.co/org/tiny-GGUF:q4_k_m" in names(client)


def test_a_client_that_leaves_mid_pull_does_not_stop_the_download(
    client: ollama.Client, url: str, fake_hub: FakeHub, files: dict[str, bytes]
) -> None:
    fake_hub.faults.delay_per_chunk = 0.05  # ~0.6 MB in 64 KiB chunks: about half a second
    with httpx.stream("POST", f"{url}/api/pull", json={"model": f"hf.co/{REPO}:Q8_0"}, timeout=60) as r:
        first = json.loads(next(r.iter_lines()))
    assert first == {"status": "pulling manifest"}
    # a second client waits on the same job and sees it through
    assert client.pull(f"hf.co/{REPO}:Q8_0").status == "success"
    jobs = httpx.get(f"{url}/api/downloads", timeout=10).json()["downloads"]
    assert [j for j in jobs if j["state"] in ("queued", "running")] == []
    assert sha((repo_dir() / "blobs" / sha(files["tiny-Q8_0.gguf"])).read_bytes()) == sha(
        files["tiny-Q8_0.gguf"]
    )
    assert not list((repo_dir() / "blobs").glob("*.incomplete*"))
    assert fake_hub.served[f"{REPO}/tiny-Q8_0.gguf"] == len(files["tiny-Q8_0.gguf"])  # fetched once


def test_create_from_a_model_a_file_or_a_modelfile(
    client: ollama.Client, url: str, model_store: Path
) -> None:
    src = model_store / "tiny.gguf"
    assert client.create(model="fromfile", from_=str(src)).status == "success"
    assert answer(client, "fromfile") == "the answer is 42"
    assert [p.status for p in client.create(model="dup:v2", from_="fromfile", stream=True)][-1] == "success"
    assert {"fromfile:latest", "dup:v2"} <= names(client)
    assert "exists already" in refused(lambda: client.create(model="dup:v2", from_="fromfile"), 400)
    msg = refused(lambda: client.create(model="x", from_="fromfile", system="be brief"), 400)
    assert msg.startswith("system cannot be kept")
    msg = refused(lambda: client.create(model="x", files={"m.gguf": "sha256:" + "0" * 64}), 400)
    assert "/api/pull" in msg and "switchyard import" in msg
    assert "relative path" in refused(lambda: client.create(model="x", from_="./tiny.gguf"), 400)
    old = httpx.post(f"{url}/api/create", json={"name": "legacy", "modelfile": "# hi\nFROM fromfile\n"})
    assert old.status_code == 200 and old.text.splitlines()[-1] == '{"status": "success"}'
    bad = 'FROM fromfile\nSYSTEM """two\nlines"""\nPARAMETER temperature 0\n'
    r = httpx.post(f"{url}/api/create", json={"model": "x", "modelfile": bad, "stream": False})
    assert r.status_code == 400 and "PARAMETER, SYSTEM" in r.json()["error"]
    # deleting a created alias leaves its model; deleting the imported model takes its aliases along
    assert client.delete("legacy").status == "success" and "fromfile:latest" in names(client)
    client.generate(model="fromfile", prompt="", keep_alive=0)
    assert client.delete("fromfile").status == "success"
    assert {"fromfile:latest", "dup:v2"}.isdisjoint(names(client))


# ---- the parsing helpers -------------------------------------------------------------------------
def test_pull_names() -> None:
    ref = parse_pull_name("https://HF.co/org/Repo-GGUF:latest")
    assert (ref.repo, ref.quant, ref.name) == ("org/Repo-GGUF", None, "hf.co/org/Repo-GGUF")
    assert parse_pull_name("huggingface.co/a/b:IQ4_XS").quant == "IQ4_XS"
    for bad in ("llama3.2", "hf.co/only-one", "hf.co/a/b/c", "registry.ollama.ai/library/x"):
        with pytest.raises(BadRequestError, match="only Hugging Face GGUF"):
            parse_pull_name(bad)


def test_alias_names_and_modelfiles() -> None:
    assert alias_name("me/mine:latest", param="destination") == "me/mine"
    assert alias_name("mine:v2", param="destination") == "mine:v2"
    for bad in ("", "../x", "a b", "x:", "/abs"):
        with pytest.raises(BadRequestError):
            alias_name(bad, param="destination")
    assert modelfile_source('# c\nFROM "/m/tiny.gguf"\n') == "/m/tiny.gguf"
    with pytest.raises(BadRequestError, match="exactly one FROM"):
        modelfile_source("SYSTEM hi\n")
    with pytest.raises(BadRequestError, match="TEMPLATE"):
        modelfile_source('FROM x\nTEMPLATE """{{ .Prompt }}\nFROM y"""\n')  # FROM inside a block is text


# ---- aliases in the library and the catalog (a real library.db) ----------------------------------
def test_aliases_resolve_persist_and_go_with_their_model(tmp_path: Path, model_store: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(model_store / "tiny.gguf", models / "tiny.gguf")
    db = tmp_path / "library.db"
    lib = Library(Database(db))
    cat = Catalog([models], library=lib)
    cat.scan()
    lib.add_alias("mine:V2", target="tiny", by="copy")
    lib.add_alias("ghost", target="gone", by="copy")  # its model is not here: not listed, not resolved
    listed = {e.id: e for e in cat.scan()}
    assert listed["mine:V2"].source == "alias" and listed["mine:V2"].path == listed["tiny"].path
    assert "ghost" not in listed and cat.find("ghost") is None
    assert cat.get("MINE:v2").id == "tiny"  # a tag compares without case, as `org/repo:QUANT` does
    lib.close()
    lib = Library(Database(db))  # persisted across processes
    cat = Catalog([models], library=lib)
    cat.scan()
    assert cat.get("mine:V2").id == "tiny"
    # removing the alias leaves the model; removing the model takes its aliases along
    gone = remove_model("mine:V2", catalog=cat, library=lib, imported_root=tmp_path / "imported")
    assert (gone.source, gone.kept) == ("alias", ["tiny"]) and (models / "tiny.gguf").exists()
    assert cat.find("mine:V2") is None
    lib.add_alias("again", target="tiny", by="copy")
    lib.forget("tiny")
    assert "again" not in lib.aliases() and "ghost" in lib.aliases()
    # a model's own id wins over an alias of the same name, and `rm` removes the model, not the alias
    lib.add_alias("tiny", target="tiny", by="copy")
    cat.scan()
    with pytest.raises(RemoveRefusedError):  # the user's own file: refused, not "alias forgotten"
        remove_model("tiny", catalog=cat, library=lib, imported_root=tmp_path / "imported")
    lib.close()
