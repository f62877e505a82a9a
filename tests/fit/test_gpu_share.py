"""vLLM and SGLang shares of a card, for real model shapes read from config.json + safetensors headers.

The full-size models (Llama-3-8B bf16, Qwen2.5-7B-AWQ, Mistral-7B) are written as real folders whose
safetensors file has the real header and a sparse hole where the tensor data would be, then read back
with `read_safetensors_dir`. Expected numbers are worked out here by hand from the shapes and the
documented constants, not read back from the module.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from app.core.errors import ModelTooLargeError, SettingsError
from app.fit.gpu_share import (
    ACT_WIDTHS,
    CUDA_CONTEXT,
    CUDA_GRAPHS,
    LOGIT_COPIES,
    NCCL_BUFFERS,
    WORKSPACE,
    GPUShareRefused,
    ShareRequest,
    activation_bytes,
    kv_bytes_per_token,
    kv_request_bytes,
    plan_gpu_share,
    split_card,
    tensor_parallel_problem,
    valid_tensor_parallel,
)
from app.fit.memory import MIB
from app.formats.safetensors_meta import SafetensorsModel, model_from_metadata, read_safetensors_dir
from app.hardware.model import GPUInfo
from app.lanes.engines.cuda import SGLANG_SHARE, VLLM_SHARE
from tests.support.machines import nvidia
from tests.support.modelgen import (
    DTYPE_BYTES,
    LlamaDims,
    TensorSpec,
    llama_tensors,
    safetensors_header,
    write_hf_dir,
)

GIB = 1 << 30
LLAMA3 = LlamaDims(n_layer=32, hidden=4096, heads=32, kv_heads=8, ff=14336, vocab=128256)
QWEN25 = LlamaDims(n_layer=28, hidden=3584, heads=28, kv_heads=4, ff=18944, vocab=152064)
MISTRAL = LlamaDims(n_layer=32, hidden=4096, heads=32, kv_heads=8, ff=14336, vocab=32000)
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}


def sparse_hf_dir(
    folder: Path, config: Mapping[str, Any], tensors: Mapping[str, TensorSpec]
) -> SafetensorsModel:
    """config.json + model.safetensors with the real header and a hole for the data (read, never filled)."""
    if sys.platform == "win32":  # NTFS files are not sparse by default: use the same header from memory
        built = model_from_metadata(config, [safetensors_header(tensors)], files=("model.safetensors",))
        assert isinstance(built, SafetensorsModel), built
        return built
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    header = safetensors_header(tensors)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    end = max(v["data_offsets"][1] for v in header.values())
    with (folder / "model.safetensors").open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        fh.truncate(8 + len(raw) + end)
    model = read_safetensors_dir(folder)
    assert isinstance(model, SafetensorsModel), model
    return model


def tensor_bytes(tensors: Mapping[str, TensorSpec]) -> int:
    return sum(math.prod(shape) * DTYPE_BYTES[dtype] for dtype, shape in tensors.values())


RTX4090 = nvidia(24564, "NVIDIA GeForce RTX 4090")  # what NVML reports for a 24 GiB card
RTX4060TI = nvidia(16376, "NVIDIA GeForce RTX 4060 Ti")  # a 16 GiB card
A100 = nvidia(81920, "NVIDIA A100-SXM4-80GB", cc="8.0")
H100 = nvidia(81559, "NVIDIA H100 80GB HBM3", cc="9.0")


def usable(gpu: GPUInfo) -> int:
    total = gpu.memory_total or 0
    return total - math.ceil(total * 2 / 100)  # 0.02 of the card is never promised


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SafetensorsModel]:
    root = tmp_path_factory.mktemp("share-models")
    qwen_cfg = QWEN25.config(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        max_position_embeddings=32768,
        torch_dtype="float16",
        sliding_window=131072,
        use_sliding_window=False,
        quantization_config=AWQ,
    )
    mistral_cfg = MISTRAL.config(
        architectures=["MistralForCausalLM"],
        model_type="mistral",
        max_position_embeddings=32768,
        sliding_window=4096,
    )
    return {
        "llama": sparse_hf_dir(root / "llama3-8b", LLAMA3.config(), llama_tensors(LLAMA3)),
        "qwen": sparse_hf_dir(root / "qwen25-7b-awq", qwen_cfg, llama_tensors(QWEN25, "awq", group=128)),
        "mistral": sparse_hf_dir(root / "mistral-7b", mistral_cfg, llama_tensors(MISTRAL)),
        "mistral-swa": sparse_hf_dir(
            root / "mistral-7b-swa",
            {**mistral_cfg, "layer_types": ["sliding_attention"] * 32},
            llama_tensors(MISTRAL),
        ),
        "mistral-alternating": sparse_hf_dir(
            root / "mistral-7b-alt", {**mistral_cfg, "sliding_window_pattern": 2}, llama_tensors(MISTRAL)
        ),
    }


LLAMA_WEIGHTS = 2 * 8_030_261_248  # Llama-3-8B: 8.03 B bf16 parameters
LLAMA_ACT = 2048 * 4096 * ACT_WIDTHS * 2 + 256 * 128256 * 4 * LOGIT_COPIES
QWEN_ACT = 2048 * 3584 * ACT_WIDTHS * 2 + 256 * 152064 * 4 * LOGIT_COPIES


def test_weights_and_kv_per_token_from_the_headers(models: dict[str, SafetensorsModel]) -> None:
    llama, qwen = models["llama"], models["qwen"]
    assert llama.weights is not None and llama.weights.total_bytes == LLAMA_WEIGHTS
    assert qwen.weights is not None
    assert qwen.weights.total_bytes == tensor_bytes(llama_tensors(QWEN25, "awq", group=128))
    assert 5.1 * GIB < qwen.weights.total_bytes < 5.3 * GIB  # the published AWQ build is 5.58 GB
    # layers x KV heads x head_dim x 2 (K and V) x 2 bytes
    assert kv_bytes_per_token(llama) * 32 == 32 * 8 * 128 * 2 * 2 == 128 * 1024
    assert kv_bytes_per_token(qwen) * 28 == 28 * 4 * 128 * 2 * 2 == 56 * 1024
    assert kv_bytes_per_token(llama, kv_cache_dtype="fp8") * 32 == 64 * 1024
    assert kv_bytes_per_token(llama, tensor_parallel=2) * 32 == 64 * 1024  # 4 KV heads per GPU
    assert kv_request_bytes(llama, engine=VLLM_SHARE, max_model_len=8192) == GIB
    assert kv_request_bytes(qwen, engine=SGLANG_SHARE, max_model_len=32768) == 32768 * 56 * 1024
    assert activation_bytes(llama) == LLAMA_ACT
    # vLLM logged 1.26 GiB for this model at 8192 batched tokens; the estimate leans high, not low
    assert 1.26 * GIB < activation_bytes(llama, batch_tokens=8192) < 2 * GIB


def test_sliding_window_layers_are_capped_only_where_the_config_says_which(
    models: dict[str, SafetensorsModel],
) -> None:
    per_layer_token = 8 * 128 * 2 * 2
    full = 32 * 32768 * per_layer_token
    # no layer_types: every layer counted at full length, and the plan says so
    assert kv_request_bytes(models["mistral"], engine=VLLM_SHARE, max_model_len=32768) == full == 4 * GIB
    share = plan_gpu_share(models["mistral"], A100, engine=VLLM_SHARE, max_model_len=32768)
    assert any("sliding_window 4096 but no layer_types" in n for n in share.notes)
    # every layer slides: window - 1 + batch tokens, in 16-token blocks, plus one block
    window_tokens = (math.ceil((4096 - 1 + 2048) / 16) + 1) * 16
    assert window_tokens == 6160
    swa = kv_request_bytes(models["mistral-swa"], engine=VLLM_SHARE, max_model_len=32768)
    assert swa == 32 * window_tokens * per_layer_token == 807_403_520
    assert kv_request_bytes(models["mistral-swa"], engine=VLLM_SHARE, max_model_len=4096) == (
        32 * (4096 // 16 + 1) * 16 * per_layer_token
    )
    # gemma-style pattern 2: layers 0, 2, 4, ... slide, every second one is full
    alt = kv_request_bytes(models["mistral-alternating"], engine=VLLM_SHARE, max_model_len=32768)
    assert alt == 16 * 32768 * per_layer_token + 16 * window_tokens * per_layer_token
    # SGLang's pool has a slot per token in every layer
    assert kv_request_bytes(models["mistral-swa"], engine=SGLANG_SHARE, max_model_len=32768) == full
    more = plan_gpu_share(models["mistral-swa"], A100, engine=VLLM_SHARE, max_model_len=32768)
    assert more.concurrent_requests > 4 * share.concurrent_requests


def test_llama3_8b_bf16_on_a_4090_with_vllm(models: dict[str, SafetensorsModel]) -> None:
    share = plan_gpu_share(models["llama"], RTX4090, engine=VLLM_SHARE, max_model_len=8192)
    total = 24564 * MIB
    inside = LLAMA_WEIGHTS + LLAMA_ACT + WORKSPACE  # what --gpu-memory-utilization must hold besides KV
    outside = CUDA_CONTEXT + CUDA_GRAPHS  # the context and the CUDA graphs sit outside it
    cap = (usable(RTX4090) - outside) * 100 // total  # 91: the most this card can promise, in percent
    n = (cap * total // 100 - inside) // GIB  # full 8192-token requests (1 GiB each) that fit
    pct = math.ceil((inside + n * GIB) * 100 / total)
    assert (cap, n, pct) == (91, 5, 88)
    assert share.fraction == 0.88 and share.fraction_basis == total
    assert share.weights == LLAMA_WEIGHTS and share.kv_per_request == GIB
    assert share.kv_cache == 88 * total // 100 - inside
    assert share.concurrent_requests == 5
    assert share.card_bytes == outside + 88 * total // 100 <= usable(RTX4090)
    assert share.argv == (
        "--gpu-memory-utilization", "0.88", "--max-model-len", "8192", "--tensor-parallel-size", "1",
        "--max-num-batched-tokens", "2048", "--max-num-seqs", "256",
    )  # fmt: skip
    assert share.max_total_tokens is None and share.notes == ()
    assert share.device_use().total == share.card_bytes
    public = share.public()
    assert json.loads(json.dumps(public))["argv"][1] == "0.88" and public["concurrent_requests"] == 5
    one = plan_gpu_share(models["llama"], RTX4090, engine=VLLM_SHARE, max_model_len=8192, concurrency=1)
    assert one.fraction == math.ceil((inside + GIB) * 100 / total) / 100 == 0.71


def test_qwen_awq_on_a_4090_with_sglang(models: dict[str, SafetensorsModel]) -> None:
    qwen = models["qwen"]
    assert qwen.weights is not None
    weights, per_token, total = qwen.weights.total_bytes, 28 * 4 * 128 * 2 * 2, 24564 * MIB
    share = plan_gpu_share(qwen, RTX4090, engine=SGLANG_SHARE, max_model_len=32768)
    dynamic = QWEN_ACT + WORKSPACE + CUDA_GRAPHS  # from the (1 - F) rest: not in SGLang's static fraction
    room = usable(RTX4090) - CUDA_CONTEXT - dynamic - weights
    n = room // (32768 * per_token)
    assert n == 9
    assert share.max_total_tokens == 9 * 32768
    assert share.kv_cache == 9 * 32768 * per_token and share.concurrent_requests == 9
    free = total - CUDA_CONTEXT  # SGLang's fraction multiplies the memory free when it measures
    pct = math.ceil((weights + share.kv_cache) * 100 / free) + SGLANG_SHARE.fraction_slack
    assert share.fraction_basis == free and share.fraction == pct / 100 == 0.91
    assert share.fraction * free >= weights + share.kv_cache
    assert share.card_bytes == CUDA_CONTEXT + dynamic + weights + share.kv_cache <= usable(RTX4090)
    assert share.argv == (
        "--mem-fraction-static", "0.91", "--context-length", "32768", "--tp-size", "1",
        "--max-total-tokens", "294912", "--chunked-prefill-size", "2048", "--max-running-requests", "256",
    )  # fmt: skip
    # with another lane promised, SGLang will find less free memory, so the same bytes are a larger F
    shared = plan_gpu_share(qwen, RTX4090, engine=SGLANG_SHARE, max_model_len=32768, reserved_by_others=0.4)
    assert shared.fraction_basis == total - round(0.4 * total) - CUDA_CONTEXT
    assert shared.card_bytes <= usable(RTX4090) - round(0.4 * total)
    assert shared.concurrent_requests == (
        usable(RTX4090) - round(0.4 * total) - CUDA_CONTEXT - dynamic - weights
    ) // (32768 * per_token)


def test_fp8_kv_cache_halves_the_request_and_is_passed_on(models: dict[str, SafetensorsModel]) -> None:
    v = plan_gpu_share(models["llama"], RTX4090, engine=VLLM_SHARE, max_model_len=8192, kv_cache_dtype="fp8")
    assert v.kv_per_request == GIB // 2 and v.argv[-2:] == ("--kv-cache-dtype", "fp8")
    assert v.concurrent_requests >= 10
    s = plan_gpu_share(
        models["qwen"], RTX4090, engine=SGLANG_SHARE, max_model_len=32768, kv_cache_dtype="fp8"
    )
    assert s.argv[-2:] == ("--kv-cache-dtype", "fp8_e4m3") and s.concurrent_requests >= 18
    with pytest.raises(SettingsError, match="kv_cache_dtype 'q4_0' is unknown"):
        plan_gpu_share(models["llama"], RTX4090, engine=VLLM_SHARE, max_model_len=8192, kv_cache_dtype="q4_0")


def test_refusal_on_a_16_gib_card_states_the_numbers(models: dict[str, SafetensorsModel]) -> None:
    with pytest.raises(GPUShareRefused) as caught:
        plan_gpu_share(models["llama"], RTX4060TI, engine=VLLM_SHARE, max_model_len=8192)
    err = caught.value
    assert isinstance(err, ModelTooLargeError) and err.code == "model_does_not_fit"
    msg = err.message
    assert "needs 14.96 GiB for weights + 1.00 GiB for one 8192-token request" in msg
    assert f"{usable(RTX4060TI) / GIB:.2f} GiB of this 16 GiB card is left" in msg
    assert "quantized build" in msg and "--tensor-parallel-size" in msg
    assert "--max-model-len" not in msg  # no context is short enough: the weights alone do not fit
    r = err.refusal
    assert r.needed > r.available == usable(RTX4060TI) and r.suggested_max_model_len is None
    assert dict(r.needs)["weights"] == LLAMA_WEIGHTS
    # the 4-bit build of a 7B model fits the same card, with room for several 32k requests
    share = plan_gpu_share(models["qwen"], RTX4060TI, engine=VLLM_SHARE, max_model_len=32768)
    assert share.concurrent_requests >= 3 and share.card_bytes <= usable(RTX4060TI)


def test_refusal_after_a_promise_suggests_a_shorter_context(models: dict[str, SafetensorsModel]) -> None:
    qwen = models["qwen"]
    assert qwen.weights is not None
    total = 24564 * MIB
    left = usable(RTX4090) - round(0.6 * total)
    with pytest.raises(GPUShareRefused) as caught:
        plan_gpu_share(
            qwen,
            RTX4090,
            engine=VLLM_SHARE,
            max_model_len=32768,
            reserved_by_others=0.6,
            reserved_for="lane llama-3-8b",
        )
    msg = caught.value.message
    assert "needs 5.19 GiB for weights + 1.75 GiB for one 32768-token request" in msg
    assert (
        f"{left / GIB:.2f} GiB of this 24 GiB card is left after the 0.60 promised to lane llama-3-8b" in msg
    )
    pct = (left - CUDA_CONTEXT - CUDA_GRAPHS) * 100 // total  # whole percents
    room = pct * total // 100 - (qwen.weights.total_bytes + QWEN_ACT + WORKSPACE)
    longest = room // (28 * 4 * 128 * 2 * 2) // 1024 * 1024  # in whole 1024-token steps
    assert longest == 22528 and caught.value.refusal.suggested_max_model_len == 22528
    assert "try --max-model-len 22528 or --kv-cache-dtype fp8" in msg
    ok = plan_gpu_share(qwen, RTX4090, engine=VLLM_SHARE, max_model_len=22528, reserved_by_others=0.6)
    assert ok.concurrent_requests == 1 and ok.card_bytes <= left


def test_a_card_of_unknown_size_is_refused(models: dict[str, SafetensorsModel]) -> None:
    blind = GPUInfo(0, "nvidia", "NVIDIA ?", None, None, None, None, None, False, None, "sysfs")
    with pytest.raises(GPUShareRefused, match=r"memory size of GPU0 .* is unknown"):
        plan_gpu_share(models["llama"], blind, engine=VLLM_SHARE, max_model_len=8192)


def test_tensor_parallel_sizes(models: dict[str, SafetensorsModel]) -> None:
    llama, qwen = models["llama"], models["qwen"]  # 32 heads / 8 KV heads; 28 heads / 4 KV heads
    assert [t for t in range(1, 9) if tensor_parallel_problem(llama, t) is None] == [1, 2, 4, 8]
    assert (
        tensor_parallel_problem(llama, 3)
        == "tensor parallel size 3 does not divide the model's 32 attention heads"
    )
    assert tensor_parallel_problem(llama, 16) is None  # more GPUs than KV heads: each holds a replicated one
    assert [valid_tensor_parallel(llama, n) for n in (1, 2, 3, 5, 6, 7, 8)] == [1, 2, 2, 4, 4, 4, 8]
    assert [t for t in range(1, 9) if tensor_parallel_problem(qwen, t) is None] == [1, 2, 4]
    assert (
        tensor_parallel_problem(qwen, 7)
        == "tensor parallel size 7 is not a multiple of the model's 4 KV heads"
    )
    assert valid_tensor_parallel(qwen, 8) == 4
    with pytest.raises(
        SettingsError, match=r"size 3 does not divide .* 32 attention heads; use one of 1, 2, 4, 8"
    ):
        plan_gpu_share(llama, RTX4090, engine=VLLM_SHARE, max_model_len=8192, tensor_parallel=3)


def test_tensor_parallel_splits_weights_and_kv_per_gpu(models: dict[str, SafetensorsModel]) -> None:
    share = plan_gpu_share(models["llama"], RTX4090, engine=VLLM_SHARE, max_model_len=8192, tensor_parallel=2)
    assert share.weights == LLAMA_WEIGHTS // 2 and share.kv_per_request == GIB // 2
    assert share.context == CUDA_CONTEXT + NCCL_BUFFERS
    assert share.argv[4:6] == ("--tensor-parallel-size", "2")
    assert "the share applies to each of 2 cards like GPU0" in share.notes
    assert share.concurrent_requests > 2 * 5  # two cards hold more than twice what one did


def test_two_lanes_share_an_80_gib_card(models: dict[str, SafetensorsModel]) -> None:
    lanes = [
        ShareRequest(models["llama"], VLLM_SHARE, 8192, name="llama"),
        ShareRequest(models["qwen"], SGLANG_SHARE, 32768, name="qwen"),
    ]
    llama, qwen = split_card(A100, lanes)
    total = 81920 * MIB
    assert llama.card_bytes + qwen.card_bytes <= usable(A100)
    assert llama.card_fraction + qwen.card_fraction <= 0.98
    # each lane's minimum (one full request), then the rest of the usable card split in equal bytes
    inside = LLAMA_WEIGHTS + LLAMA_ACT + WORKSPACE
    llama_min = CUDA_CONTEXT + CUDA_GRAPHS + math.ceil((inside + GIB) * 100 / total) * total // 100
    assert qwen.weights is not None
    qwen_dynamic = CUDA_CONTEXT + QWEN_ACT + WORKSPACE + CUDA_GRAPHS
    qwen_min = qwen_dynamic + qwen.weights + 32768 * 56 * 1024
    extra = (usable(A100) - llama_min - qwen_min) // 2
    assert llama.card_bytes <= llama_min + extra and qwen.card_bytes <= qwen_min + extra
    assert llama.concurrent_requests == (llama_min + extra - CUDA_CONTEXT - CUDA_GRAPHS - inside) // GIB
    assert qwen.concurrent_requests == (qwen_min + extra - qwen_dynamic - qwen.weights) // (32768 * 56 * 1024)
    assert (llama.concurrent_requests, qwen.concurrent_requests) == (26, 15)
    assert llama.argv[:2] == ("--gpu-memory-utilization", f"{llama.fraction:.2f}") and llama.fraction == 0.53
    # SGLang's F counts against what it finds free with the llama lane resident
    assert qwen.fraction_basis == total - (usable(A100) - (qwen_min + extra)) - CUDA_CONTEXT
    assert qwen.argv[:2] == ("--mem-fraction-static", f"{qwen.fraction:.2f}")
    assert qwen.argv[6:8] == ("--max-total-tokens", str(15 * 32768))


def test_a_lane_with_fixed_concurrency_leaves_the_rest_to_the_other(
    models: dict[str, SafetensorsModel],
) -> None:
    lanes = [
        ShareRequest(models["llama"], VLLM_SHARE, 8192, name="llama", concurrency=2),
        ShareRequest(models["qwen"], SGLANG_SHARE, 32768, name="qwen"),
    ]
    llama, qwen = split_card(H100, lanes)
    assert llama.concurrent_requests == 2
    assert qwen.concurrent_requests >= 24
    assert llama.card_bytes + qwen.card_bytes <= usable(H100)
    assert usable(H100) - llama.card_bytes - qwen.card_bytes < 32768 * 56 * 1024  # not a request's worth idle


def test_two_lanes_that_do_not_fit_are_refused_with_the_numbers(models: dict[str, SafetensorsModel]) -> None:
    lanes = [
        ShareRequest(models["llama"], VLLM_SHARE, 8192, name="chat"),
        ShareRequest(models["llama"], VLLM_SHARE, 8192, name="code"),
    ]
    with pytest.raises(GPUShareRefused) as caught:
        split_card(RTX4090, lanes)
    msg = caught.value.message
    assert msg.startswith("chat and code need 0.77 + 0.77 = 1.55 of this 24 GiB card")
    assert "more than the 0.98 that can be promised" in msg
    assert "chat (vllm): 14.96 GiB weights" in msg and "code (vllm): 14.96 GiB weights" in msg
    assert dict(caught.value.refusal.needs).keys() == {"chat", "code"}
    with pytest.raises(SettingsError, match="its own name"):
        split_card(A100, [lanes[0], lanes[0]])
    # one lane that cannot fit even alone is refused with its own numbers
    with pytest.raises(GPUShareRefused, match=r"chat needs 14\.96 GiB for weights"):
        split_card(RTX4060TI, lanes[:1])


def test_small_model_folder_on_an_older_card(tmp_path: Path) -> None:
    dims = LlamaDims(n_layer=4, hidden=256, heads=8, kv_heads=2, ff=512, vocab=1000)
    write_hf_dir(tmp_path / "tiny", dims.config(max_position_embeddings=2048), llama_tensors(dims), shards=2)
    model = read_safetensors_dir(tmp_path / "tiny")
    assert isinstance(model, SafetensorsModel)
    t4 = nvidia(15360, "Tesla T4", cc="7.5")
    share = plan_gpu_share(model, t4, engine=VLLM_SHARE, max_model_len=4096, concurrency=4)
    assert share.concurrent_requests == 4 and share.argv[-2:] == ("--dtype", "half")  # no bf16 below sm80
    assert any("bf16 weights run as fp16" in n for n in share.notes)
    assert any("longer than the model's 2048 positions" in n for n in share.notes)
    assert share.kv_per_request == 4 * 4096 * 2 * 32 * 2 * 2
