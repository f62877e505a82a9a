"""Which draft model speeds a model up by speculative decoding, and why (or why none does).

The engine checks a draft against its target token by token, so the two must share a tokenizer: the same
vocabulary size and the same token list. A GGUF's list is its header's `tokenizer.ggml.tokens`; a model
folder's (safetensors or MLX) is its `tokenizer.json`: `model.vocab` with `added_tokens` laid over it, in id
order, up to the config's `vocab_size` (`text_config.vocab_size` for a multimodal config) where that is
larger, each id no token names standing as `[PADn]`: the rows llama.cpp's converter writes, so a folder and
the GGUF made from it hash alike. A folder without tokenizer.json has only the config's `vocab_size`: then
only sizes are compared, and the reason says so. Each fingerprint is cached by path, size and mtime.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import gguf

from app.formats.hf_config import ConfigProblem, config_facts, read_config
from app.library.model import ModelEntry

# formats whose models are folders with a tokenizer.json (detect.py's kinds)
FOLDER_FORMATS = frozenset({"safetensors", "mlx"})
_MAX_TOKENIZER_BYTES = 512 * 1024 * 1024  # real ones reach tens of MB (262k-token vocabularies)
_MAX_IDS = 1 << 24  # far above any real vocabulary; a larger id is a broken file, not a token
_NO_HEADER = "its tokenizer cannot be read from the GGUF header"
_NO_TOKENS = "the GGUF header holds no token list it can read"


@dataclass(frozen=True)
class Tokenizer:
    """A tokenizer as far as speculative decoding cares: its size and a hash of its tokens."""

    vocab_size: int
    digest: str | None  # sha256 of the token list, each token's UTF-8 bytes followed by a NUL; None: unread
    source: str = "gguf"  # "gguf", "tokenizer.json", or "config.json" (the size alone)

    def public(self) -> dict[str, Any]:
        short = self.digest[:16] if self.digest else None
        return {"vocab_size": self.vocab_size, "tokens_sha256": short, "source": self.source}


def _digest(tokens: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for t in tokens:
        h.update(t)
        h.update(b"\0")
    return h.hexdigest()


def tokenizer_of(path: Path) -> Tokenizer | None:
    """The fingerprint of the tokenizer of `path` (a GGUF file or a model folder), or None for a model
    without one (or one that cannot be read)."""
    got = _read(path)
    return got if isinstance(got, Tokenizer) else None


def _read(path: Path) -> Tokenizer | str:
    """The fingerprint, or why there is none (said of the model's files, for a refusal)."""
    if path.is_dir():
        return _read_folder(path)
    try:
        st = path.stat()
    except OSError as exc:
        return f"{path.name} cannot be read ({exc.strerror or exc})"
    return _fingerprint(str(path), st.st_size, st.st_mtime_ns) or _NO_TOKENS


@lru_cache(maxsize=256)
def _fingerprint(path: str, size: int, mtime_ns: int) -> Tokenizer | None:
    # size and mtime are in the key so a replaced file is read again; the token list is memory-mapped
    del size, mtime_ns
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception:  # a corrupt or truncated file: its own scan reports it
        return None
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        return None
    digest = _digest(bytes(tokens.parts[i]) for i in tokens.data)
    return Tokenizer(vocab_size=len(tokens.data), digest=digest)


def _read_folder(folder: Path) -> Tokenizer | str:
    config = read_config(folder / "config.json")
    rows = None if isinstance(config, ConfigProblem) else config_facts(config).vocab_size
    path = folder / "tokenizer.json"
    try:
        st = path.stat()
    except FileNotFoundError:
        if isinstance(config, ConfigProblem):
            return f"there is no tokenizer.json, and {config.reason}"
        if rows is None or rows <= 0:
            return "there is no tokenizer.json, and config.json names no vocab_size"
        return Tokenizer(vocab_size=rows, digest=None, source="config.json")
    except OSError as exc:
        return f"tokenizer.json cannot be read: {exc.strerror or exc}"
    return _tokenizer_json(str(path), st.st_size, st.st_mtime_ns, rows or 0)


@lru_cache(maxsize=64)
def _tokenizer_json(path: str, size: int, mtime_ns: int, rows: int) -> Tokenizer | str:
    del mtime_ns  # in the key only: a replaced file is read again
    if size > _MAX_TOKENIZER_BYTES:
        return f"tokenizer.json is {size} bytes, too large to be one; download it again"
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except OSError as exc:
        return f"tokenizer.json cannot be read: {exc.strerror or exc}"
    except (ValueError, UnicodeDecodeError):
        return "tokenizer.json is not valid JSON; download it again"
    tokens = _token_list(data, rows=rows)
    if tokens is None:
        return "tokenizer.json has no token list (model.vocab) to read; download it again"
    return Tokenizer(len(tokens), _digest(t.encode() for t in tokens), source="tokenizer.json")


def _token_list(data: Any, *, rows: int) -> list[str] | None:
    """The tokens of a tokenizer.json in id order: `model.vocab` (a token -> id map for BPE, WordPiece and
    WordLevel; [token, score] pairs in id order for Unigram) with `added_tokens` ({id, content}) over it,
    padded to `rows` (the model's vocabulary rows, 0: unknown)."""
    model = data.get("model") if isinstance(data, Mapping) else None
    vocab = model.get("vocab") if isinstance(model, Mapping) else None
    by_id: dict[int, str] = {}
    if isinstance(vocab, Mapping):
        by_id = {i: t for t, i in vocab.items() if _is_id(i) and isinstance(t, str)}
    elif isinstance(vocab, list):
        by_id = {i: p[0] for i, p in enumerate(vocab) if isinstance(p, list) and p and isinstance(p[0], str)}
    else:
        return None
    added = data.get("added_tokens")
    for tok in added if isinstance(added, list) else ():
        if isinstance(tok, Mapping) and _is_id(tok.get("id")) and isinstance(tok.get("content"), str):
            by_id[tok["id"]] = tok["content"]
    if not by_id:
        return None
    return [by_id.get(i, f"[PAD{i}]") for i in range(max(max(by_id) + 1, min(rows, _MAX_IDS)))]


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_IDS


@dataclass(frozen=True)
class DraftPairing:
    """The draft chosen for `model` (None: none qualifies), why, and every candidate turned down."""

    model: str
    draft: ModelEntry | None
    reason: str
    named: bool = False  # the settings named this draft (else the library proposed it)
    rejected: dict[str, str] = field(default_factory=dict)  # candidate id -> why not

    def public(self) -> dict[str, Any]:
        return {
            "draft": self.draft.id if self.draft else None,
            "path": str(self.draft.path) if self.draft else None,
            "named": self.named,
            "reason": self.reason,
            "rejected": dict(self.rejected),
        }


def model_bytes(entry: ModelEntry) -> int:
    """The bytes of the model's files (what a draft's cost is weighed by): a GGUF's parts, a folder's tree."""
    return _size(entry)


def _size(entry: ModelEntry) -> int:
    """The bytes of the model's files: a GGUF's parts, a folder's tree."""
    if entry.format in FOLDER_FORMATS:
        if entry.files:
            return entry.size
        total = 0
        for dirpath, _dirs, names in os.walk(entry.path):
            for name in names:
                try:
                    total += (Path(dirpath) / name).stat().st_size
                except OSError:
                    continue
        return total
    try:
        return sum(p.stat().st_size for p in (entry.parts or (entry.path,)))
    except OSError:
        return 0


def _readable(entry: ModelEntry) -> bool:
    """Whether `entry` is a text-generation model whose tokenizer this module can read."""
    if entry.kind != "chat":
        return False
    if entry.format == "gguf":
        return entry.facts is not None
    return entry.format in FOLDER_FORMATS and entry.problem is None


def _not_readable(model: ModelEntry, cand: ModelEntry, formats: Collection[str] | None) -> str:
    if formats is not None and cand.format not in formats and set(formats) != {"gguf"}:
        return f"a {cand.format} model; this engine loads drafts from {' or '.join(sorted(formats))} only"
    if "gguf" in (model.format, cand.format) or (formats is not None and set(formats) == {"gguf"}):
        return "not a GGUF text-generation model"  # as it always read
    if cand.problem is not None:
        return f"it cannot be read ({cand.problem})"
    return f"not a text-generation model in a GGUF file or a safetensors folder (it is {cand.format})"


def _whose(model: ModelEntry, want: Tokenizer, have: Tokenizer) -> str:
    if want.digest is None and have.digest is None:
        return "both models' tokenizer.json absent"
    return ("the model's" if want.digest is None else "its") + " tokenizer.json absent"


def _check(
    model: ModelEntry, cand: ModelEntry, want: Tokenizer | str, formats: Collection[str] | None
) -> tuple[str | None, str | None]:
    """(why `cand` cannot draft for `model`, or None; a note on what was left uncompared, or None)."""
    if not _readable(cand) or (formats is not None and cand.format not in formats):
        return _not_readable(model, cand, formats), None
    have = _read(cand.path)
    if isinstance(want, str) or isinstance(have, str):
        if model.format == "gguf" and cand.format == "gguf":
            return _NO_HEADER, None  # as it always read
        if isinstance(want, str):
            return f"the model's tokenizer cannot be read ({want})", None
        return f"its tokenizer cannot be read ({have})", None
    if have.vocab_size != want.vocab_size:
        return f"its vocabulary has {have.vocab_size} tokens, the model's has {want.vocab_size}", None
    if have.digest is None or want.digest is None:
        note = f"{_whose(model, want, have)}; vocabulary sizes match ({want.vocab_size})"
        return None, note + ", the token lists could not be compared"
    if have.digest != want.digest:
        return "its token list differs from the model's (a different tokenizer)", None
    return None, None


def _label(model: ModelEntry, formats: Collection[str] | None) -> str:
    kinds = sorted(formats) if formats is not None else [model.format]
    names = {"gguf": "GGUF model", "safetensors": "safetensors model folder", "mlx": "MLX model folder"}
    return " or ".join(names.get(k, f"{k} model") for k in kinds)


def choose_draft(
    model: ModelEntry,
    library: Iterable[ModelEntry],
    *,
    named: str | None,
    formats: Collection[str] | None = None,
) -> DraftPairing:
    """The named draft when its tokenizer matches (else none, with the reason); with no name, the smallest
    model in the library smaller than `model` whose tokenizer matches, a token-list match before one of
    the vocabulary size alone. `formats`: the draft formats the caller's engine loads; None takes any
    format whose tokenizer is read for a named draft, and the model's own format for a proposal."""
    want = _read(model.path)
    entries = [e for e in library if e.id != model.id]
    if named is not None:
        cand = next((e for e in entries if e.id == named), None)
        if cand is None:
            why = f"the draft {named!r} is not in the library; pull or import it, or fix the name"
            return DraftPairing(model.id, None, why, named=True)
        refusal, note = _check(model, cand, want, formats)
        if refusal is not None:
            if model.format == "gguf" and cand.format == "gguf":
                why = f"the draft {named!r} is refused: {refusal}; llama.cpp checks drafts token by token"
            else:
                why = (
                    f"the draft {named!r} is refused: {refusal}; a draft must share the model's tokenizer, "
                    "since the engine checks its tokens with the model one by one"
                )
            return DraftPairing(model.id, None, why, named=True, rejected={named: refusal})
        why = f"named in the settings; {note or 'its tokenizer matches'}"
        return DraftPairing(model.id, cand, why, named=True)
    allowed = formats if formats is not None else (model.format,)
    own = _size(model)
    rejected: dict[str, str] = {}
    fits: list[tuple[bool, int, str, ModelEntry, str | None]] = []
    for cand in (e for e in entries if e.format in allowed):
        size = _size(cand)
        refusal, note = (
            ("not smaller than the model", None) if size >= own else _check(model, cand, want, formats)
        )
        if refusal is None:
            fits.append((note is not None, size, cand.id, cand, note))
        else:
            rejected[cand.id] = refusal
    if not fits:
        why = f"no smaller {_label(model, formats)} in the library shares this model's tokenizer"
        return DraftPairing(model.id, None, why, rejected=rejected)
    _, size, _, best, note = min(fits, key=lambda f: f[:3])
    if note is None:
        why = f"the smallest model in the library with the same tokenizer ({size} bytes beside {own})"
    else:
        why = (
            f"the smallest model in the library with the same vocabulary size ({size} bytes beside "
            f"{own}); {note}"
        )
    return DraftPairing(model.id, best, why, rejected=rejected)
