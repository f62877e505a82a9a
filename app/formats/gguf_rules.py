"""Per-architecture rules llama.cpp applies on top of a GGUF header: which layers slide, which are recurrent.

These mirror the `load_hparams` switch in llama.cpp's `src/llama-model.cpp` (and `llama-hparams.cpp`), so the
memory model sizes the cache llama.cpp will really allocate. The header wins where it says more:

Sliding window (`resolve_swa`):
- `{arch}.attention.sliding_window_pattern` as a bool array: one flag per layer, True = sliding (gemma4,
  mimo2, step35 write this).
- the same key as an integer: the period N of llama.cpp's `set_swa_pattern(N)`: layer `il` slides when
  `N == 0 or il % N < N - 1` (the last layer of every period is full attention); with the architecture's
  `dense_first` flag (smallthinker) the *first* layer of every period is full: `il % N != 0`.
- neither: the period llama.cpp hard-codes for the architecture (`_SWA_RULES`):
  gemma2 2 (1 sliding : 1 full, window 4096 when the key is absent), gemma3 6 (5 : 1, only when the header
  has a window > 0), gemma3n 5 (4 : 1), gemma-embedding 6 (symmetric window), cohere2 4 (3 : 1),
  gpt-oss 2, llama4 4 (chunked attention, chunk fixed at 8192; a header window of 0 turns it off),
  olmo2 4, afmoe 4, modern-bert 3 (symmetric) — those three only with a window > 0 in the header —,
  smallthinker 4 dense-first (window forced to 4096 when the header has one), exaone4 4 only for the 64-layer
  (32B) model (window 4096 unless the header says otherwise). phi3 headers carry a window but llama.cpp
  disables SWA for it, so no layer slides. Any other architecture: a window with a pattern key is honoured;
  a window without one is ignored (llama.cpp runs full attention there, e.g. qwen2, mistral).

Recurrent layers (`recurrent_layers`): all layers of mamba, mamba2 and the rwkv family; every layer of
falcon-h1 (which also runs attention in parallel on every layer); qwen3next/qwen35/qwen35moe: every layer but
each `full_attention_interval`-th (default 4); nemotron_h: layers with no KV heads and no FFN; the other
hybrids (jamba, plamo2, granitehybrid, lfm2, lfm2moe, kimi-linear, and any header with ssm/wkv/shortconv
keys and a per-layer KV-head array): layers whose head_count_kv is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

SWA_STANDARD = "standard"
SWA_CHUNKED = "chunked"
SWA_SYMMETRIC = "symmetric"


@dataclass(frozen=True)
class _SwaRule:
    period: int | None  # None: only a per-layer array in the header says which layers slide
    kind: str = SWA_STANDARD
    dense_first: bool = False
    needs_window: bool = False  # SWA only when the header has sliding_window > 0
    default_window: int | None = None  # used when the header has no sliding_window
    fixed_window: int | None = None  # llama.cpp overrides the header's value with this
    only_block_count: int | None = None  # the rule applies to this layer count only (exaone4 32B)
    disabled: bool = False  # llama.cpp turns SWA off for this architecture


_SWA_RULES: dict[str, _SwaRule] = {
    "gemma2": _SwaRule(period=2, default_window=4096),
    "gemma3": _SwaRule(period=6, needs_window=True),
    "gemma3n": _SwaRule(period=5),
    "gemma4": _SwaRule(period=None),
    "gemma-embedding": _SwaRule(period=6, kind=SWA_SYMMETRIC),
    "cohere2": _SwaRule(period=4),
    "gpt-oss": _SwaRule(period=2),
    "llama4": _SwaRule(period=4, kind=SWA_CHUNKED, fixed_window=8192),
    "olmo2": _SwaRule(period=4, needs_window=True),
    "afmoe": _SwaRule(period=4, needs_window=True),
    "modern-bert": _SwaRule(period=3, kind=SWA_SYMMETRIC, needs_window=True),
    "smallthinker": _SwaRule(period=4, dense_first=True, needs_window=True, fixed_window=4096),
    "exaone4": _SwaRule(period=4, default_window=4096, only_block_count=64),
    "phi3": _SwaRule(period=None, disabled=True),
}


@dataclass(frozen=True)
class SwaResolution:
    window: int | None  # tokens; None when no layer slides
    kind: str | None  # "standard", "chunked" or "symmetric"; None when no layer slides
    layers: tuple[bool, ...]  # per layer: True = the layer keeps only the window
    rule: str  # how `layers` was decided, for explanations


def swa_period_layers(n_layer: int, period: int, *, dense_first: bool = False) -> tuple[bool, ...]:
    """llama.cpp's `llama_hparams::set_swa_pattern(period, dense_first)`."""
    if dense_first:
        return tuple(period == 0 or il % period != 0 for il in range(n_layer))
    return tuple(period == 0 or il % period < period - 1 for il in range(n_layer))


def _none(n_layer: int, rule: str) -> SwaResolution:
    return SwaResolution(window=None, kind=None, layers=(False,) * n_layer, rule=rule)


def resolve_swa(
    arch: str, *, n_layer: int, window: int | None, pattern: int | tuple[bool, ...] | None
) -> SwaResolution:
    """Which layers use a sliding window, from the header's window/pattern and the architecture's rule.

    `pattern` is the header's `sliding_window_pattern`: an int period, a per-layer bool tuple (already checked
    to have `n_layer` entries), or None when absent.
    """
    rule = _SWA_RULES.get(arch)
    if rule is None:
        if not window or pattern is None:
            why = "no sliding window in the header" if not window else "window without a pattern"
            return _none(n_layer, f"{arch}: {why}; llama.cpp uses full attention on every layer")
        rule = _SwaRule(period=None)
    if rule.disabled:
        return _none(n_layer, f"{arch}: llama.cpp disables the sliding window; full attention everywhere")
    if rule.only_block_count is not None and n_layer != rule.only_block_count:
        return _none(n_layer, f"{arch}: only the {rule.only_block_count}-layer model slides; full attention")
    if rule.needs_window and not window:
        return _none(n_layer, f"{arch}: no sliding window in the header; full attention everywhere")
    if rule.kind == SWA_CHUNKED and window == 0:
        return _none(n_layer, f"{arch}: the header sets the window to 0; full attention everywhere")
    size = rule.fixed_window or window or rule.default_window
    if not size:
        return _none(n_layer, f"{arch}: no sliding window in the header; full attention everywhere")
    if isinstance(pattern, tuple):
        layers, how = pattern, f"{arch}: per-layer pattern from the header"
    else:
        period = pattern if isinstance(pattern, int) else rule.period
        if period is None:
            return _none(n_layer, f"{arch}: window but no per-layer pattern in the header; full attention")
        layers = swa_period_layers(n_layer, period, dense_first=rule.dense_first)
        source = "the header" if isinstance(pattern, int) else "llama.cpp's rule for the architecture"
        phase = "first" if rule.dense_first else "last"
        how = f"{arch}: period {period} from {source} ({phase} layer of each period is full attention)"
    if not any(layers):
        return _none(n_layer, f"{how}; no layer slides")
    return SwaResolution(window=int(size), kind=rule.kind, layers=layers, rule=how)


PURE_RECURRENT = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
PARALLEL_HYBRID = frozenset({"falcon-h1"})  # recurrent and attention on every layer
_INTERVAL_HYBRID = frozenset({"qwen3next", "qwen35", "qwen35moe"})
_FFN_HYBRID = frozenset({"nemotron_h", "nemotron_h_moe"})
_KV_ZERO_HYBRID = frozenset({"jamba", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "kimi-linear"})


def is_recurrent_arch(arch: str) -> bool:
    """True when llama.cpp keeps a recurrent state for some layers of this architecture."""
    return arch in PURE_RECURRENT | PARALLEL_HYBRID | _INTERVAL_HYBRID | _FFN_HYBRID | _KV_ZERO_HYBRID


def recurrent_layers(
    arch: str,
    *,
    head_count_kv: tuple[int, ...],
    feed_forward_length: tuple[int, ...],
    full_attention_interval: int | None,
    has_recurrent_keys: bool,
) -> tuple[bool, ...]:
    """Per layer: True where llama.cpp keeps a recurrent (SSM / RWKV / short-conv) state."""
    n = len(head_count_kv)
    if arch in PURE_RECURRENT or arch in PARALLEL_HYBRID:
        return (True,) * n
    if arch in _INTERVAL_HYBRID:
        step = full_attention_interval or 4
        return tuple((il + 1) % step != 0 for il in range(n))
    if arch in _FFN_HYBRID:
        return tuple(kv == 0 and ff == 0 for kv, ff in zip(head_count_kv, feed_forward_length, strict=True))
    if arch in _KV_ZERO_HYBRID or has_recurrent_keys:
        return tuple(kv == 0 for kv in head_count_kv)
    return (False,) * n


# llama.cpp's `n_layer_kv_from_start` where it is hard-coded rather than read (gemma3n shares the KV of
# its first 20 layers with the rest).
KV_FROM_START = {"gemma3n": 20}
