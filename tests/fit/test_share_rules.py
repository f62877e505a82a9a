"""A GPU-share plan follows the ShareRule it is handed (app/fit/gpu_share.py names no engine), and the kinds
whose memory is a share of the card declare theirs (app/lanes/engines/cuda.py)."""

from __future__ import annotations

import dataclasses

import pytest

from app.fit.gpu_share import KV_BYTES, ShareRule, kv_request_bytes, plan_gpu_share
from app.formats.safetensors_meta import SafetensorsModel, model_from_metadata
from app.lanes.engines.cuda import SGLANG_SHARE, SHARE_ENGINES, VLLM_SHARE, CudaKind
from app.lanes.engines.registry import KINDS
from tests.support.machines import nvidia
from tests.support.modelgen import LlamaDims, llama_tensors, safetensors_header

# 4 layers of 8 KV heads x 128: 4 KiB of K and V per token and layer in half precision, 2 KiB in fp8
DIMS = LlamaDims(n_layer=4, hidden=1024, heads=8, kv_heads=8, ff=2048, vocab=1000)
KIB = 1024

# an engine neither registered kind is: a share of the total, KV in 32-token blocks, its own flags
OTHER = ShareRule(
    name="other-engine",
    basis="total",
    activations_inside=True,
    kv_block_tokens=32,
    batch_covers_seqs=False,
    fraction_flag="--share",
    length_flag="--ctx",
    tp_flag="--tp",
    batch_flag="--batch",
    seqs_flag="--seqs",
    pool_flag=None,
    kv_dtype_flag="--kv",
    kv_dtypes=(("fp8", "f8"), ("fp8_e4m3", "f8a"), ("fp8_e5m2", "f8b")),
)


@pytest.fixture(scope="module")
def model() -> SafetensorsModel:
    config = DIMS.config(max_position_embeddings=4096, torch_dtype="bfloat16")
    built = model_from_metadata(
        config, [safetensors_header(llama_tensors(DIMS))], files=("model.safetensors",)
    )
    assert isinstance(built, SafetensorsModel), built
    return built


def test_the_plan_speaks_the_rule_it_is_handed(model: SafetensorsModel) -> None:
    share = plan_gpu_share(model, nvidia(24564), engine=OTHER, max_model_len=1000, kv_cache_dtype="fp8")
    assert share.engine == "other-engine" and share.max_total_tokens is None
    flags = share.argv[0::2]
    assert flags == ("--share", "--ctx", "--tp", "--batch", "--seqs", "--kv")
    assert dict(zip(flags, share.argv[1::2], strict=True))["--kv"] == "f8"
    # 1000 tokens fill 32 blocks of 32 (1024 tokens) in each of the 4 layers, at 2 KiB a token in fp8
    assert share.kv_per_request == 4 * 1024 * 2 * KIB


def test_the_kv_layout_is_the_rules(model: SafetensorsModel) -> None:
    per_token = 4 * 4 * KIB  # every layer, half precision
    assert kv_request_bytes(model, engine=OTHER, max_model_len=1000) == 1024 * per_token
    assert kv_request_bytes(model, engine=VLLM_SHARE, max_model_len=1000) == 1008 * per_token  # 16s
    assert kv_request_bytes(model, engine=SGLANG_SHARE, max_model_len=1000) == 1000 * per_token  # tokens
    tokens = dataclasses.replace(OTHER, kv_block_tokens=None)
    assert kv_request_bytes(model, engine=tokens, max_model_len=1000) == 1000 * per_token


def test_a_rule_that_cannot_be_planned_is_refused_where_it_is_declared() -> None:
    with pytest.raises(ValueError, match="needs a pool cap"):
        dataclasses.replace(OTHER, basis="free")
    with pytest.raises(ValueError, match="kv_dtypes must spell exactly"):
        dataclasses.replace(OTHER, kv_dtypes=(("fp8", "f8"),))
    assert set(KV_BYTES) - {"auto"} == {k for k, _ in SGLANG_SHARE.kv_dtypes}


def test_every_share_kind_declares_its_rule() -> None:
    """A kind whose memory is a fraction of the card carries the rule its lanes are planned with, named
    after its lane; explain shows exactly those rules."""
    fraction = [k for k in KINDS if k.memory == "fraction"]
    assert fraction and all(isinstance(k, CudaKind) for k in fraction)
    assert [k.share.name for k in fraction if isinstance(k, CudaKind)] == [k.lane for k in fraction]
    assert SHARE_ENGINES == tuple(k.share for k in fraction if isinstance(k, CudaKind))
