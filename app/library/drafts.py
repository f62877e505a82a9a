"""Which draft model speeds a GGUF model up by speculative decoding, and why (or why none does).

llama.cpp checks a draft against its target token by token, so the two must share a tokenizer: the
same vocabulary size and the same token list. Both are read from the GGUF headers (`tokenizer.ggml.tokens`)
and kept as a fingerprint per file, cached by path, size and modification time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import gguf

from app.library.model import ModelEntry


@dataclass(frozen=True)
class Tokenizer:
    """A GGUF's tokenizer as far as speculative decoding cares: its size and a hash of its tokens."""

    vocab_size: int
    digest: str  # sha256 of the token list, each token's bytes followed by a NUL

    def public(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "tokens_sha256": self.digest[:16]}


def tokenizer_of(path: Path) -> Tokenizer | None:
    """The fingerprint of `path`'s tokenizer, or None for a file without one (or that cannot be read)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return _fingerprint(str(path), st.st_size, st.st_mtime_ns)


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
    h = hashlib.sha256()
    for i in tokens.data:
        h.update(bytes(tokens.parts[i]))
        h.update(b"\0")
    return Tokenizer(vocab_size=len(tokens.data), digest=h.hexdigest())


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


def _size(entry: ModelEntry) -> int:
    try:
        return sum(p.stat().st_size for p in (entry.parts or (entry.path,)))
    except OSError:
        return 0


def _refusal(model: ModelEntry, cand: ModelEntry, want: Tokenizer | None) -> str | None:
    """Why `cand` cannot draft for `model`, or None when it can."""
    if cand.format != "gguf" or cand.facts is None or cand.kind != "chat":
        return "not a GGUF text-generation model"
    have = tokenizer_of(cand.path)
    if want is None or have is None:
        return "its tokenizer cannot be read from the GGUF header"
    if have.vocab_size != want.vocab_size:
        return f"its vocabulary has {have.vocab_size} tokens, the model's has {want.vocab_size}"
    if have.digest != want.digest:
        return "its token list differs from the model's (a different tokenizer)"
    return None


def choose_draft(model: ModelEntry, library: Iterable[ModelEntry], *, named: str | None) -> DraftPairing:
    """The named draft when its tokenizer matches (else none, with the reason); with no name, the
    smallest model in the library smaller than `model` whose tokenizer matches."""
    want = tokenizer_of(model.path)
    entries = [e for e in library if e.id != model.id]
    if named is not None:
        cand = next((e for e in entries if e.id == named), None)
        if cand is None:
            why = f"the draft {named!r} is not in the library; pull or import it, or fix the name"
            return DraftPairing(model.id, None, why, named=True)
        refusal = _refusal(model, cand, want)
        if refusal is not None:
            why = f"the draft {named!r} is refused: {refusal}; llama.cpp checks drafts token by token"
            return DraftPairing(model.id, None, why, named=True, rejected={named: refusal})
        return DraftPairing(model.id, cand, "named in the settings; its tokenizer matches", named=True)
    own = _size(model)
    rejected: dict[str, str] = {}
    fits: list[tuple[int, ModelEntry]] = []
    for cand in entries:
        size = _size(cand)
        refusal = "not smaller than the model" if size >= own else _refusal(model, cand, want)
        if refusal is None:
            fits.append((size, cand))
        elif cand.format == "gguf":
            rejected[cand.id] = refusal
    if not fits:
        why = "no smaller GGUF model in the library shares this model's tokenizer"
        return DraftPairing(model.id, None, why, rejected=rejected)
    size, best = min(fits, key=lambda f: (f[0], f[1].id))
    why = f"the smallest model in the library with the same tokenizer ({size} bytes beside {own})"
    return DraftPairing(model.id, best, why, rejected=rejected)
