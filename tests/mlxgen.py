"""A Hugging Face llama folder that mlx_lm loads: config.json, zero-weight safetensors (tests/modelgen.py)
and a word-level tokenizer built with `tokenizers`, with a chat template. Zero weights give the same
token every step: tests check the shape of answers and the lane's plumbing, not text."""

from __future__ import annotations

import json
from pathlib import Path

from tests.modelgen import LlamaDims, llama_tensors, write_hf_dir

DIMS = LlamaDims(n_layer=2, hidden=64, heads=4, kv_heads=2, ff=128, vocab=128)


def write_mlx_llama(folder: Path, dims: LlamaDims = DIMS) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = dims.config(bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-5, tie_word_embeddings=False)
    write_hf_dir(folder, config, llama_tensors(dims), metadata={"format": "mlx"})  # what mlx_lm writes
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, dims.vocab)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
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
    return folder
