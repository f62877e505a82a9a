"""Draft pairing for model folders (issue 16): a safetensors folder's tokenizer is fingerprinted from its
tokenizer.json (the token list in id order, hashed as a GGUF's header list is), with config.json's
vocab_size alone where no tokenizer.json ships; folders pair with folders, and with GGUFs when named. The
folders are generated (config.json, zero safetensors, a hand-written tokenizer.json) and found by the
same detection a library scan uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.formats.detect import detect_format
from app.formats.gguf_meta import GGUFFacts, read_gguf
from app.lanes.engines.mistralrs import with_assistant
from app.library.drafts import choose_draft, tokenizer_of
from app.library.model import ModelEntry
from app.library.sources import other_entry
from tests.support.modelgen import GGUFSpec, LlamaDims, llama_tensors, write_gguf, write_hf_dir

VOCAB = 100
SPECIALS = {0: "<unk>", 1: "<s>", 2: "</s>"}  # written as added_tokens, as real tokenizers write them


def tokens(n: int = VOCAB, *, odd: int | None = None) -> list[str]:
    """`n` tokens: the specials, then w3, w4 ...; `odd`: that id spelled differently (same count)."""
    out = [SPECIALS.get(i, f"w{i}") for i in range(n)]
    if odd is not None:
        out[odd] = f"W{odd}"
    return out


def write_tokenizer_json(folder: Path, toks: list[str]) -> None:
    """A BPE tokenizer.json as the `tokenizers` library saves one: the specials in `added_tokens` (and in
    the vocab, as real files have them), every token in `model.vocab` as token -> id."""
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "special": True}
        for i, t in enumerate(toks)
        if i in SPECIALS
    ]
    doc = {
        "version": "1.0",
        "added_tokens": added,
        "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(toks)}, "merges": []},
    }
    (folder / "tokenizer.json").write_text(json.dumps(doc))


def folder_model(
    root: Path,
    name: str,
    *,
    layers: int,
    toks: list[str] | None,
    config: dict[str, Any] | None = None,
) -> ModelEntry:
    """A llama folder of `layers` layers (more layers: more bytes) with `toks` as its tokenizer.json
    (None: none ships), listed as a library scan lists it."""
    dims = LlamaDims(n_layer=layers, vocab=VOCAB)
    folder = root / name
    write_hf_dir(folder, config or dims.config(), llama_tensors(dims))
    if toks is not None:
        write_tokenizer_json(folder, toks)
    fmt = detect_format(folder)
    assert fmt.kind.value == "safetensors" and fmt.problem is None, fmt
    return other_entry(f"org/{name}", fmt, source="models_dir", location=root)


def gguf_model(root: Path, name: str, n_vocab: int) -> ModelEntry:
    path = write_gguf(root / f"{name}.gguf", GGUFSpec(n_vocab=n_vocab)).path
    facts = read_gguf(path)
    assert isinstance(facts, GGUFFacts)
    return ModelEntry(name, path, facts, None)


def test_a_folder_with_the_same_tokenizer_pairs(tmp_path: Path) -> None:
    base = folder_model(tmp_path, "base", layers=4, toks=tokens())
    draft = folder_model(tmp_path, "draft", layers=1, toks=tokens())
    got = choose_draft(base, [base, draft], named="org/draft")
    assert got.draft == draft and got.named, got
    assert got.reason == "named in the settings; its tokenizer matches"
    fp = tokenizer_of(base.path)
    assert fp is not None and fp.vocab_size == VOCAB and fp.source == "tokenizer.json"
    assert fp == tokenizer_of(draft.path)


def test_a_different_token_list_or_size_is_refused_with_the_reason(tmp_path: Path) -> None:
    base = folder_model(tmp_path, "base", layers=4, toks=tokens())
    alien = folder_model(tmp_path, "alien", layers=1, toks=tokens(odd=50))
    # a smaller vocabulary (config.json's vocab_size as well: a larger one pads the list, the next test)
    fewer = LlamaDims(n_layer=1, vocab=VOCAB - 4).config()
    short = folder_model(tmp_path, "short", layers=1, toks=tokens(VOCAB - 4), config=fewer)
    library = [base, alien, short]
    got = choose_draft(base, library, named="org/alien")
    assert got.draft is None
    assert "'org/alien' is refused: its token list differs from the model's" in got.reason, got.reason
    assert "token list differs" in got.rejected["org/alien"]
    got = choose_draft(base, library, named="org/short")
    assert got.draft is None
    assert f"its vocabulary has {VOCAB - 4} tokens, the model's has {VOCAB}" in got.reason, got.reason


def test_without_tokenizer_json_only_the_sizes_are_compared(tmp_path: Path) -> None:
    base = folder_model(tmp_path, "base", layers=4, toks=tokens())
    bare = folder_model(tmp_path, "bare", layers=1, toks=None)
    # a multimodal config keeps the text model's vocabulary under text_config
    text = LlamaDims(n_layer=1, vocab=VOCAB + 8).config()
    nested = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "text_config": text}
    wide = folder_model(tmp_path, "wide", layers=1, toks=None, config=nested)
    library = [base, bare, wide]
    got = choose_draft(base, library, named="org/bare")
    assert got.draft == bare, got
    assert "its tokenizer.json absent; vocabulary sizes match (100)" in got.reason, got.reason
    assert "token lists could not be compared" in got.reason
    fp = tokenizer_of(wide.path)
    assert fp is not None and fp.digest is None and fp.vocab_size == VOCAB + 8 and fp.source == "config.json"
    got = choose_draft(base, library, named="org/wide")
    assert got.draft is None and f"its vocabulary has {VOCAB + 8} tokens" in got.reason, got.reason
    # the other way round: the model is the one without a tokenizer.json
    got = choose_draft(bare, library, named="org/base")
    assert got.draft == base and "the model's tokenizer.json absent" in got.reason, got.reason


def test_a_folder_with_neither_tokenizer_nor_size_is_refused(tmp_path: Path) -> None:
    base = folder_model(tmp_path, "base", layers=4, toks=tokens())
    config = {k: v for k, v in LlamaDims(n_layer=1).config().items() if k != "vocab_size"}
    blind = folder_model(tmp_path, "blind", layers=1, toks=None, config=config)
    broken = folder_model(tmp_path, "broken", layers=1, toks=tokens())
    (broken.path / "tokenizer.json").write_text("{not json")
    got = choose_draft(base, [base, blind, broken], named="org/blind")
    assert got.draft is None
    assert "no tokenizer.json, and config.json names no vocab_size" in got.reason, got.reason
    got = choose_draft(base, [base, blind, broken], named="org/broken")
    assert got.draft is None and "tokenizer.json is not valid JSON; download it again" in got.reason


def test_the_library_proposes_the_smallest_matching_folder(tmp_path: Path) -> None:
    base = folder_model(tmp_path, "base", layers=6, toks=tokens())
    library = [
        base,
        folder_model(tmp_path, "medium", layers=3, toks=tokens()),
        folder_model(tmp_path, "small", layers=2, toks=tokens()),
        folder_model(tmp_path, "tiny-alien", layers=1, toks=tokens(odd=7)),  # smallest, other tokens
        folder_model(tmp_path, "tiny-bare", layers=1, toks=None),  # smaller, but only its size known
        folder_model(tmp_path, "bigger", layers=8, toks=tokens()),
        gguf_model(tmp_path, "a-gguf", n_vocab=VOCAB),  # a GGUF is proposed for GGUFs, not folders
    ]
    got = choose_draft(base, library, named=None)
    assert got.draft is not None and got.draft.id == "org/small", got
    assert not got.named and got.reason.startswith(
        "the smallest model in the library with the same tokenizer"
    )
    assert f"{got.draft.size} bytes beside {base.size}" in got.reason, got.reason
    assert "token list differs" in got.rejected["org/tiny-alien"]
    assert got.rejected["org/bigger"] == "not smaller than the model"
    assert set(got.rejected) == {"org/tiny-alien", "org/bigger"}
    # with no token list to match, the size match alone is proposed, and says so
    got = choose_draft(base, [base, *library[4:]], named=None)
    assert got.draft is not None and got.draft.id == "org/tiny-bare", got
    assert "same vocabulary size" in got.reason and "tokenizer.json absent" in got.reason, got.reason
    got = choose_draft(base, [base, library[3], library[5]], named=None)
    assert got.draft is None
    assert got.reason == "no smaller safetensors model folder in the library shares this model's tokenizer"


def test_a_gguf_and_a_folder_compare_when_named(tmp_path: Path) -> None:
    # write_gguf names its tokens t0, t1 ...; a folder with that token list is the same tokenizer
    gguf_base = gguf_model(tmp_path, "g", n_vocab=40)
    forty = LlamaDims(n_layer=1, vocab=40).config()
    same = folder_model(tmp_path, "same", layers=1, toks=[f"t{i}" for i in range(40)], config=forty)
    other = folder_model(tmp_path, "other", layers=1, toks=[*(f"t{i}" for i in range(39)), "x"], config=forty)
    library = [gguf_base, same, other]
    from_header, from_json = tokenizer_of(gguf_base.path), tokenizer_of(same.path)
    assert from_header is not None and from_json is not None
    assert from_header.vocab_size == from_json.vocab_size == 40
    assert from_header.digest == from_json.digest and from_json.source == "tokenizer.json"
    got = choose_draft(gguf_base, library, named="org/same")
    assert got.draft == same and got.reason == "named in the settings; its tokenizer matches", got
    got = choose_draft(same, library, named="g")
    assert got.draft == gguf_base, got
    got = choose_draft(gguf_base, library, named="org/other")
    assert got.draft is None and "token list differs" in got.reason, got.reason
    # an engine that loads GGUF drafts only (llama.cpp) says so, as it always did
    got = choose_draft(gguf_base, library, named="org/same", formats=("gguf",))
    assert got.draft is None and got.rejected == {"org/same": "not a GGUF text-generation model"}
    # a proposal for a GGUF stays among GGUFs
    assert choose_draft(gguf_base, library, named=None).reason.startswith("no smaller GGUF model")


def test_config_rows_beyond_the_tokenizer_count_as_llamacpp_pads_them(tmp_path: Path) -> None:
    """A config whose vocab_size exceeds the tokenizer's ids (embedding rows padded, as Qwen's are): the
    converter to GGUF names each extra row [PADn]; the fingerprint counts and names them the same way."""
    padded = folder_model(tmp_path, "padded", layers=1, toks=tokens(), config=LlamaDims(vocab=104).config())
    spelled = folder_model(
        tmp_path, "spelled", layers=1, toks=[*tokens(), *(f"[PAD{i}]" for i in range(100, 104))]
    )
    fp = tokenizer_of(padded.path)
    assert fp is not None and fp.vocab_size == 104
    assert fp == tokenizer_of(spelled.path)


def test_the_tokenizers_library_reads_the_same_token_list(tmp_path: Path) -> None:
    """The fingerprint follows what `tokenizers` itself makes of the file, for a vocabulary map (WordLevel)
    and for Unigram's [token, score] list, added tokens included."""
    tk = pytest.importorskip("tokenizers")
    import hashlib

    def expected(path: Path) -> tuple[int, str]:
        vocab = tk.Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
        listed = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        assert [i for _, i in sorted(vocab.items(), key=lambda kv: kv[1])] == list(range(len(listed)))
        return len(listed), hashlib.sha256(b"".join(t.encode() + b"\0" for t in listed)).hexdigest()

    words = tk.Tokenizer(tk.models.WordLevel({"<unk>": 0, "héllo": 1, "wörld": 2}, unk_token="<unk>"))
    words.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    pieces = tk.Tokenizer(tk.models.Unigram([("<unk>", 0.0), ("▁a", -1.0), ("▁b", -2.0)], 0))
    pieces.add_tokens(["<extra>"])
    for name, tok in (("words", words), ("pieces", pieces)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
        tok.save(str(folder / "tokenizer.json"))
        fp = tokenizer_of(folder)
        assert fp is not None and (fp.vocab_size, fp.digest) == expected(folder / "tokenizer.json"), name


def test_mistralrs_pairs_a_folder_assistant_for_a_folder_model(tmp_path: Path) -> None:
    base = folder_model(tmp_path, "gemma", layers=4, toks=tokens())
    assistant = folder_model(tmp_path, "gemma-assistant", layers=1, toks=tokens())
    alien = folder_model(tmp_path, "alien", layers=1, toks=tokens(odd=9))
    library = [base, assistant, alien]

    def settings(draft: str) -> Settings:
        spec = {"type": "draft", "draft": draft, "n_max": 3}
        return Settings.flat(model_overrides={base.id: {"speculative": spec}})

    paired = with_assistant(base, settings(assistant.id), library)
    assert paired.draft == assistant.path and paired.path == base.path
    with pytest.raises(EngineUnavailableError, match="'org/alien' is refused: its token list differs"):
        with_assistant(base, settings(alien.id), library)
