"""GGUF header reading and the models-folder catalog, on real generated files."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import pytest

from app.core.errors import ModelBrokenError, ModelNotFoundError
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, read_gguf, split_part
from app.library.catalog import Catalog
from tests.support.tinymodels import CHAT, EMBED, write_tiny_gguf


def test_chat_model_facts(model_store: Path) -> None:
    facts = read_gguf(model_store / "tiny.gguf")
    assert isinstance(facts, GGUFFacts)
    assert facts.architecture == "llama"
    assert facts.context_length == CHAT.n_ctx_train
    assert facts.block_count == CHAT.n_layer
    assert facts.embedding_length == CHAT.n_embd
    assert facts.head_count == CHAT.n_head
    assert facts.head_count_kv == CHAT.n_head_kv
    assert facts.pooling_type is None and not facts.is_embedding
    assert facts.chat_template is not None and "im_start" in facts.chat_template
    assert facts.file_type == "all_f32"
    assert 0 < facts.tensor_bytes < facts.file_bytes


def test_embedding_model_facts(model_store: Path) -> None:
    facts = read_gguf(model_store / "embed.gguf")
    assert isinstance(facts, GGUFFacts)
    assert facts.pooling_type == "mean" and facts.is_embedding
    assert facts.embedding_length == EMBED.n_embd


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (b"", "empty"),
        (b"PK\x03\x04 this is a zip", "not a GGUF"),
        (b"GGUF\x03\x00\x00\x00garbage", "corrupt or the file is truncated"),
    ],
)
def test_broken_files_give_reasons(tmp_path: Path, content: bytes, expect: str) -> None:
    p = tmp_path / "x.gguf"
    p.write_bytes(content)
    problem = read_gguf(p)
    assert isinstance(problem, GGUFProblem)
    assert expect in problem.reason


def test_truncated_tensor_data_is_broken(tmp_path: Path, model_store: Path) -> None:
    data = (model_store / "tiny.gguf").read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: len(data) - 5000])
    problem = read_gguf(p)
    assert isinstance(problem, GGUFProblem)
    assert "truncated" in problem.reason and "download it again" in problem.reason


def test_missing_file(tmp_path: Path) -> None:
    problem = read_gguf(tmp_path / "nope.gguf")
    assert isinstance(problem, GGUFProblem) and "cannot read" in problem.reason


def test_split_names() -> None:
    assert split_part(Path("m-00001-of-00003.gguf")) == ("m", 1, 3)
    assert split_part(Path("model.gguf")) is None


def test_catalog_ids_nested_and_broken(tmp_path: Path, model_store: Path) -> None:
    root = tmp_path / "models"
    (root / "org" / "repo").mkdir(parents=True)
    shutil.copy(model_store / "tiny.gguf", root / "tiny.gguf")
    shutil.copy(model_store / "embed.gguf", root / "org" / "repo" / "file.gguf")
    (root / "junk.gguf").write_text("not a model")
    (root / "notes.txt").write_text("ignored")
    (root / "vision-mmproj-f16.gguf").write_bytes((model_store / "tiny.gguf").read_bytes())
    cat = Catalog([root])
    entries = {e.id: e for e in cat.scan()}
    assert set(entries) == {"tiny", "org/repo/file", "junk"}
    assert entries["tiny"].kind == "chat" and entries["tiny"].ok
    assert entries["org/repo/file"].kind == "embedding"
    assert not entries["junk"].ok and "not a GGUF" in (entries["junk"].problem or "")
    assert cat.get("tiny").path == root / "tiny.gguf"
    with pytest.raises(ModelBrokenError, match="junk"):
        cat.get("junk")
    with pytest.raises(ModelNotFoundError) as exc:
        cat.get("missing")
    assert "tiny" in exc.value.message and "org/repo/file" in exc.value.message


def test_catalog_sees_new_file_and_removed_file(tmp_path: Path, model_store: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    cat = Catalog([root])
    assert cat.scan() == []
    with pytest.raises(ModelNotFoundError, match=r"none \(put \.gguf files"):
        cat.get("tiny")
    shutil.copy(model_store / "tiny.gguf", root / "tiny.gguf")
    assert cat.get("tiny").ok  # a miss rescans
    (root / "tiny.gguf").unlink()
    with pytest.raises(ModelNotFoundError):
        cat.get("tiny")


def test_multipart_is_one_model(tmp_path: Path, model_store: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    shutil.copy(model_store / "tiny.gguf", root / "big-00001-of-00002.gguf")
    cat = Catalog([root])
    [entry] = cat.scan()
    assert entry.id == "big" and not entry.ok and "missing big-00002-of-00002.gguf" in (entry.problem or "")
    shutil.copy(model_store / "tiny.gguf", root / "big-00002-of-00002.gguf")
    [entry] = cat.scan()
    assert entry.ok and len(entry.parts) == 2


def test_duplicate_ids_across_dirs(tmp_path: Path, model_store: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        shutil.copy(model_store / "tiny.gguf", d / "tiny.gguf")
    cat = Catalog([a, b])
    entries = cat.scan()
    ok = [e for e in entries if e.ok]
    dup = [e for e in entries if not e.ok]
    assert [e.path for e in ok] == [a / "tiny.gguf"]
    assert dup and "duplicate" in (dup[0].problem or "")


def test_header_read_does_not_load_tensors(tmp_path: Path) -> None:
    # a model whose tensor table is valid: reading facts maps the file, it does not copy it
    p = write_tiny_gguf(tmp_path / "m.gguf")
    reader = gguf.GGUFReader(str(p))
    assert reader.tensors, "generated model should have tensors"
    facts = read_gguf(p)
    assert isinstance(facts, GGUFFacts)
    assert facts.tensor_bytes == sum(int(t.n_bytes) for t in reader.tensors)
