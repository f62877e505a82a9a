"""Hugging Face llama folders that engines load: config.json, zero-weight safetensors
(tests/support/modelgen.py)
and a word-level tokenizer built with `tokenizers`, with a chat template. Zero weights give the same
token every step: tests check the shape of answers and the lane's plumbing, not text.

`write_mlx_llama` is marked as mlx_lm writes it (an MLX folder); `write_hf_llama` is a plain safetensors
folder as mistral.rs wants one: `hidden_act` and `rope_theta` in config.json, and a byte-level decoder
in tokenizer.json (its grammar engine builds a token trie from the decoder and refuses others)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.modelgen import LlamaDims, llama_tensors, write_hf_dir

DIMS = LlamaDims(n_layer=2, hidden=64, heads=4, kv_heads=2, ff=128, vocab=128)


def write_mlx_llama(folder: Path, dims: LlamaDims = DIMS) -> Path:
    config = dims.config(bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-5, tie_word_embeddings=False)
    write_hf_dir(folder, config, llama_tensors(dims), metadata={"format": "mlx"})  # what mlx_lm writes
    _tokenizer(folder, dims, byte_level=False)
    return folder


def write_hf_llama(folder: Path, dims: LlamaDims = DIMS) -> Path:
    config = dims.config(
        bos_token_id=1,
        eos_token_id=2,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        hidden_act="silu",
        rope_theta=10000.0,
    )
    write_hf_dir(folder, config, llama_tensors(dims), metadata={"format": "pt"})
    _tokenizer(folder, dims, byte_level=True)
    return folder


def _tokenizer(folder: Path, dims: LlamaDims, *, byte_level: bool) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, dims.vocab)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if byte_level:
        tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
            }
        )
    )
