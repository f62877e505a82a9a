"""A tiny chat model that coding agents can drive for one turn in a test.

Claude Code and Codex open a conversation with 40 to 50 KB of instructions and tool definitions. The
tiny models of tests/support/tinymodels.py read one byte per token, and at ~48k tokens a random-weight model
takes minutes on two cores (attention grows with the square of the prompt). This one has the same random
weights but a vocabulary of common words (taken from the Python standard library's own sources, so it
needs no download and is the same on every machine with this Python), which cuts such a prompt to about
a third of the tokens, and a context large enough to hold it. Its chat template lists tools (Hermes
style), so the gateway treats it as a tool-calling model.
"""

from __future__ import annotations

import collections
import re
import sysconfig
from pathlib import Path

import gguf
import numpy as np

from tests.support.tinymodels import HERMES_TOOLS

# Random weights almost never pick end-of-text among thousands of tokens, so an agent's turn would run to
# the output cap. Embeddings carry a constant _CARRIER in dimension 0 (the tiny layer barely changes it;
# after the final RMS norm it is about sqrt(n_embd)), and </s> reads that dimension with _EOS_GAIN: its
# logit sits near 2.3 while the best other tokens sit near 0.4, so after llama.cpp's default top-k and
# min-p an answer stops after a few tokens (measured: 1 to 9) instead of thousands.
_CARRIER = 5.0
_EOS_GAIN = 0.4
_WORD = re.compile(r" ?[A-Za-z]+| ?[0-9]+|[^\sA-Za-z0-9]{1,2}|\n+| +")


def _common_words(n: int) -> list[str]:
    """The `n` commonest word-like pieces of the standard library's .py files, by count then text."""
    root = Path(sysconfig.get_paths()["stdlib"])
    counts: collections.Counter[str] = collections.Counter()
    for f in sorted(root.glob("*.py")):
        try:
            counts.update(_WORD.findall(f.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [w for w, _ in ranked[:n]]


def _vocab(words: int) -> tuple[list[bytes], list[float], list[int]]:
    tokens: list[bytes] = [b"<unk>", b"<s>", b"</s>"]
    scores = [0.0, 0.0, 0.0]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>".encode())
        scores.append(-1000.0)
        types.append(gguf.TokenType.BYTE)
    seen: set[str] = set()
    for word in _common_words(words):
        piece = word.replace(" ", "\u2581")
        # SentencePiece merges pairs of pieces already in the vocabulary: every prefix must be one
        for k in range(1, len(piece) + 1):
            prefix = piece[:k]
            if prefix not in seen:
                seen.add(prefix)
                tokens.append(prefix.encode())
                scores.append(float(len(prefix)))  # longer merges first
                types.append(gguf.TokenType.NORMAL)
    return tokens, scores, [int(t) for t in types]


def write_agent_gguf(path: Path, *, n_ctx: int = 131072, words: int = 8000, seed: int = 4) -> Path:
    """A llama GGUF with random f32 weights, a word vocabulary and a `n_ctx` trained context."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab(words)
    n_embd, n_head, n_head_kv, n_ff, n_layer = 32, 2, 1, 64, 1
    head_dim = n_embd // n_head
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-agent")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_chat_template(HERMES_TOOLS)

    def t(name: str, *shape: int) -> None:
        data = rng.standard_normal(shape).astype(np.float32) * 0.02
        if name.endswith("norm.weight"):
            data = np.ones(shape, dtype=np.float32)
        elif name == "token_embd.weight":
            data[:, 0] = _CARRIER  # one large dimension that every position carries to the output
        elif name == "output.weight":
            data[2, 0] = _EOS_GAIN  # row 2 is </s>: it wins about one step in seven, so answers end
        w.add_tensor(name, data)

    kv_dim = head_dim * n_head_kv
    t("token_embd.weight", len(tokens), n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        t(p + "attn_norm.weight", n_embd)
        t(p + "attn_q.weight", n_embd, n_embd)
        t(p + "attn_k.weight", kv_dim, n_embd)
        t(p + "attn_v.weight", kv_dim, n_embd)
        t(p + "attn_output.weight", n_embd, n_embd)
        t(p + "ffn_norm.weight", n_embd)
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
    t("output_norm.weight", n_embd)
    t("output.weight", len(tokens), n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
