"""The memory of lanes whose engine takes a share of a card's memory, chosen before the engine starts.

Such an engine does not size itself from free memory the way llama.cpp is sized in `memory.py`: it takes a
fraction and fills it, so two lanes on one card need explicit, non-overlapping fractions. How an engine
does that is its kind's `ShareRule` (declared beside the kind, app/lanes/engines/cuda.py, where each
rule's values are explained); this module plans with whichever rule it is given. A rule's fraction
multiplies one of two bases:

- "total": the engine refuses to start unless the free memory is at least F x the card's TOTAL memory,
  loads the weights, profiles one forward pass of the batch-token budget (and a sampler pass over its
  sequence limit), and whatever of F x total is left after weights, the activation peak and workspaces
  becomes KV cache. Its CUDA context, NCCL buffers and CUDA graphs sit outside F.
- "free": F applies to the memory FREE when the engine measures it (after its CUDA context and NCCL,
  before the weights): the KV pool gets `F x free - weights`, and activations and CUDA graphs come from
  the other `(1 - F) x free`. Because what is free at launch depends on which other lanes are resident,
  the plan assumes every promised lane is resident (the smallest free memory it may see) and also passes
  the rule's pool cap, which holds the pool at the planned size when the card happens to be emptier.

A rule's KV cache is either whole blocks of `kv_block_tokens` tokens, with sliding-window layers keeping
only `window - 1 + batch tokens` tokens (+1 block) per request, or one slot per token in every layer.

The estimates (constants below, each with its reason): activation peak = batch tokens x hidden size x
ACT_WIDTHS tensors of 2 bytes, plus the sampler's f32 logits; a fixed cuBLAS workspace, CUDA-graph pool,
CUDA context and (with tensor parallel) NCCL buffers; weights are the checkpoint's tensor bytes split
evenly over the tensor-parallel group. Checked against vLLM's own log for Meta-Llama-3-8B on an 80 GiB
card (vllm-project/vllm#10511: 14.96 GiB weights, 1.26 GiB activation peak at 8192 batched tokens), this
gives 14.96 and 1.87 GiB: it leans high on purpose.

Policy: a lane asks for weights + overhead + KV for N full `max_model_len` requests, N = as many as fit in
what the card has left (or the `concurrency` asked for), never fewer than one; the card keeps
SAFETY_MARGIN unpromised. A lane that cannot hold one full request is refused with the numbers and what
would make it fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from app.core.errors import ModelBrokenError, ModelTooLargeError, SettingsError
from app.core.units import fmt_bytes
from app.fit.memory import MIB, DeviceUse
from app.formats.safetensors_meta import SafetensorsModel
from app.hardware.model import GPUInfo

GIB = 1 << 30

SAFETY_MARGIN = 0.02  # of the card never promised: allocator fragmentation, and our estimates' error
# Hidden-sized activations alive per batched token at the forward peak: an MLP's gate+up and activation
# output (3 x intermediate, and intermediate is 3.5-5.3 x hidden in Llama-3 / Qwen2.5) plus ~5 hidden-wide
# tensors (residual, norm output, qkv, attention output). config.json facts lack the intermediate size,
# so this covers MLPs up to 6x hidden.
ACT_WIDTHS = 24
ACT_BYTES = 2  # activations run in bf16/fp16 ("auto" dtype serves fp32 checkpoints in half precision)
LOGIT_COPIES = 3  # per sequence in the sampler pass: f32 logits, probabilities, a sort buffer for top-p/k
WORKSPACE = 256 * MIB  # cuBLAS/attention workspaces; vLLM logs ~0.2 GiB of "non-torch" memory on one card
CUDA_GRAPHS = 1 * GIB  # graph pool; vLLM typically logs 0.3-1 GiB for 7-8B models at its default sizes
CUDA_CONTEXT = 512 * MIB  # the engine process's CUDA context (lazy module loading: ~0.3-0.5 GiB)
NCCL_BUFFERS = 512 * MIB  # per GPU with tensor parallel: NCCL and custom all-reduce buffers
# the batch-token budget's default below 70 GiB cards (vLLM's, and SGLang's chunked prefill on small cards)
DEFAULT_BATCH_TOKENS = 2048
DEFAULT_MAX_NUM_SEQS = 256  # the engines' sequence limit on such cards
SUGGEST_STEP = 1024  # a shorter context is suggested in multiples of this
# kv_cache_dtype -> bytes per element; "auto" is the model's half type (each rule spells the others)
KV_BYTES: dict[str, int] = {"auto": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True, kw_only=True)
class ShareRule:
    """How one engine takes its share of a card, as its kind declares it (app/lanes/engines/cuda.py): what
    its memory flag multiplies, how its KV cache is laid out, and the flags that pin what a plan assumed."""

    name: str  # the engine, as GPUShare.engine and the messages name it
    basis: Literal["total", "free"]  # the flag multiplies the card's total, or what is free when it measures
    activations_inside: bool  # the activation peak and workspaces come out of the fraction (else beside it)
    # KV in whole blocks of this many tokens, sliding-window layers shortened; None: every token, every layer
    kv_block_tokens: int | None
    batch_covers_seqs: bool  # it refuses a batch-token budget below its sequence limit
    fraction_flag: str
    length_flag: str
    tp_flag: str
    batch_flag: str
    seqs_flag: str
    pool_flag: str | None  # caps the KV pool at the planned tokens; a "free" basis needs one
    kv_dtype_flag: str
    kv_dtypes: tuple[tuple[str, str], ...]  # each KV_BYTES name but "auto" -> the engine's spelling
    half_flags: tuple[str, ...] = ()  # what runs bf16 weights below compute capability 8 (none: it switches)
    fraction_slack: int = 0  # whole percents added to the flag beyond the plan

    def __post_init__(self) -> None:
        if self.basis == "free" and not self.pool_flag:
            raise ValueError(f"{self.name}: a share of the free memory needs a pool cap (pool_flag)")
        spelled = {k for k, _ in self.kv_dtypes}
        if spelled != set(KV_BYTES) - {"auto"}:
            raise ValueError(f"{self.name}: kv_dtypes must spell exactly {sorted(set(KV_BYTES) - {'auto'})}")

    def flags(self) -> tuple[str, ...]:
        """Every option a plan with this rule may write."""
        named = (self.fraction_flag, self.length_flag, self.tp_flag, self.batch_flag, self.seqs_flag)
        return (
            *named,
            *([self.pool_flag] if self.pool_flag else []),
            self.kv_dtype_flag,
            *self.half_flags[:1],
        )

    def kv_spelling(self, kv_cache_dtype: str) -> str | None:
        """The engine's name for one of KV_BYTES' types; None for "auto" (no flag passed)."""
        return dict(self.kv_dtypes).get(kv_cache_dtype)


@dataclass(frozen=True)
class ShareRequest:
    """One lane that wants a share of a card (for `split_card`; `plan_gpu_share` builds one)."""

    model: SafetensorsModel
    engine: ShareRule
    max_model_len: int
    name: str = "this model"
    tensor_parallel: int = 1
    kv_cache_dtype: str = "auto"
    concurrency: int | None = None  # full-length requests to hold; None = as many as the share allows
    batch_tokens: int = DEFAULT_BATCH_TOKENS  # the rule's batch_flag
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS  # the rule's seqs_flag


@dataclass(frozen=True)
class GPUShare:
    """What one lane holds on each card of its tensor-parallel group, in bytes, and how to start it.

    `fraction` is the engine's flag; it multiplies `fraction_basis` (the card's total, or the memory free
    when it measures, assuming every promised lane is resident: the rule's basis). `card_bytes` is everything
    the lane holds, inside and outside the flag; `card_fraction` is that share of the card, the figure
    other lanes' promises are counted in.
    """

    name: str
    engine: str  # the rule's name
    gpu_index: int
    card_total: int
    fraction: float
    fraction_basis: int
    card_bytes: int
    weights: int
    activations: int
    workspace: int
    cuda_graphs: int
    context: int  # CUDA context, plus NCCL buffers with tensor parallel
    kv_cache: int
    kv_per_request: int
    max_model_len: int
    concurrent_requests: int  # full-length requests the KV cache holds at once
    tensor_parallel: int
    kv_cache_dtype: str
    max_total_tokens: int | None  # the pool cap of a "free" basis rule; None for a "total" one
    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def card_fraction(self) -> float:
        return self.card_bytes / self.card_total

    def device_use(self) -> DeviceUse:
        return DeviceUse(
            f"GPU{self.gpu_index}",
            weights=self.weights,
            kv_cache=self.kv_cache,
            compute=self.activations + self.workspace + self.cuda_graphs,
            overhead=self.context,
        )

    def public(self) -> dict[str, Any]:
        return {**asdict(self), "card_fraction": round(self.card_fraction, 4), "argv": list(self.argv)}


@dataclass(frozen=True)
class ShareRefusal:
    """Why a lane (or a set of lanes) gets no share: the bytes needed against the bytes left."""

    message: str
    card_total: int | None
    needed: int
    available: int
    needs: tuple[tuple[str, int], ...] = ()  # the parts of `needed`, named
    suggested_max_model_len: int | None = None

    def public(self) -> dict[str, Any]:
        return {**asdict(self), "needs": [{"what": k, "bytes": v} for k, v in self.needs]}


class GPUShareRefused(ModelTooLargeError):
    """The lane would not fit its share; the engine is not started. `refusal` holds the numbers."""

    def __init__(self, refusal: ShareRefusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


@dataclass(frozen=True)
class _Shape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    sliding: tuple[bool, ...]
    window: int | None
    notes: tuple[str, ...] = ()


def _shape(model: SafetensorsModel) -> _Shape:
    c = model.config
    facts = {
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size,
    }
    missing = [k for k, v in facts.items() if not v]
    if missing:
        raise ModelBrokenError(
            f"config.json does not say {', '.join(missing)}, so its memory cannot be planned; "
            "download the model's config.json again"
        )
    n = c.num_layers or 0
    notes: list[str] = []
    sliding = (False,) * n
    if c.sliding_window and len(c.layer_types) == n:
        sliding = tuple(t == "sliding_attention" for t in c.layer_types)
    elif c.sliding_window and c.sliding_window_pattern and c.sliding_window_pattern > 1:
        p = c.sliding_window_pattern  # gemma3/cohere2: every p-th layer is the full-attention one
        sliding = tuple((i + 1) % p != 0 for i in range(n))
    elif c.sliding_window:
        notes.append(
            f"config.json has sliding_window {c.sliding_window} but no layer_types, so every layer is "
            "counted at full length (vLLM's Llama/Mistral path does the same)"
        )
    return _Shape(
        layers=n,
        heads=c.num_heads or 0,
        kv_heads=c.num_kv_heads or 0,
        head_dim=c.head_dim or 0,
        hidden=c.hidden_size or 0,
        vocab=c.vocab_size or 0,
        sliding=sliding,
        window=c.sliding_window if any(sliding) else None,
        notes=tuple(notes),
    )


def tensor_parallel_problem(model: SafetensorsModel, size: int) -> str | None:
    """Why `size` GPUs cannot split this model's attention, or None when they can.

    The engines' rule: the attention heads divide evenly; the KV heads divide evenly, or, with more GPUs
    than KV heads, the GPU count is a multiple of them (each GPU then holds a replicated KV head).
    """
    s = _shape(model)
    if size < 1:
        return f"tensor parallel size {size} must be at least 1"
    if s.heads % size:
        return f"tensor parallel size {size} does not divide the model's {s.heads} attention heads"
    if s.kv_heads >= size and s.kv_heads % size:
        return f"tensor parallel size {size} does not divide the model's {s.kv_heads} KV heads"
    if s.kv_heads < size and size % s.kv_heads:
        return f"tensor parallel size {size} is not a multiple of the model's {s.kv_heads} KV heads"
    return None


def valid_tensor_parallel(model: SafetensorsModel, n_gpus: int) -> int:
    """The largest tensor-parallel size <= `n_gpus` the model's heads allow (1 always works)."""
    return next((t for t in range(max(1, n_gpus), 0, -1) if tensor_parallel_problem(model, t) is None), 1)


def _kv_dtype(name: str) -> int:
    """Bytes per element of a kv_cache_dtype."""
    if name not in KV_BYTES:
        raise SettingsError(f"kv_cache_dtype {name!r} is unknown; use one of {', '.join(KV_BYTES)}")
    return KV_BYTES[name]


def kv_bytes_per_token(
    model: SafetensorsModel, *, kv_cache_dtype: str = "auto", tensor_parallel: int = 1
) -> int:
    """Bytes one token costs per GPU in one layer's K and V: KV heads on the GPU x head_dim x 2 x B."""
    s = _shape(model)
    return max(1, s.kv_heads // tensor_parallel) * s.head_dim * 2 * _kv_dtype(kv_cache_dtype)


def kv_request_bytes(
    model: SafetensorsModel,
    *,
    engine: ShareRule,
    max_model_len: int,
    kv_cache_dtype: str = "auto",
    tensor_parallel: int = 1,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
) -> int:
    """KV bytes per GPU of one request of `max_model_len` tokens, as the engine's rule sizes it.

    In blocks: whole blocks; a sliding-window layer holds min(window - 1 + batch tokens, length) tokens
    plus one block. Without: one slot per token in every layer.
    """
    s = _shape(model)
    per_layer = kv_bytes_per_token(model, kv_cache_dtype=kv_cache_dtype, tensor_parallel=tensor_parallel)
    b = engine.kv_block_tokens
    if b is None:
        return s.layers * max_model_len * per_layer
    full = -(-max_model_len // b) * b
    tokens = 0
    for slides in s.sliding:
        if slides and s.window:
            tokens += (-(-min(s.window - 1 + batch_tokens, max_model_len) // b) + 1) * b
        else:
            tokens += full
    return tokens * per_layer


def activation_bytes(
    model: SafetensorsModel,
    *,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> int:
    """The profiled activation peak: one forward pass of `batch_tokens` tokens and the sampler's logits.

    Not split by tensor parallel: vLLM logs the same peak for Llama-3-8B at tp 1 and tp 2.
    """
    s = _shape(model)
    return batch_tokens * s.hidden * ACT_WIDTHS * ACT_BYTES + max_num_seqs * s.vocab * 4 * LOGIT_COPIES


def weight_bytes(model: SafetensorsModel) -> int:
    """Bytes of the weights in GPU memory (an fp32 checkpoint is served in half precision)."""
    if model.weights is None:
        raise ModelBrokenError(
            "the model has no safetensors weights; its GPU-share engines load *.safetensors"
        )
    total = model.weights.total_bytes
    if model.quantization is None and model.config.torch_dtype == "float32":
        total -= dict(model.weights.bytes_by_dtype).get("F32", 0) // 2
    return total


def _pct_floor(budget: int, basis: int) -> int:
    """The largest whole percent k (0-100) with k% of `basis`, in whole bytes, <= `budget`."""
    return max(0, min(100, (100 * (budget + 1) - 1) // basis))


def _pct_ceil(need: int, basis: int) -> int:
    """The smallest whole percent k with k% of `basis`, in whole bytes, >= `need`."""
    return -(-need * 100 // basis)


def _usable(total: int, *, foreign: int) -> int:
    """Bytes of the card that may be promised to lanes: all but SAFETY_MARGIN and other programs' use."""
    return total - -(-total * round(SAFETY_MARGIN * 100) // 100) - foreign


@dataclass(frozen=True)
class _Costs:
    """Everything but the KV cache, split into what the engine's fraction covers and what sits outside."""

    weights: int
    activations: int
    context: int
    per_request: int
    inside: int  # besides KV, what the fraction must cover (weights, and activations when the rule says)
    outside: int  # what the lane holds outside its fraction


def _costs(req: ShareRequest) -> _Costs:
    tp = req.tensor_parallel
    weights = -(-weight_bytes(req.model) // tp)
    act = activation_bytes(req.model, batch_tokens=req.batch_tokens, max_num_seqs=req.max_num_seqs)
    context = CUDA_CONTEXT + (NCCL_BUFFERS if tp > 1 else 0)
    per_request = _per_request(req)
    if req.engine.activations_inside:
        return _Costs(weights, act, context, per_request, weights + act + WORKSPACE, context + CUDA_GRAPHS)
    return _Costs(weights, act, context, per_request, weights, context + act + WORKSPACE + CUDA_GRAPHS)


def _kv_room(req: ShareRequest, costs: _Costs, *, total: int, budget: int) -> int:
    """KV bytes the lane can have when it may hold `budget` bytes of the card."""
    if req.engine.basis == "total":  # its fraction is whole percents of the total; the rest is outside it
        return _pct_floor(budget - costs.outside, total) * total // 100 - costs.inside
    return budget - costs.outside - costs.inside


def _check(req: ShareRequest, gpu: GPUInfo) -> int:
    rule = req.engine
    if req.max_model_len < 1:
        raise SettingsError(f"max_model_len {req.max_model_len} must be at least 1")
    _kv_dtype(req.kv_cache_dtype)
    if rule.batch_covers_seqs and req.batch_tokens < req.max_num_seqs:
        raise SettingsError(
            f"{rule.batch_flag} {req.batch_tokens} must be at least {rule.seqs_flag} {req.max_num_seqs}"
        )
    problem = tensor_parallel_problem(req.model, req.tensor_parallel)
    if problem:
        valid = [t for t in (1, 2, 4, 8) if tensor_parallel_problem(req.model, t) is None]
        raise SettingsError(f"{problem}; use one of {', '.join(map(str, valid))}")
    if not gpu.memory_total:
        raise GPUShareRefused(
            ShareRefusal(
                f"the memory size of GPU{gpu.index} ({gpu.name}) is unknown, so no share of it can be "
                "promised; check that the NVIDIA driver (NVML) is installed",
                card_total=None,
                needed=0,
                available=0,
            )
        )
    return gpu.memory_total


def _plan(req: ShareRequest, gpu: GPUInfo, *, others: int, others_label: str, foreign: int) -> GPUShare:
    """The share of `req` when promised lanes hold `others` bytes and other programs `foreign` bytes."""
    total = _check(req, gpu)
    shape = _shape(req.model)
    costs = _costs(req)
    budget = _usable(total, foreign=foreign) - others
    room = _kv_room(req, costs, total=total, budget=budget)
    want = req.concurrency or 1
    if room < want * costs.per_request:
        raise GPUShareRefused(
            _refusal(
                req,
                costs,
                total=total,
                budget=budget,
                room=room,
                others=others,
                others_label=others_label,
                foreign=foreign,
            )
        )
    n = want if req.concurrency else room // costs.per_request
    pct, basis, kv, card, pool_tokens = _sizes(
        req, costs, shape, n=n, total=total, free=total - foreign - others
    )
    return GPUShare(
        name=req.name,
        engine=req.engine.name,
        gpu_index=gpu.index,
        card_total=total,
        fraction=pct / 100,
        fraction_basis=basis,
        card_bytes=card,
        weights=costs.weights,
        activations=costs.activations,
        workspace=WORKSPACE,
        cuda_graphs=CUDA_GRAPHS,
        context=costs.context,
        kv_cache=kv,
        kv_per_request=costs.per_request,
        max_model_len=req.max_model_len,
        concurrent_requests=kv // costs.per_request,
        tensor_parallel=req.tensor_parallel,
        kv_cache_dtype=req.kv_cache_dtype,
        max_total_tokens=pool_tokens,
        argv=_argv(req, gpu, pct=pct, pool_tokens=pool_tokens),
        notes=shape.notes + _notes(req, gpu),
    )


def _sizes(
    req: ShareRequest, costs: _Costs, shape: _Shape, *, n: int, total: int, free: int
) -> tuple[int, int, int, int, int | None]:
    """(flag in percent, the bytes it multiplies, KV bytes, card bytes, pool tokens of a "free" basis) for
    `n` full-length requests; `free` is what the card has when the promised lanes are resident."""
    if req.engine.basis == "total":  # KV = the whole fraction less weights and activations
        pct = _pct_ceil(costs.inside + n * costs.per_request, total)
        return pct, total, pct * total // 100 - costs.inside, costs.outside + pct * total // 100, None
    basis = free - costs.context  # what the engine finds free when it measures, after its own context
    tokens = n * req.max_model_len
    kv = (
        tokens
        * shape.layers
        * kv_bytes_per_token(
            req.model, kv_cache_dtype=req.kv_cache_dtype, tensor_parallel=req.tensor_parallel
        )
    )
    pct = min(99, _pct_ceil(costs.inside + kv, basis) + req.engine.fraction_slack)
    return pct, basis, kv, costs.outside + costs.inside + kv, tokens


def _argv(req: ShareRequest, gpu: GPUInfo, *, pct: int, pool_tokens: int | None) -> tuple[str, ...]:
    """The engine flags that pin what the plan assumed (fraction, length, TP, batch, sequences, KV type)."""
    rule = req.engine
    out = [rule.fraction_flag, f"{pct / 100:.2f}", rule.length_flag, str(req.max_model_len)]
    out += [rule.tp_flag, str(req.tensor_parallel)]
    if rule.pool_flag and pool_tokens is not None:
        out += [rule.pool_flag, str(pool_tokens)]
    out += [rule.batch_flag, str(req.batch_tokens), rule.seqs_flag, str(req.max_num_seqs)]
    kv = rule.kv_spelling(req.kv_cache_dtype)
    out += [rule.kv_dtype_flag, kv] if kv else []
    return tuple(out + (list(rule.half_flags) if _needs_half(req, gpu) else []))


def _needs_half(req: ShareRequest, gpu: GPUInfo) -> bool:
    """bf16 needs compute capability 8.0; some engines refuse below it unless told (the rule's half_flags)."""
    major = (gpu.compute_capability or "").split(".")[0]
    return req.model.config.torch_dtype == "bfloat16" and major.isdigit() and int(major) < 8


def _notes(req: ShareRequest, gpu: GPUInfo) -> tuple[str, ...]:
    c = req.model.config
    out: list[str] = []
    if c.max_position_embeddings and req.max_model_len > c.max_position_embeddings:
        out.append(
            f"max_model_len {req.max_model_len} is longer than the model's {c.max_position_embeddings} "
            "positions; the engine refuses it unless the config's rope scaling extends them"
        )
    if c.is_vision_language:
        out.append("the vision encoder's profiling peak is not in the estimate; leave headroom")
    if c.expert_count:
        out.append("MoE kernels' scratch buffers are not in the activation estimate")
    if req.tensor_parallel > 1:
        out.append(f"the share applies to each of {req.tensor_parallel} cards like GPU{gpu.index}")
    if _needs_half(req, gpu):
        out.append(
            f"GPU{gpu.index} has compute capability {gpu.compute_capability}: bf16 weights run as fp16"
        )
    return tuple(out)


def _refusal(
    req: ShareRequest,
    costs: _Costs,
    *,
    total: int,
    budget: int,
    room: int,
    others: int,
    others_label: str,
    foreign: int,
) -> ShareRefusal:
    want = req.concurrency or 1
    kv = want * costs.per_request
    overhead = costs.inside + costs.outside - costs.weights
    rule = req.engine
    if rule.basis == "total":  # the fraction is whole percents: the rounding counts as overhead
        overhead = costs.outside + _pct_ceil(costs.inside + kv, total) * total // 100 - costs.weights - kv
    need = costs.weights + kv + overhead
    what = "one" if want == 1 else str(want)
    left = f"{fmt_bytes(max(0, budget))} of this {total / GIB:.0f} GiB card is left"
    if others:
        left += f" after the {others / total:.2f} promised to {others_label}"
    if foreign:
        left += f" and {fmt_bytes(foreign)} held by other programs"
    left += f" ({SAFETY_MARGIN:.2f} is kept free)"
    tries: list[str] = []
    shorter = _shorter_len(req, room=room)
    if shorter:
        tries.append(f"{rule.length_flag} {shorter}")
    if req.kv_cache_dtype == "auto" and room >= want * _per_request(req, kv_cache_dtype="fp8"):
        tries.append(f"{rule.kv_dtype_flag} {rule.kv_spelling('fp8')}")
    if room < 0:
        tries.append(f"more GPUs with {rule.tp_flag}" if req.tensor_parallel == 1 else "more GPUs")
    if req.model.quantization is None:
        tries.append("a quantized build (AWQ/GPTQ 4-bit)")
    elif not tries:
        tries.append("a smaller model")
    message = (
        f"{req.name} needs {fmt_bytes(costs.weights)} for weights + {fmt_bytes(kv)} for {what} "
        f"{req.max_model_len}-token request{'s' if want > 1 else ''} + {fmt_bytes(overhead)} engine overhead "
        f"(activations, CUDA graphs, CUDA context) on {rule.name}; {left}; try {' or '.join(tries)}"
    )
    return ShareRefusal(
        message,
        card_total=total,
        needed=need,
        available=max(0, budget),
        needs=(
            ("weights", costs.weights),
            (f"{what} {req.max_model_len}-token request", kv),
            ("overhead", overhead),
        ),
        suggested_max_model_len=shorter,
    )


def _per_request(req: ShareRequest, *, kv_cache_dtype: str | None = None, length: int | None = None) -> int:
    return kv_request_bytes(
        req.model,
        engine=req.engine,
        max_model_len=length or req.max_model_len,
        kv_cache_dtype=kv_cache_dtype or req.kv_cache_dtype,
        tensor_parallel=req.tensor_parallel,
        batch_tokens=req.batch_tokens,
    )


def _shorter_len(req: ShareRequest, *, room: int) -> int | None:
    """The longest multiple of SUGGEST_STEP below `max_model_len` whose requests fit in `room` KV bytes."""
    want = req.concurrency or 1
    lo, hi = 0, (req.max_model_len - 1) // SUGGEST_STEP
    while lo < hi:  # KV grows with length: bisect on the number of steps
        mid = (lo + hi + 1) // 2
        if want * _per_request(req, length=mid * SUGGEST_STEP) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo * SUGGEST_STEP if lo else None


def plan_gpu_share(
    model: SafetensorsModel,
    gpu: GPUInfo,
    *,
    engine: ShareRule,
    max_model_len: int,
    reserved_by_others: float = 0.0,
    reserved_for: str = "other lanes",
    tensor_parallel: int = 1,
    kv_cache_dtype: str = "auto",
    concurrency: int | None = None,
    foreign_used: int = 0,
    name: str = "this model",
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> GPUShare:
    """The share of `gpu` a lane of the `engine` rule asks for, or `GPUShareRefused` with the numbers.

    `reserved_by_others` is the fraction of the card's total already promised to other lanes
    (`reserved_for` names them in a refusal); `foreign_used` is bytes other programs hold on it. The lane
    takes KV for as many full-length requests as the rest of the card holds, or exactly `concurrency`.
    """
    req = ShareRequest(
        model=model,
        engine=engine,
        max_model_len=max_model_len,
        name=name,
        tensor_parallel=tensor_parallel,
        kv_cache_dtype=kv_cache_dtype,
        concurrency=concurrency,
        batch_tokens=batch_tokens,
        max_num_seqs=max_num_seqs,
    )
    if not 0 <= reserved_by_others < 1:
        raise SettingsError(f"reserved_by_others {reserved_by_others} must be a fraction in [0, 1)")
    total = _check(req, gpu)
    others = round(reserved_by_others * total)
    return _plan(req, gpu, others=others, others_label=reserved_for, foreign=foreign_used)


def split_card(gpu: GPUInfo, requests: Sequence[ShareRequest], *, foreign_used: int = 0) -> list[GPUShare]:
    """Explicit shares for lanes that run on one card at once, in the order given.

    Each lane first gets its minimum (its `concurrency`, or one full-length request); what is left of the
    card's usable part (all but SAFETY_MARGIN) is split in equal bytes among the lanes without a fixed
    `concurrency`. The card fractions add up to at most 1 - SAFETY_MARGIN; when the minimums do not fit,
    `GPUShareRefused` lists what each lane needs.
    """
    if not requests:
        return []
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise SettingsError("give each lane on the card its own name")
    mins = []
    for r in requests:
        fixed = replace(r, concurrency=r.concurrency or 1)
        mins.append(_plan(fixed, gpu, others=0, others_label="", foreign=foreign_used))
    total = mins[0].card_total
    usable = _usable(total, foreign=foreign_used)
    need = sum(m.card_bytes for m in mins)
    if need > usable:
        raise GPUShareRefused(_split_refusal(mins, total=total, usable=usable, need=need))
    flexible = [i for i, r in enumerate(requests) if r.concurrency is None]
    extra = (usable - need) // len(flexible) if flexible else 0
    budgets = [m.card_bytes + (extra if i in flexible else 0) for i, m in enumerate(mins)]
    out = []
    for i, r in enumerate(requests):
        label = " and ".join(n for j, n in enumerate(names) if j != i)
        others = usable - budgets[i]
        out.append(_plan(r, gpu, others=others, others_label=label, foreign=foreign_used))
    return out


def _split_refusal(mins: list[GPUShare], *, total: int, usable: int, need: int) -> ShareRefusal:
    parts = " + ".join(f"{m.card_fraction:.2f}" for m in mins)
    each = "; ".join(
        f"{m.name} ({m.engine}): {fmt_bytes(m.weights)} weights + {fmt_bytes(m.kv_cache)} KV for "
        f"{m.concurrent_requests} x {m.max_model_len} tokens + "
        f"{fmt_bytes(m.card_bytes - m.weights - m.kv_cache)} overhead"
        for m in mins
    )
    names = " and ".join(m.name for m in mins)
    message = (
        f"{names} need {parts} = {need / total:.2f} of this {total / GIB:.0f} GiB card ({fmt_bytes(need)}), "
        f"more than the {usable / total:.2f} that can be promised ({fmt_bytes(usable)}): {each}; "
        "shorten a lane's context, give a lane an fp8 KV cache, or move a lane to another card"
    )
    return ShareRefusal(
        message,
        card_total=total,
        needed=need,
        available=usable,
        needs=tuple((m.name, m.card_bytes) for m in mins),
    )
