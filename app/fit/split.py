"""The plan of a split lane: one GGUF across this machine (the head) and peers lending `ggml-rpc-server`.

llama.cpp places layers by its own rule (`load_tensors`, this build's llama-model.cpp): the token embedding
stays on the head's CPU; the output layer counts as layer `n_layer`, and with `-ngl N` the last N of those
`n_layer + 1` layers are offloaded (so the output layer goes with any offload, to the last RPC device), shared
among the RPC devices in `--rpc` order by the cumulative `--tensor-split` proportions. The plan names layer
counts as those proportions, so each worker gets exactly the layers planned (never the engine's split by
the free memory a worker reports: an rpc-server reports the whole machine's RAM, whatever it lends).

Per machine: weights (exact tensor bytes), KV cache (llama.cpp's sizing, per layer where the layer is),
compute buffers and an overhead. Compute follows what ggml's graph allocator keeps live on a device
(docs/fit.md, "Splits"): the KQ mask while the device's last attention runs, beside the larger of the
attention and feed-forward phases. With two or more workers the head keeps at least one layer: offloading
all of them turns on the scheduler's pipeline parallelism, which keeps four copies of every split's inputs
on every device.

Machines are tried fewest first: the head alone, then each worker added, then pairs, ...; the first count
that fits wins (the faster plan where two of the same count fit), filling the head first and then each
worker in order up to its budget. Nothing here reads files or the network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, combinations
from typing import Any

from app.core.errors import BadRequestError
from app.core.units import fmt_bytes
from app.fit.memory import HOST_BASELINE, MIB, FitParams, compute_bytes, kv_layer_bytes
from app.fit.plan import bandwidth_bound
from app.formats.gguf_layout import GGUFLayout

# An idle ggml-rpc-server measured 5 to 6 MiB resident; the rest is room for its transport.
RPC_BASELINE = 16 * MIB
HEAD = ""  # the head's machine name


def machine_label(name: str) -> str:
    return "this machine" if name == HEAD else f"peer {name}"


@dataclass(frozen=True)
class SplitMachine:
    """A machine the split may use: `budget_bytes` is what it lends (at most its own probe's free memory
    minus its reserve); `bandwidth` its memory bandwidth in bytes/s (the copy figure, as the hardware
    probe measures it; None: unknown); `rtt_s` the measured round trip from the head (0 for the head)."""

    name: str
    budget_bytes: int
    bandwidth: float | None
    rtt_s: float = 0.0


@dataclass(frozen=True)
class SplitShare:
    """What one machine holds. `first_layer`..`first_layer + layers - 1` are its repeating layers;
    `output` says whether the output layer is there; `overhead` is the process (the head's engine, a
    worker's rpc-server) and, on a worker, the receive buffer a tensor lands in whole before it is
    copied into place (bounded by the largest layer it holds)."""

    machine: str
    layers: int
    weights: int
    kv: int
    compute: int
    overhead: int = 0
    budget: int = 0
    first_layer: int = 0
    output: bool = False

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.overhead

    @property
    def over(self) -> int:
        """Bytes beyond the budget (0 when it fits)."""
        return max(0, self.total - self.budget)

    def public(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "layers": self.layers,
            "first_layer": self.first_layer,
            "output": self.output,
            "weights": self.weights,
            "kv_cache": self.kv,
            "compute": self.compute,
            "overhead": self.overhead,
            "total": self.total,
            "budget": self.budget,
        }


@dataclass(frozen=True)
class SplitPlan:
    """The split: `shares` has the head first, then the workers used, in `--rpc` order (workers the plan
    does not need are left out, so each one listed costs a network hop for a reason)."""

    shares: tuple[SplitShare, ...]
    n_gpu_layers: int
    tensor_split: tuple[float, ...]  # per RPC device, in --rpc order
    fits: bool
    reason: str
    tokens_per_s: float | None
    speed_note: str

    @property
    def workers(self) -> tuple[str, ...]:
        """The peers whose rpc-servers go into `--rpc`, in this order."""
        return tuple(s.machine for s in self.shares[1:])

    def engine_args(self) -> list[str]:
        """llama-server's placement flags; the lane adds `--rpc` with exactly `workers`, in order (another
        device in that list would shift every layer). `--fit off` keeps the engine from moving anything."""
        args = ["-ngl", str(self.n_gpu_layers)]
        if self.tensor_split:
            split = ",".join(_num(v) for v in self.tensor_split)
            args += ["--split-mode", "layer", "--tensor-split", split]
        return [*args, "--fit", "off"]

    def public(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "reason": self.reason,
            "machines": [s.public() for s in self.shares],
            "workers": list(self.workers),
            "n_gpu_layers": self.n_gpu_layers,
            "tensor_split": list(self.tensor_split),
            "engine_args": self.engine_args(),
            "tokens_per_s": self.tokens_per_s,
            "speed_note": self.speed_note,
        }


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


@dataclass(frozen=True)
class _Phases:
    """Bytes of one ubatch's activations (f32), as ggml's allocator holds them on a device."""

    mask: int  # the KQ mask, live until the device's last attention
    attn: int  # residual, normed input, Q, K, V (and the KQ matrix without flash attention)
    ffn: int  # residual, normed input, gate, up and their product
    embd: int  # one [n_embd, ubatch] activation


def _phases(layout: GGUFLayout, params: FitParams) -> _Phases:
    ub = params.n_ubatch
    n_kv = params.ctx_per_seq
    e = layout.embedding_length or 0
    ff = max(layout.feed_forward_length, default=0)
    if layout.expert_used_count and layout.expert_feed_forward_length:
        ff = max(ff, layout.expert_feed_forward_length * layout.expert_used_count)
    kv_dim = max(layout.head_count_kv, default=0) * max(layout.key_length or 0, layout.value_length or 0)
    attn = ub * 4 * (3 * e + 2 * kv_dim)
    if not params.flash_attn:
        attn += n_kv * ub * max(layout.head_count, default=0) * 4
    return _Phases(
        mask=n_kv * ub * (2 if params.flash_attn else 4),
        attn=attn,
        ffn=ub * 4 * (2 * e + 3 * ff),
        embd=ub * 4 * e,
    )


class _Costs:
    """Per-layer bytes and the share of any contiguous run of layers on a machine."""

    def __init__(self, layout: GGUFLayout, params: FitParams) -> None:
        self.layout, self.params = layout, params
        self.n = layout.block_count
        self.phases = _phases(layout, params)
        self.kv_layers = kv_layer_bytes(layout, params=params)
        self.w_sum = (0, *accumulate(layout.layer_bytes[: self.n]))
        self.kv_sum = (0, *accumulate(self.kv_layers))
        extras = params.projector_bytes + params.projector_compute_bytes + params.draft_bytes
        self.head_extra = HOST_BASELINE + params.prompt_cache_bytes + extras + params.lora_bytes

    def head(self, layers: int, *, output: bool, budget: int) -> SplitShare:
        lay = self.layout
        weights = self.w_sum[layers] + lay.token_embd_bytes + lay.other_bytes
        weights += lay.output_bytes if output else 0
        ph = self.phases
        # with no layer of its own the head only gathers the embeddings (two ubatch-wide copies at once)
        compute = compute_bytes(lay, params=self.params) if layers else ph.mask + 4 * ph.embd
        return SplitShare(
            HEAD,
            layers=layers,
            weights=weights,
            kv=self.kv_sum[layers],
            compute=compute,
            overhead=self.head_extra,
            budget=budget,
            first_layer=0,
            output=output,
        )

    def worker(self, name: str, first: int, layers: int, *, output: bool, budget: int) -> SplitShare:
        lay, ph = self.layout, self.phases
        last = first + layers
        weights = self.w_sum[last] - self.w_sum[first]
        if output:  # a tied output matrix is token_embd again, duplicated where the output layer is
            weights += lay.output_bytes + (lay.token_embd_bytes if lay.output_tied else 0)
        if layers >= 2:  # the mask stays live through every earlier layer's feed-forward
            compute = ph.mask + max(ph.attn, ph.ffn)
        elif last == self.n:  # only the last layer: its feed-forward runs on the output rows alone
            compute = ph.mask + ph.attn
        else:  # one layer: the mask is freed after its attention, and the feed-forward reuses it
            compute = max(ph.mask + ph.attn, ph.ffn)
        if first == 0:  # the embeddings arrive here, beside the mixed-embedding inputs
            compute += 2 * ph.embd
        largest = max(lay.layer_bytes[first:last], default=0)
        if output:
            largest = max(largest, lay.output_bytes)
        return SplitShare(
            name,
            layers=layers,
            weights=weights,
            kv=self.kv_sum[last] - self.kv_sum[first],
            compute=compute,
            overhead=RPC_BASELINE + largest,
            budget=budget,
            first_layer=first,
            output=output,
        )


def _fill(costs: _Costs, workers: Sequence[SplitMachine], start: int) -> list[SplitShare] | None:
    """Layers start..n-1 over `workers` in order, each taking all it can (leaving one for each later
    worker), the last all that is left and the output layer; None when one cannot hold its part."""
    shares: list[SplitShare] = []
    last = len(workers) - 1
    for i, w in enumerate(workers):
        left = costs.n - start
        take = left if i == last else _most(costs, w, start, left - (last - i))
        if take <= 0:
            return None
        share = costs.worker(w.name, start, take, output=i == last, budget=w.budget_bytes)
        if share.over:
            return None
        shares.append(share)
        start += take
    return shares


def _most(costs: _Costs, w: SplitMachine, start: int, limit: int) -> int:
    """The most layers from `start` (at most `limit`) that fit `w` without the output layer; 0 if none.
    A worker's total grows with each layer it takes, so the count is found by bisection."""
    lo, hi = 0, max(0, limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if costs.worker(w.name, start, mid, output=False, budget=w.budget_bytes).over == 0:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _head_layers(n: int, workers: int) -> range:
    """The head's layer counts to try, most first: every worker needs one layer, and with two or more
    workers the head keeps one (none would turn on pipeline parallelism, see the module's doc)."""
    if not workers:
        return range(n, n - 1, -1)
    return range(n - workers, 0 if workers >= 2 else -1, -1)


def _place(
    costs: _Costs, head: SplitMachine, workers: Sequence[SplitMachine]
) -> tuple[SplitShare, ...] | None:
    """The shares with the most layers on the head that fit, or None."""
    for h in _head_layers(costs.n, len(workers)):
        mine = costs.head(h, output=not workers, budget=head.budget_bytes)
        if mine.over:
            continue
        rest = _fill(costs, workers, h)
        if rest is not None:
            return (mine, *rest)
    return None


def _engine_layout(shares: tuple[SplitShare, ...]) -> tuple[int, tuple[float, ...]]:
    """-ngl and --tensor-split: the offloaded layers and the output layer, which llama.cpp counts as one
    more layer and places with the last device."""
    workers = shares[1:]
    if not workers:
        return 0, ()
    counts = [s.layers for s in workers]
    counts[-1] += 1
    return sum(counts), tuple(float(c) for c in counts)


def _speed(
    costs: _Costs, shares: tuple[SplitShare, ...], machines: dict[str, SplitMachine]
) -> tuple[float | None, str]:
    """Tokens/s bounded by each machine reading its weights and half its KV per token, in turn, plus one
    network round trip per worker per token."""
    lay = costs.layout
    active = 1.0
    if lay.expert_count and lay.expert_used_count:  # the same rough scaling as plan.bytes_per_token
        active = max(lay.expert_used_count / lay.expert_count, 0.1)
    seconds = 0.0
    parts: list[str] = []
    unknown: list[str] = []
    for s in shares:
        m = machines[s.machine]
        read = (s.weights - (lay.token_embd_bytes + lay.other_bytes if s.machine == HEAD else 0)) * active
        read += s.kv / 2
        if not m.bandwidth:
            unknown.append(machine_label(s.machine))
            continue
        t = 1.0 / bandwidth_bound(int(read), m.bandwidth)
        seconds += t
        parts.append(f"{machine_label(s.machine)} {t * 1000:.1f} ms")
    hops = [machines[s.machine].rtt_s for s in shares[1:]]
    rtt = sum(hops)
    net = f"{len(hops)} network round trip{'s' if len(hops) != 1 else ''} ({rtt * 1000:.1f} ms) per token"
    if unknown:
        return None, f"memory bandwidth of {', '.join(unknown)} not measured; the split adds {net}"
    seconds += rtt
    if seconds <= 0:
        return None, "nothing to read"
    reads = ", ".join(parts)
    note = f"bandwidth bound: {reads}" + (f", plus {net}" if hops else "")
    return round(1.0 / seconds, 1), note


def _describe(s: SplitShare) -> str:
    return (
        f"{machine_label(s.machine)} {s.layers} layer{'s' if s.layers != 1 else ''}"
        f"{' and the output layer' if s.output and s.machine != HEAD else ''}: {fmt_bytes(s.total)} "
        f"(weights {fmt_bytes(s.weights)}, KV cache {fmt_bytes(s.kv)}, compute {fmt_bytes(s.compute)}) "
        f"of {fmt_bytes(s.budget)} lent"
    )


def _check(layout: GGUFLayout, head: SplitMachine, workers: Sequence[SplitMachine]) -> None:
    if layout.block_count <= 0 or not layout.layer_bytes:
        raise BadRequestError(
            f"{layout.path.name} has no repeating layers to split; it is not a language model llama.cpp "
            "can spread over machines"
        )
    names = [w.name for w in workers]
    if any(not n for n in names):
        raise BadRequestError(
            "every worker of a split needs its peer's name (the empty name is this machine)"
        )
    if len(set(names)) != len(names):
        raise BadRequestError(f"a peer is named twice among the split's workers: {', '.join(names)}")
    if head.name != HEAD:
        raise BadRequestError(f"the head of a split is this machine (name ''), not {head.name!r}")


def plan_split(
    layout: GGUFLayout, *, params: FitParams, head: SplitMachine, workers: Sequence[SplitMachine]
) -> SplitPlan:
    """The split of `layout` over `head` and as few of `workers` as hold it, or, when no combination
    does, `fits=False` with the numbers of the attempt over every machine and what is short."""
    _check(layout, head, workers)
    costs = _Costs(layout, params)
    machines = {HEAD: head, **{w.name: w for w in workers}}
    alone = costs.head(costs.n, output=True, budget=head.budget_bytes)
    for k in range(len(workers) + 1):
        found = [
            (shares, *_speed(costs, shares, machines))
            for combo in combinations(workers, k)
            if (shares := _place(costs, head, combo)) is not None
        ]
        if not found:
            continue
        shares, tps, note = max(
            found, key=lambda f: (f[1] or 0.0, -sum(machines[s.machine].rtt_s for s in f[0]))
        )
        ngl, split = _engine_layout(shares)
        if k == 0:
            reason = f"fits on this machine alone: {_describe(shares[0])}"
        else:
            largest = max(m.budget_bytes for m in machines.values())
            reason = (
                f"split over {k + 1} machines, as no fewer hold it (on one machine it needs "
                f"{fmt_bytes(alone.total)}; the largest budget is {fmt_bytes(largest)}): "
                + "; ".join(_describe(s) for s in shares)
            )
        return SplitPlan(shares, ngl, split, True, reason, tps, note)
    return _short(costs, head, workers, machines)


def _short(
    costs: _Costs, head: SplitMachine, workers: Sequence[SplitMachine], machines: dict[str, SplitMachine]
) -> SplitPlan:
    """Each machine filled to its budget, the last one given what is left: the numbers say what is short."""
    workers = workers[: max(1, costs.n - 1)]  # each worker needs a layer, and the head one beside two
    n, k = costs.n, len(workers)
    tries = _head_layers(n, k)
    h = next((h for h in tries if costs.head(h, output=not k, budget=head.budget_bytes).over == 0), tries[-1])
    shares = [costs.head(h, output=not k, budget=head.budget_bytes)]
    start = h
    for i, w in enumerate(workers):
        take = n - start if i == k - 1 else max(1, _most(costs, w, start, n - start - (k - 1 - i)))
        shares.append(costs.worker(w.name, start, take, output=i == k - 1, budget=w.budget_bytes))
        start += take
    need = sum(s.total for s in shares)
    lent = sum(m.budget_bytes for m in machines.values())
    detail = "; ".join(f"{_describe(s)}, {fmt_bytes(s.over)} over" for s in shares if s.over)
    if need > lent:
        gap = f"{fmt_bytes(need - lent)} short in all"
    else:
        gap = (
            f"enough in all, but the layers ({fmt_bytes(costs.layout.largest_layer_bytes)} the largest) and "
            "each machine's own compute buffers do not divide among these budgets"
        )
    reason = (
        f"does not fit across {len(machines)} machine{'s' if len(machines) != 1 else ''}: it needs "
        f"{fmt_bytes(need)} and they lend {fmt_bytes(lent)}, {gap} ({detail}); a smaller context, a "
        "smaller quantization or another peer would make room"
    )
    plan_shares = tuple(shares)
    ngl, split = _engine_layout(plan_shares)
    tps, note = _speed(costs, plan_shares, machines)
    return SplitPlan(plan_shares, ngl, split, False, reason, tps, note)
