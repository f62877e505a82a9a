"""One vLLM or SGLang model over several paired machines: one engine process per machine, each started
with the engine's own multi-node flags (docs/peers.md#multi-node-vllm-and-sglang).

vLLM (0.13 or newer, its multiprocessing backend, no Ray cluster): every node runs `vllm serve` with the
same `--tensor-parallel-size T --pipeline-parallel-size P --nnodes N --master-addr HEAD --master-port PORT`
and its own `--node-rank`; every node but the head adds `--headless` (no API server: the head serves and
drives the workers of every node, and answers /health once they have all joined). SGLang: `python -m
sglang.launch_server` with `--tp-size T --pp-size P --nnodes N --node-rank R --dist-init-addr HEAD:PORT`;
a node past the head answers only /health on its own port, once its ranks are ready.

Each node runs T x P / N ranks, numbered tensor-first, so node R holds ranks R x local .. and the pipeline
stages those ranks belong to. The default layout keeps tensor parallel inside a machine (its GPUs talk
over PCIe or NVLink) and puts one pipeline stage on each machine: between machines only one stage's
activations cross the network per step, which a home network carries; the "tensor" layout splits every
layer over all machines (an all-reduce per layer: for fast links only).

Only on a network the user marks trusted, per peer (`switchyard peers trust NAME --network`): neither engine
encrypts or authenticates what passes between nodes (torch.distributed's store, NCCL and Gloo sockets,
SGLang's ZMQ ports), and anyone who reaches those ports can join or read them.

Memory: each node's cards are planned by app/fit/gpu_share.py for the part of the model its stage holds
(its layers; the embeddings on the first stage; the output head on the last), and the layer split is
pinned with VLLM_PP_LAYER_PARTITION / SGLANG_PP_LAYER_PARTITION, so the engines split as planned rather
than by their own rule. The plan is pure: the head makes it and hands each node its NodeLaunch (JSON);
each node turns its own into a command with its own executable, port and parent (`node_command`), after
its own checks (app/lanes/engines/multinode_part.py).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from app.core.errors import EngineUnavailableError, SettingsError
from app.core.frozen import module_argv
from app.core.public import Public
from app.core.settings import Settings
from app.fit.gpu_share import (
    GPUShare,
    GPUShareRefused,
    plan_gpu_share,
    tensor_parallel_problem,
    valid_tensor_parallel,
    weight_bytes,
)
from app.formats.safetensors_meta import SafetensorsModel
from app.hardware.model import GPUInfo
from app.lanes.engines.cuda import CudaParams, compute_capability, max_model_len, share_rule
from app.lanes.engines.plan import ApiStyle, LaunchPlan
from app.lanes.proc import settings_env
from app.routing.traits import CUDA_MIN_CC

Layout = Literal["pipeline", "tensor"]
TITLES: dict[str, str] = {"vllm": "vLLM", "sglang": "SGLang"}
VLLM_MASTER_PORT = 29501  # vLLM's own --master-port default
# SGLang has no default; on the head it also opens the next six ports (its ZMQ channels)
SGLANG_DIST_PORT = 29500
SGLANG_PORTS_AFTER = 6
EMBED_BYTES = 2  # embeddings and the output head stay in half precision, quantized checkpoints too


@dataclass(frozen=True)
class Node:
    """One machine as the plan sees it. The first node of a plan is the head (this machine): it serves
    the API, and the trust asked of the others is the trust of their links to it."""

    name: str  # the peer's name (the head: this machine's)
    address: str  # where the other nodes reach it on the trusted network
    gpus: tuple[GPUInfo, ...] | None  # from its own probe; None: it has not reported one
    model_path: str  # where that machine keeps the model's folder (the same files on every machine)
    trusted_network: bool = False  # the peer's flag (PeerSpec.trusted_network)
    # its network interface toward the others (NCCL and Gloo sockets); None: it finds its own at start
    interface: str | None = None
    promised: int = 0  # bytes per card already promised to GPU lanes running there


@dataclass(frozen=True)
class NodeLaunch(Public):
    """What one node runs: the engine's words after its executable, the environment the plan adds, and
    what its cards must hold. JSON-safe (`public`/`from_json`): the head sends it over the peer link."""

    node: str
    rank: int
    engine: str
    model_path: str  # on that machine
    args: tuple[str, ...]
    env: dict[str, str]
    gpus: tuple[int, ...]  # NVML indexes, in CUDA_VISIBLE_DEVICES order
    stages: tuple[int, ...]  # the pipeline stages its ranks belong to
    layers: tuple[int, int]  # the first layer its stages hold, and one past the last
    serves_api: bool  # the head: the OpenAI API on its port
    health_path: str | None  # on its own port; None: vLLM's headless node has none (the head's says)
    card_bytes: int  # what each of its cards must hold, inside and outside the engine's memory flag
    fraction: float  # the engine's memory flag on this node
    share: dict[str, Any] = field(default_factory=dict)  # GPUShare.public() of its largest stage

    @property
    def budget(self) -> int:
        return self.card_bytes * len(self.gpus)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeLaunch:
        return cls(
            node=str(d["node"]),
            rank=int(d["rank"]),
            engine=str(d["engine"]),
            model_path=str(d["model_path"]),
            args=tuple(str(a) for a in d["args"]),
            env={str(k): str(v) for k, v in d["env"].items()},
            gpus=tuple(int(g) for g in d["gpus"]),
            stages=tuple(int(s) for s in d["stages"]),
            layers=(int(d["layers"][0]), int(d["layers"][1])),
            serves_api=bool(d["serves_api"]),
            health_path=d["health_path"],
            card_bytes=int(d["card_bytes"]),
            fraction=float(d["fraction"]),
            share=dict(d.get("share") or {}),
        )


@dataclass(frozen=True)
class MultiNodePlan:
    engine: str
    model_id: str
    max_model_len: int
    tensor_parallel: int
    pipeline_parallel: int
    layer_partition: tuple[int, ...]  # layers per pipeline stage
    master: tuple[str, int]  # the head's address and the rendezvous port the others connect to
    nodes: tuple[NodeLaunch, ...]  # in rank order; nodes[0] is the head
    extra_args: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(n.budget for n in self.nodes)

    def public(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "model": self.model_id,
            "max_model_len": self.max_model_len,
            "tensor_parallel": self.tensor_parallel,
            "pipeline_parallel": self.pipeline_parallel,
            "layer_partition": list(self.layer_partition),
            "master": f"{self.master[0]}:{self.master[1]}",
            "nodes": [{**n.public(), "budget": n.budget} for n in self.nodes],
            "total": self.total_bytes,
            "notes": list(self.notes),
        }


class MultiNodeRefused(EngineUnavailableError):
    """The machines cannot run the model together; `reasons` lists every reason found, not only the first."""

    def __init__(self, message: str, reasons: Sequence[str]) -> None:
        super().__init__(message)
        self.reasons = tuple(reasons)


@dataclass(frozen=True)
class NodeCommand:
    """The process one node starts (its guard first, so the engine dies with that node's server)."""

    argv: tuple[str, ...]
    env: dict[str, str]
    port: int | None  # what health_path answers on; None: a headless vLLM node
    health_path: str | None


# ---- peers and this machine ------------------------------------------------------------------------------
def trust_refusal(name: str, *, engine: str) -> str:
    """Why a peer whose link is not marked trusted is not used, and the command that marks it."""
    return (
        f"the network to {name!r} is not marked as trusted: {TITLES.get(engine, engine)} sends tensors "
        "between machines unencrypted and unauthenticated (torch.distributed, NCCL, Gloo), and the ports "
        "it opens accept anyone who reaches them; on a network only you control (a home LAN, a direct "
        f"cable, your own VPN) run `switchyard peers trust {name} --network`"
    )


def gpus_of(hardware: Mapping[str, Any] | None) -> tuple[GPUInfo, ...] | None:
    """The GPUs in a peer's own probe as `/peer/info` sends it (Hardware.public()); None without one."""
    if not isinstance(hardware, Mapping) or not isinstance(hardware.get("gpus"), list):
        return None
    out = []
    for i, g in enumerate(hardware["gpus"]):
        if not isinstance(g, Mapping):
            continue
        out.append(
            GPUInfo(
                index=i if _int(g.get("index")) is None else int(g["index"]),
                vendor=g.get("vendor") if g.get("vendor") in ("nvidia", "amd", "intel", "apple") else None,
                name=str(g.get("name") or "GPU"),
                memory_total=_int(g.get("memory_total")),
                memory_free=_int(g.get("memory_free")),
                memory_used=_int(g.get("memory_used")),
                driver_version=g.get("driver_version"),
                compute_capability=g.get("compute_capability"),
                unified_memory=bool(g.get("unified_memory")),
                pci_bus_id=g.get("pci_bus_id"),
                source=g.get("source") or "nvml",
            )
        )
    return tuple(out)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def node_of_peer(
    name: str,
    *,
    address: str,
    hardware: Mapping[str, Any] | None,
    trusted_network: bool,
    model_path: str,
    interface: str | None = None,
    promised: int = 0,
) -> Node:
    """A paired peer as a node: `address` (the host of its API root), its GPUs from its own probe as
    `/peer/info` sends it, and whether this machine marked the network to it trusted. Plain fields, so the
    engines need not know the peers' store."""
    return Node(
        name=name,
        address=address,
        gpus=gpus_of(hardware),
        model_path=model_path,
        trusted_network=trusted_network,
        interface=interface,
        promised=promised,
    )


def interface_of(address: str) -> str | None:
    """This machine's network interface that holds `address` (for NCCL_SOCKET_IFNAME), or None."""
    import psutil

    try:
        wanted = socket.getaddrinfo(address, None)[0][4][0]
        for nic, addrs in psutil.net_if_addrs().items():
            if any(a.address.split("%")[0] == wanted for a in addrs):
                return nic
    except (OSError, IndexError):
        return None
    return None


# ---- the plan ----------------------------------------------------------------------------------------------
def _cards(node: Node, *, engine: str) -> tuple[list[GPUInfo], str | None]:
    """The node's NVIDIA cards the engines run on, largest first, or why there are none."""
    title = TITLES.get(engine, engine)
    if node.gpus is None:
        return [], f"{node.name!r} has not reported its hardware; run `switchyard peers check {node.name}`"
    nvidia = [g for g in node.gpus if g.vendor == "nvidia" and g.memory_total]
    if not nvidia:
        has = ", ".join(g.name for g in node.gpus) or "no GPU"
        return [], f"{node.name!r} has no NVIDIA GPU ({has}); {title} runs only on NVIDIA cards with CUDA"
    able = [g for g in nvidia if compute_capability(g) >= CUDA_MIN_CC]
    if not able:
        need = f"{CUDA_MIN_CC[0]}.{CUDA_MIN_CC[1]}"
        return [], f"{node.name!r} has no NVIDIA GPU of compute capability {need} or newer (Volta)"
    return sorted(able, key=lambda g: -(g.memory_total or 0)), None


def _usable_cards(nodes: Sequence[Node], *, engine: str, where: str) -> list[list[GPUInfo]]:
    """Each node's usable cards; MultiNodeRefused naming every untrusted link and every node without any."""
    reasons = [trust_refusal(n.name, engine=engine) for n in nodes[1:] if not n.trusted_network]
    cards: list[list[GPUInfo]] = []
    for node in nodes:
        found, why = _cards(node, engine=engine)
        cards.append(found)
        reasons += [why] if why else []
    _refuse(where, reasons)
    return cards


def _refuse(where: str, reasons: Sequence[str]) -> None:
    if reasons:
        raise MultiNodeRefused(f"{where}: " + "; ".join(reasons), reasons)


def _sizes(
    model: SafetensorsModel,
    *,
    nodes: int,
    per_node: int,
    layout: Layout,
    tensor_parallel: int | None,
    pipeline_parallel: int | None,
) -> tuple[int, int, list[str], list[str]]:
    """(tensor parallel, pipeline parallel, refusals, notes) for `nodes` machines of `per_node` cards."""
    layers = model.config.num_layers or 0
    notes: list[str] = []
    if tensor_parallel is not None or pipeline_parallel is not None:
        tp, pp = tensor_parallel or 1, pipeline_parallel or 1
    elif layout == "tensor":
        tp, pp = per_node * nodes, 1
    else:
        tp, pp = valid_tensor_parallel(model, per_node), nodes
        if tp < per_node:
            notes.append(
                f"{tp} of {per_node} GPUs per machine: the model's heads do not divide over {per_node}"
            )
    out: list[str] = []
    world = tp * pp
    local = world // nodes
    if tp < 1 or pp < 1:
        out.append(f"tensor parallel {tp} and pipeline parallel {pp} must be at least 1")
    elif world % nodes:
        out.append(
            f"tensor parallel {tp} x pipeline parallel {pp} = {world} GPUs do not divide over {nodes} "
            "machines; each machine runs the same number of GPUs"
        )
    elif local > per_node:
        out.append(f"each machine would run {local} GPUs, and one of them has only {per_node} usable")
    elif local % tp and tp % local:
        out.append(
            f"tensor parallel {tp} and {local} GPUs per machine: one must divide the other, so that each "
            "machine holds whole pipeline stages or an equal part of one"
        )
    problem = tensor_parallel_problem(model, tp) if tp >= 1 else None
    if problem:
        hint = (
            "; the pipeline layout (tensor parallel inside each machine) avoids it"
            if layout == "tensor"
            else ""
        )
        out.append(problem + hint)
    if pp > layers:
        out.append(f"pipeline parallel {pp} is more stages than the model's {layers} layers")
    return tp, pp, out, notes


def layer_partition(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per pipeline stage: an even split, the remainder on the stages before the last (the last also
    holds the output head), as vLLM and SGLang split by default."""
    parts = [layers // stages] * stages
    for i in range(2, layers % stages + 2):
        parts[-i] += 1
    return tuple(parts)


def stage_view(model: SafetensorsModel, *, partition: Sequence[int], stage: int) -> SafetensorsModel:
    """The part of `model` one pipeline stage holds, as a model gpu_share can plan: its layers (their
    sliding-window pattern kept), the decoder weights in proportion, the embeddings on the first stage and
    the output head on the last. Tied embeddings are one matrix in the checkpoint but a copy on each end."""
    if len(partition) == 1:
        return model
    c = model.config
    layers = sum(partition)
    first = sum(partition[:stage])
    last = first + partition[stage]
    embed = (c.vocab_size or 0) * (c.hidden_size or 0) * EMBED_BYTES
    body = max(0, weight_bytes(model) - embed * (1 if c.tie_word_embeddings else 2))
    stage_bytes = -(-body * partition[stage] // layers)
    stage_bytes += embed * ((stage == 0) + (stage == len(partition) - 1))
    kinds = _layer_types(model)
    config = dataclasses.replace(
        c,
        num_layers=partition[stage],
        layer_types=kinds[first:last] if kinds else (),
        sliding_window_pattern=None,
    )
    assert model.weights is not None  # weight_bytes refused a model without weights
    # weight_bytes halves F32 tensors of an fp32 checkpoint; stage_bytes already counts them served
    weights = dataclasses.replace(model.weights, total_bytes=stage_bytes, bytes_by_dtype=())
    return dataclasses.replace(model, config=config, weights=weights)


def _layer_types(model: SafetensorsModel) -> tuple[str, ...]:
    """Each layer's attention kind, where the config says it; gemma3-style periods written out (every p-th
    layer is the full-attention one) so a stage keeps its own layers' kinds."""
    c = model.config
    n = c.num_layers or 0
    if c.sliding_window and len(c.layer_types) == n:
        return c.layer_types
    if c.sliding_window and c.sliding_window_pattern and c.sliding_window_pattern > 1:
        p = c.sliding_window_pattern
        return tuple("full_attention" if (i + 1) % p == 0 else "sliding_attention" for i in range(n))
    return ()


def plan_multinode(
    model: SafetensorsModel,
    *,
    engine: str,
    model_id: str,
    nodes: Sequence[Node],
    settings: Settings,
    layout: Layout = "pipeline",
    tensor_parallel: int | None = None,
    pipeline_parallel: int | None = None,
    port: int | None = None,
    concurrency: int | None = None,
) -> MultiNodePlan:
    """One process per node for `model` on vLLM or SGLang across `nodes` (nodes[0]: the head, this
    machine). Raises MultiNodeRefused listing every reason (an untrusted link, a node without an NVIDIA
    GPU or without a probe, sizes that do not divide, a card that cannot hold its share)."""
    if engine not in TITLES:
        raise SettingsError(f"engine {engine!r} has no multi-node plan; use vllm or sglang")
    if len(nodes) < 2:
        raise SettingsError(
            "a multi-node plan needs two machines or more; one machine runs it as a local lane"
        )
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise SettingsError(f"each machine may be named once: {', '.join(names)}")
    where = f"cannot run {model_id!r} on {TITLES[engine]} across {', '.join(names)}"
    cards = _usable_cards(nodes, engine=engine, where=where)
    tp, pp, refused, notes = _sizes(
        model,
        nodes=len(nodes),
        per_node=min(len(c) for c in cards),
        layout=layout,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
    )
    _refuse(where, refused)
    partition = layer_partition(model.config.num_layers or 0, pp)
    length = max_model_len(model, settings, model_id)
    want = concurrency or int(settings.override(model_id, "parallel", settings.models.parallel))
    local = tp * pp // len(nodes)
    groups = [c[:local] for c in cards]
    # ranks are numbered tensor-first: node k holds ranks k x local .. and their pipeline stages
    stages = [tuple(sorted({r // tp for r in range(k * local, (k + 1) * local)})) for k in range(len(nodes))]
    shares: list[GPUShare] = []
    for node, group, held in zip(nodes, groups, stages, strict=True):
        try:
            shares.append(
                _node_share(
                    model,
                    node,
                    group,
                    stages=held,
                    partition=partition,
                    engine=engine,
                    tp=tp,
                    length=length,
                    want=want,
                    model_id=model_id,
                )
            )
        except GPUShareRefused as exc:
            refused.append(f"{node.name!r}: {exc}")
    _refuse(where, refused)
    extra = tuple(
        shlex.split(settings.cuda.vllm_extra_args if engine == "vllm" else settings.cuda.sglang_extra_args)
    )
    head = nodes[0]
    master = (head.address, port or (VLLM_MASTER_PORT if engine == "vllm" else SGLANG_DIST_PORT))
    launches = tuple(
        _launch(
            node,
            rank=rank,
            engine=engine,
            model_id=model_id,
            share=shares[rank],
            gpus=tuple(g.index for g in groups[rank]),
            stages=stages[rank],
            partition=partition,
            nnodes=len(nodes),
            pp=pp,
            master=master,
            extra=extra,
        )
        for rank, node in enumerate(nodes)
    )
    return MultiNodePlan(
        engine=engine,
        model_id=model_id,
        max_model_len=length,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        layer_partition=partition,
        master=master,
        nodes=launches,
        extra_args=extra,
        notes=tuple(notes),
    )


def _node_share(
    model: SafetensorsModel,
    node: Node,
    group: Sequence[GPUInfo],
    *,
    stages: Sequence[int],
    partition: Sequence[int],
    engine: str,
    tp: int,
    length: int,
    want: int,
    model_id: str,
) -> GPUShare:
    """The share each of the node's cards asks for: the largest of its stages' (one flag per process)."""
    gpu = min(group, key=lambda g: g.memory_total or 0)  # the smallest card bounds the flag
    total = gpu.memory_total or 1
    out: list[GPUShare] = []
    for stage in stages:
        name = f"{model_id} (stage {stage + 1} of {len(partition)}, on {node.name})"
        out.append(
            plan_gpu_share(
                stage_view(model, partition=partition, stage=stage),
                gpu,
                engine=share_rule(engine),
                max_model_len=length,
                reserved_by_others=min(0.99, node.promised / total),
                reserved_for=f"the GPU lanes already running on {node.name}",
                tensor_parallel=tp,
                concurrency=want,
                name=name,
            )
        )
    return max(out, key=lambda s: s.card_bytes)


def _launch(
    node: Node,
    *,
    rank: int,
    engine: str,
    model_id: str,
    share: GPUShare,
    gpus: tuple[int, ...],
    stages: tuple[int, ...],
    partition: tuple[int, ...],
    nnodes: int,
    pp: int,
    master: tuple[str, int],
    extra: tuple[str, ...],
) -> NodeLaunch:
    host, port = master
    ranks = ["--nnodes", str(nnodes), "--node-rank", str(rank)]
    args: list[str]
    if engine == "vllm":
        args = ["serve", node.model_path, "--served-model-name", model_id, *share.argv]
        args += ["--pipeline-parallel-size", str(pp), "--distributed-executor-backend", "mp", *ranks]
        args += ["--master-addr", host, "--master-port", str(port), *extra]
        args += ["--headless"] if rank else []
    else:
        rendezvous = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        args = ["-m", "sglang.launch_server", "--model-path", node.model_path]
        args += ["--served-model-name", model_id, *share.argv, "--pp-size", str(pp), *ranks]
        args += ["--dist-init-addr", rendezvous, *extra]
    env = {
        # NVML's order is PCI order; CUDA counts the same way, so the planned indexes are the ones used
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
        "HF_HUB_OFFLINE": "1",  # a local folder on every machine; nothing to fetch
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # the address the others reach this node at, not the first one the engine guesses
        ("VLLM_HOST_IP" if engine == "vllm" else "SGLANG_HOST_IP"): node.address,
    }
    if pp > 1:  # the split the budgets were planned for, not the engine's own
        env["VLLM_PP_LAYER_PARTITION" if engine == "vllm" else "SGLANG_PP_LAYER_PARTITION"] = ",".join(
            map(str, partition)
        )
    if node.interface:
        env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"] = node.interface
    first = sum(partition[: stages[0]])
    last = sum(partition[: stages[-1] + 1])
    headless = engine == "vllm" and rank > 0
    return NodeLaunch(
        node=node.name,
        rank=rank,
        engine=engine,
        model_path=node.model_path,
        args=tuple(args),
        env=env,
        gpus=gpus,
        stages=stages,
        layers=(first, last),
        serves_api=rank == 0,
        health_path=None if headless else "/health",
        card_bytes=share.card_bytes,
        fraction=share.fraction,
        share=json.loads(json.dumps(share.public())),  # as it travels: lists, not tuples
    )


# ---- on each node ---------------------------------------------------------------------------------------
def node_command(
    launch: NodeLaunch, *, settings: Settings, executable: str, port: int | None, ppid: int
) -> NodeCommand:
    """The process a node starts for its part: its guard (so the engine dies with that node's server),
    `executable` (that machine's `vllm`, or its Python for SGLang), the plan's words, and the API or
    health server on 127.0.0.1:`port` (none for a headless vLLM node). The environment is that machine's
    engine environment with the plan's additions over it."""
    argv = [*module_argv("app.lanes.guard"), str(ppid), "--", executable, *launch.args]
    served = launch.health_path is not None
    if served:
        if port is None:
            raise SettingsError(f"node {launch.node!r} serves {launch.health_path}: give it a port")
        argv += ["--host", "127.0.0.1", "--port", str(port)]
    env = settings_env(settings, kind=launch.engine) | launch.env
    if "NCCL_SOCKET_IFNAME" not in env:  # the head did not know it: this machine finds its own
        own = launch.env.get("VLLM_HOST_IP") or launch.env.get("SGLANG_HOST_IP")
        nic = interface_of(own) if own else None
        if nic:
            env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"] = nic
    return NodeCommand(
        argv=tuple(argv), env=env, port=port if served else None, health_path=launch.health_path
    )


def head_launch_plan(
    plan: MultiNodePlan, *, settings: Settings, executable: str, port: int, ppid: int
) -> LaunchPlan:
    """The head's process as a lane start: the API on `port`, ready when every node has joined (the
    engines answer /health only then). Its devices are this machine's cards; the other nodes' budgets
    are in the prediction's `nodes`."""
    head = plan.nodes[0]
    command = node_command(head, settings=settings, executable=executable, port=port, ppid=ppid)
    params = CudaParams(
        model_path=head.model_path,
        served_name=plan.model_id,
        engine=plan.engine,
        max_model_len=plan.max_model_len,
        tensor_parallel=plan.tensor_parallel,
        gpus=head.gpus,
        fraction=head.fraction,
        extra_args=plan.extra_args,
    )
    prediction = {
        "placement": f"{plan.engine} across {len(plan.nodes)} machines",
        "devices": [{"device": f"GPU{g}", "total": head.card_bytes} for g in head.gpus],
        "total": head.budget,
        "nodes": plan.public()["nodes"],
    }
    return LaunchPlan(
        runtime=plan.engine,
        argv=command.argv,
        env=command.env,
        health_path="/health",
        port=port,
        params=params,
        engine=plan.engine,
        api=ApiStyle.OPENAI,
        memory="fraction",
        prediction=prediction,
        notes=plan.notes,
    )
