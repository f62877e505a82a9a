"""Multi-node vLLM and SGLang (issue 34): the command line, environment and memory budget of each machine's
process for 2 and 4 machines, and the refusals (an untrusted link, no NVIDIA GPU, sizes that do not divide,
a card too small). No GPU is needed: the run itself waits for GPU machines (docs/peers.md).

The models are Llama-3-8B and Llama-3-70B shapes (real config.json facts and safetensors headers, built in
memory). The weights each stage holds are worked out here from the checkpoint's own tensors (layers, the
embeddings on the first stage, the norm and output head on the last), not read back from the module.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from app.core.errors import EngineUnavailableError, SettingsError
from app.core.settings import Settings, check_overrides
from app.fit.gpu_share import (
    ACT_WIDTHS,
    CUDA_CONTEXT,
    CUDA_GRAPHS,
    LOGIT_COPIES,
    NCCL_BUFFERS,
    WORKSPACE,
)
from app.fit.memory import MIB
from app.formats.safetensors_meta import SafetensorsModel, model_from_metadata
from app.hardware.model import GPUInfo
from app.lanes.engines.multinode import (
    MultiNodePlan,
    MultiNodeRefused,
    Node,
    NodeLaunch,
    gpus_of,
    head_launch_plan,
    interface_of,
    layer_partition,
    node_command,
    node_of_peer,
    plan_multinode,
    stage_view,
)
from app.lanes.engines.multinode_part import launch_refusals, node_process, own_flags
from app.lanes.engines.nodes_seam import launch_across, nodes_of, registered
from tests.support.modelgen import DTYPE_BYTES, LlamaDims, llama_tensors, safetensors_header

LLAMA3_8B = LlamaDims(n_layer=32, hidden=4096, heads=32, kv_heads=8, ff=14336, vocab=128256)
LLAMA3_70B = LlamaDims(n_layer=80, hidden=8192, heads=64, kv_heads=8, ff=28672, vocab=128256)
LENGTH = 8192  # max_position_embeddings of the config; ctx_size 0 asks for it
PARALLEL = Settings().models.parallel  # full-length requests each lane holds KV for
SETTINGS = Settings()


def model_of(dims: LlamaDims, **config: Any) -> SafetensorsModel:
    tensors = llama_tensors(dims)
    if config.get("tie_word_embeddings"):  # one matrix: the embeddings are the output head too
        del tensors["lm_head.weight"]
    built = model_from_metadata(
        dims.config(**config), [safetensors_header(tensors)], files=("m.safetensors",)
    )
    assert isinstance(built, SafetensorsModel), built
    return built


def part_bytes(dims: LlamaDims, prefix: str) -> int:
    return sum(
        math.prod(shape) * DTYPE_BYTES[dtype]
        for name, (dtype, shape) in llama_tensors(dims).items()
        if name.startswith(prefix)
    )


def stage_truth(dims: LlamaDims, partition: tuple[int, ...], stage: int) -> int:
    """The checkpoint bytes one pipeline stage loads: its layers, and the ends' embeddings/norm/head."""
    first = sum(partition[:stage])
    out = sum(part_bytes(dims, f"model.layers.{i}.") for i in range(first, first + partition[stage]))
    if stage == 0:
        out += part_bytes(dims, "model.embed_tokens.")
    if stage == len(partition) - 1:
        out += part_bytes(dims, "model.norm.") + part_bytes(dims, "lm_head.")
    return out


def card(index: int, mib: int, name: str, *, cc: str = "8.9", vendor: str = "nvidia") -> GPUInfo:
    return GPUInfo(
        index=index,
        vendor=vendor,  # type: ignore[arg-type]
        name=name,
        memory_total=mib * MIB,
        memory_free=(mib - 400) * MIB,
        memory_used=400 * MIB,
        driver_version="550.54.15",
        compute_capability=cc if vendor == "nvidia" else None,
        unified_memory=False,
        pci_bus_id=f"00000000:0{index + 1}:00.0",
        source="nvml" if vendor == "nvidia" else "sysfs",
    )


def rtx4060ti(index: int = 0) -> GPUInfo:
    return card(index, 16376, "NVIDIA GeForce RTX 4060 Ti")


def rtx4090(index: int = 0) -> GPUInfo:
    return card(index, 24564, "NVIDIA GeForce RTX 4090")


def machines(count: int, gpus: tuple[GPUInfo, ...], *, model: str = "llama") -> list[Node]:
    return [
        Node(
            name="desk" if i == 0 else f"gpu{i}",
            address=f"192.168.1.{10 + i}",
            gpus=gpus,
            model_path=f"/home/u{i}/models/{model}",
            trusted_network=True,
            interface="enp5s0" if i == 0 else f"eth{i}",
        )
        for i in range(count)
    ]


def value(args: tuple[str, ...], flag: str) -> str:
    assert args.count(flag) == 1, (flag, args)
    return args[args.index(flag) + 1]


def activations(dims: LlamaDims) -> int:
    """The profiled peak the plan counts: 2048 batched tokens of hidden-wide tensors, 256 logit rows."""
    return 2048 * dims.hidden * ACT_WIDTHS * 2 + 256 * dims.vocab * 4 * LOGIT_COPIES


def kv_per_request(dims: LlamaDims, *, layers: int, tp: int) -> int:
    """K and V of one 8192-token request on one card: its KV heads x head_dim x 2 tensors x 2 bytes."""
    return layers * LENGTH * (dims.kv_heads // tp) * dims.head_dim * 2 * 2


@pytest.fixture(scope="module")
def llama8b() -> SafetensorsModel:
    return model_of(LLAMA3_8B)


@pytest.fixture(scope="module")
def llama70b() -> SafetensorsModel:
    return model_of(LLAMA3_70B)


def check_stage_weights(plan: MultiNodePlan, dims: LlamaDims) -> None:
    """Each node's share holds its stage's checkpoint bytes split over tensor parallel; the plan spreads the
    final norm over the layers, so it may differ by that norm's bytes."""
    for launch in plan.nodes:
        (stage,) = launch.stages
        truth = stage_truth(dims, plan.layer_partition, stage) / plan.tensor_parallel
        assert abs(launch.share["weights"] - truth) <= dims.hidden * 2 + 2, (launch.node, truth)


# ---- vLLM --------------------------------------------------------------------------------------------------
def test_vllm_over_two_machines(llama8b: SafetensorsModel) -> None:
    """Llama-3-8B (16 GB) over two 16 GiB cards: one stage of 16 layers each, the head serves the API."""
    nodes = machines(2, (rtx4060ti(),), model="llama3-8b")
    plan = plan_multinode(llama8b, engine="vllm", model_id="meta/llama3-8b", nodes=nodes, settings=SETTINGS)
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.layer_partition) == (1, 2, (16, 16))
    assert plan.master == ("192.168.1.10", 29501)
    head, worker = plan.nodes
    assert head.args[:4] == ("serve", "/home/u0/models/llama3-8b", "--served-model-name", "meta/llama3-8b")
    assert worker.args[1] == "/home/u1/models/llama3-8b"  # each machine's own folder
    for rank, launch in enumerate(plan.nodes):
        args = launch.args
        assert value(args, "--tensor-parallel-size") == "1" and value(args, "--pipeline-parallel-size") == "2"
        assert value(args, "--nnodes") == "2" and value(args, "--node-rank") == str(rank)
        assert value(args, "--master-addr") == "192.168.1.10" and value(args, "--master-port") == "29501"
        assert value(args, "--distributed-executor-backend") == "mp"
        assert value(args, "--max-model-len") == str(LENGTH)
        assert ("--headless" in args) is (rank > 0)
        assert launch.env["VLLM_PP_LAYER_PARTITION"] == "16,16"
        assert launch.env["CUDA_VISIBLE_DEVICES"] == "0" and launch.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert launch.env["VLLM_HOST_IP"] == f"192.168.1.{10 + rank}"
        assert launch.env["NCCL_SOCKET_IFNAME"] == launch.env["GLOO_SOCKET_IFNAME"] == nodes[rank].interface
        assert launch.stages == (rank,) and launch.layers == (16 * rank, 16 * rank + 16)
    assert head.serves_api and head.health_path == "/health"
    assert not worker.serves_api and worker.health_path is None  # headless: the head's /health speaks
    check_stage_weights(plan, LLAMA3_8B)
    total = rtx4060ti().memory_total or 0
    for launch in plan.nodes:
        share = launch.share
        kv = kv_per_request(LLAMA3_8B, layers=16, tp=1)
        assert share["kv_per_request"] == kv  # 8192 tokens are whole 16-token blocks
        # vLLM: weights, activations, workspace and the KV of every request inside the flag (whole
        # percents of the card's total); CUDA context and graphs outside it
        pct = math.ceil((share["weights"] + activations(LLAMA3_8B) + WORKSPACE + PARALLEL * kv) * 100 / total)
        assert value(launch.args, "--gpu-memory-utilization") == f"{pct / 100:.2f}"
        assert launch.card_bytes == CUDA_CONTEXT + CUDA_GRAPHS + pct * total // 100 == launch.budget
        assert launch.card_bytes < total
    assert plan.total_bytes == head.budget + worker.budget
    # untied: the two stages together load the checkpoint once (the even split rounds up a byte each)
    assert (
        0
        <= head.share["weights"]
        + worker.share["weights"]
        - (llama8b.weights.total_bytes if llama8b.weights else 0)
        <= 2
    )


def test_vllm_over_four_machines(llama70b: SafetensorsModel) -> None:
    """Llama-3-70B (141 GB) over four machines of two 24 GiB cards: tensor parallel 2 inside each machine,
    one stage of 20 layers on each; a machine with a third, smaller card runs its two largest."""
    nodes = machines(4, (rtx4090(0), rtx4090(1)), model="llama3-70b")
    nodes[2] = dataclasses.replace(nodes[2], gpus=(rtx4060ti(0), rtx4090(1), rtx4090(2)))
    plan = plan_multinode(llama70b, engine="vllm", model_id="llama3-70b", nodes=nodes, settings=SETTINGS)
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.layer_partition) == (2, 4, (20, 20, 20, 20))
    assert [n.gpus for n in plan.nodes] == [(0, 1), (0, 1), (1, 2), (0, 1)]
    assert plan.nodes[2].env["CUDA_VISIBLE_DEVICES"] == "1,2"
    for rank, launch in enumerate(plan.nodes):
        assert value(launch.args, "--tensor-parallel-size") == "2"
        assert value(launch.args, "--pipeline-parallel-size") == "4"
        assert value(launch.args, "--node-rank") == str(rank) and value(launch.args, "--nnodes") == "4"
        assert ("--headless" in launch.args) is (rank > 0)
        assert launch.env["VLLM_PP_LAYER_PARTITION"] == "20,20,20,20"
        assert launch.stages == (rank,) and launch.layers == (20 * rank, 20 * rank + 20)
        kv = kv_per_request(LLAMA3_70B, layers=20, tp=2)
        assert launch.share["kv_per_request"] == kv
        total = rtx4090().memory_total or 0
        pct = math.ceil(
            (launch.share["weights"] + activations(LLAMA3_70B) + WORKSPACE + PARALLEL * kv) * 100 / total
        )
        # tensor parallel adds NCCL's buffers beside the CUDA context
        assert launch.card_bytes == CUDA_CONTEXT + NCCL_BUFFERS + CUDA_GRAPHS + pct * total // 100
        assert launch.budget == 2 * launch.card_bytes
    check_stage_weights(plan, LLAMA3_70B)
    # the 70B model is 141 GB; the four machines hold it, each card under its 24 GiB
    assert all(n.card_bytes < (rtx4090().memory_total or 0) for n in plan.nodes)
    assert plan.total_bytes == sum(n.budget for n in plan.nodes) > 141 * 10**9


# ---- SGLang ------------------------------------------------------------------------------------------------
def check_sglang(plan: MultiNodePlan, dims: LlamaDims, gpu: GPUInfo) -> None:
    nnodes, pp, tp = len(plan.nodes), plan.pipeline_parallel, plan.tensor_parallel
    for rank, launch in enumerate(plan.nodes):
        args = launch.args
        assert args[:4] == ("-m", "sglang.launch_server", "--model-path", f"/home/u{rank}/models/llama")
        assert value(args, "--served-model-name") == plan.model_id
        assert value(args, "--tp-size") == str(tp) and value(args, "--pp-size") == str(pp)
        assert value(args, "--nnodes") == str(nnodes) and value(args, "--node-rank") == str(rank)
        assert value(args, "--dist-init-addr") == "192.168.1.10:29500"
        assert value(args, "--context-length") == str(LENGTH)
        assert "--headless" not in args and "--master-addr" not in args
        assert launch.env["SGLANG_PP_LAYER_PARTITION"] == ",".join(map(str, plan.layer_partition))
        assert launch.env["SGLANG_HOST_IP"] == f"192.168.1.{10 + rank}"
        assert "VLLM_HOST_IP" not in launch.env and "VLLM_PP_LAYER_PARTITION" not in launch.env
        # every SGLang node answers /health on its own port (the others once their ranks are ready)
        assert launch.health_path == "/health" and launch.serves_api is (rank == 0)
        layers = plan.layer_partition[rank]
        kv = PARALLEL * kv_per_request(dims, layers=layers, tp=tp)
        # SGLang's pool holds every token in every layer, capped at the planned tokens
        assert (
            value(args, "--max-total-tokens")
            == str(PARALLEL * LENGTH)
            == str(launch.share["max_total_tokens"])
        )
        assert launch.share["kv_cache"] == kv
        context = CUDA_CONTEXT + (NCCL_BUFFERS if tp > 1 else 0)
        outside = context + activations(dims) + WORKSPACE + CUDA_GRAPHS
        assert launch.card_bytes == outside + launch.share["weights"] + kv
        # the flag multiplies what is free after its CUDA context, and covers weights and KV
        basis = (gpu.memory_total or 0) - context
        fraction = float(value(args, "--mem-fraction-static"))
        assert fraction == launch.fraction and fraction * basis >= launch.share["weights"] + kv
    check_stage_weights(plan, dims)


def test_sglang_over_two_machines(llama8b: SafetensorsModel) -> None:
    plan = plan_multinode(
        llama8b, engine="sglang", model_id="llama3-8b", nodes=machines(2, (rtx4060ti(),)), settings=SETTINGS
    )
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.layer_partition) == (1, 2, (16, 16))
    assert plan.master == ("192.168.1.10", 29500)
    check_sglang(plan, LLAMA3_8B, rtx4060ti())


def test_sglang_over_four_machines(llama70b: SafetensorsModel) -> None:
    nodes = machines(4, (rtx4090(0), rtx4090(1)))
    plan = plan_multinode(llama70b, engine="sglang", model_id="llama3-70b", nodes=nodes, settings=SETTINGS)
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.layer_partition) == (2, 4, (20, 20, 20, 20))
    check_sglang(plan, LLAMA3_70B, rtx4090())


def test_the_tensor_layout_splits_every_layer_over_all_machines(llama8b: SafetensorsModel) -> None:
    """Asked for: tensor parallel 4 over four single-card machines, one stage holding all 32 layers."""
    nodes = machines(4, (rtx4060ti(),))
    plan = plan_multinode(
        llama8b, engine="sglang", model_id="m", nodes=nodes, settings=SETTINGS, layout="tensor"
    )
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.layer_partition) == (4, 1, (32,))
    for launch in plan.nodes:
        assert value(launch.args, "--tp-size") == "4" and value(launch.args, "--pp-size") == "1"
        assert launch.stages == (0,) and launch.layers == (0, 32)
        assert "SGLANG_PP_LAYER_PARTITION" not in launch.env  # one stage: nothing to split
        assert launch.share["kv_per_request"] == kv_per_request(LLAMA3_8B, layers=32, tp=4)
        truth = stage_truth(LLAMA3_8B, (32,), 0) / 4
        assert abs(launch.share["weights"] - truth) <= 1


# ---- on each machine ---------------------------------------------------------------------------------------
def test_each_machine_runs_its_part_under_its_guard(llama8b: SafetensorsModel) -> None:
    nodes = machines(2, (rtx4060ti(),))
    settings = Settings().with_changes(engine_env={"vllm": {"NCCL_DEBUG": "INFO"}})
    plan = plan_multinode(llama8b, engine="vllm", model_id="m", nodes=nodes, settings=settings)
    head, worker = plan.nodes
    cmd = node_command(head, settings=settings, executable="/opt/vllm/bin/vllm", port=8123, ppid=4242)
    guard = (sys.executable, "-m", "app.lanes.guard", "4242", "--")
    assert cmd.argv[:5] == guard and cmd.argv[5] == "/opt/vllm/bin/vllm"
    assert cmd.argv[6 : 6 + len(head.args)] == head.args
    assert cmd.argv[-4:] == ("--host", "127.0.0.1", "--port", "8123")
    assert (cmd.port, cmd.health_path) == (8123, "/health")
    assert cmd.env["NCCL_DEBUG"] == "INFO"  # the user's engine environment, with the plan's over it
    assert cmd.env["VLLM_PP_LAYER_PARTITION"] == "16,16"
    headless = node_command(worker, settings=settings, executable="vllm", port=None, ppid=1)
    assert "--port" not in headless.argv and headless.port is None and headless.health_path is None
    lane = head_launch_plan(plan, settings=settings, executable="/opt/vllm/bin/vllm", port=8123, ppid=4242)
    assert lane.argv == cmd.argv and lane.port == 8123 and lane.health_path == "/health"
    assert lane.memory == "fraction" and lane.params.model_path == "/home/u0/models/llama"
    assert lane.params.tensor_parallel == 1 and lane.params.gpus == (0,)
    predicted = lane.predicted()
    assert predicted is not None
    assert predicted["devices"] == [{"device": "GPU0", "total": head.card_bytes}]  # this machine's card only
    assert [n["node"] for n in predicted["nodes"]] == ["desk", "gpu1"]
    assert [n["budget"] for n in predicted["nodes"]] == [head.budget, worker.budget]
    sglang = plan_multinode(llama8b, engine="sglang", model_id="m", nodes=nodes, settings=settings)
    with pytest.raises(SettingsError, match="give it a port"):  # an SGLang worker answers /health
        node_command(sglang.nodes[1], settings=settings, executable=sys.executable, port=None, ppid=1)


def test_a_launch_travels_as_json(llama70b: SafetensorsModel) -> None:
    """The head sends each machine its part over the peer link: JSON there and back is the same launch."""
    plan = plan_multinode(
        llama70b, engine="vllm", model_id="m", nodes=machines(4, (rtx4090(0), rtx4090(1))), settings=SETTINGS
    )
    for launch in plan.nodes:
        assert NodeLaunch.from_json(json.loads(json.dumps(launch.public()))) == launch
    doc = json.loads(json.dumps(plan.public()))
    assert doc["master"] == "192.168.1.10:29501" and doc["total"] == plan.total_bytes
    assert [n["rank"] for n in doc["nodes"]] == [0, 1, 2, 3]


def test_a_peer_becomes_a_node() -> None:
    """A peer as a node from plain fields (the engines never see the peers' store): its GPUs from its own
    probe, as /peer/info sends it."""
    probe = {"gpus": [rtx4090(0).public(), card(1, 8192, "AMD Radeon RX 7600", vendor="amd").public()]}
    node = node_of_peer(
        "gpu1",
        address="192.168.1.11",
        hardware=json.loads(json.dumps(probe)),
        trusted_network=True,
        model_path="/m",
    )
    assert (node.name, node.address, node.trusted_network, node.model_path) == (
        "gpu1",
        "192.168.1.11",
        True,
        "/m",
    )
    assert node.gpus == (rtx4090(0), card(1, 8192, "AMD Radeon RX 7600", vendor="amd"))
    bare = node_of_peer("gpu1", address="h", hardware=None, trusted_network=False, model_path="/m")
    assert bare.gpus is None and not bare.trusted_network
    assert gpus_of({"gpus": "garbled"}) is None


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the loopback interface is named lo on Linux"
)
def test_a_machine_finds_its_own_interface(llama8b: SafetensorsModel) -> None:
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.77") is None  # TEST-NET-1: held by no interface here
    # the head did not know a machine's interface: that machine names its own from its address
    nodes = [dataclasses.replace(n, interface=None) for n in machines(2, (rtx4060ti(),))]
    nodes[0] = dataclasses.replace(nodes[0], address="192.0.2.10")  # documentation-only: held by none
    nodes[1] = dataclasses.replace(nodes[1], address="127.0.0.1")
    plan = plan_multinode(llama8b, engine="sglang", model_id="m", nodes=nodes, settings=SETTINGS)
    assert "NCCL_SOCKET_IFNAME" not in plan.nodes[1].env
    env = node_command(plan.nodes[1], settings=SETTINGS, executable="python", port=9, ppid=1).env
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "lo"
    head = node_command(plan.nodes[0], settings=SETTINGS, executable="python", port=9, ppid=1).env
    assert "NCCL_SOCKET_IFNAME" not in head  # no interface holds it here: left to NCCL


def test_the_layer_split_follows_the_engines_rule() -> None:
    """An even split, the remainder on the stages before the last (which also holds the output head)."""
    assert layer_partition(32, 2) == (16, 16)
    assert layer_partition(80, 3) == (27, 27, 26)
    assert layer_partition(7, 4) == (2, 2, 2, 1)
    assert layer_partition(5, 1) == (5,)


def test_a_stage_keeps_its_own_layers_kinds_and_tied_embeddings_on_both_ends() -> None:
    dims = LlamaDims(n_layer=8, hidden=256, heads=4, kv_heads=2, ff=512, vocab=1000)
    kinds = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"] * 2
    tied = model_of(dims, sliding_window=64, layer_types=kinds, tie_word_embeddings=True)
    first = stage_view(tied, partition=(5, 3), stage=0)
    last = stage_view(tied, partition=(5, 3), stage=1)
    assert first.config.num_layers == 5 and first.config.layer_types == tuple(kinds[:5])
    assert last.config.num_layers == 3 and last.config.layer_types == tuple(kinds[5:])
    embed = dims.vocab * dims.hidden * 2
    assert first.weights is not None and last.weights is not None and tied.weights is not None
    # the checkpoint's one embedding matrix is loaded on the first stage, and again as the last's head
    body = tied.weights.total_bytes - embed
    both = first.weights.total_bytes + last.weights.total_bytes
    assert body + 2 * embed <= both <= body + 2 * embed + 1  # each stage's share of the body rounds up
    assert stage_view(tied, partition=(8,), stage=0) is tied


# ---- refusals ----------------------------------------------------------------------------------------------
def refused(model: SafetensorsModel, nodes: list[Node], **kw: Any) -> MultiNodeRefused:
    with pytest.raises(MultiNodeRefused) as caught:
        plan_multinode(
            model, engine=kw.pop("engine", "vllm"), model_id="m", nodes=nodes, settings=SETTINGS, **kw
        )
    assert isinstance(caught.value, EngineUnavailableError)
    return caught.value


def test_an_untrusted_network_is_refused_with_the_command_that_marks_it(llama8b: SafetensorsModel) -> None:
    nodes = machines(3, (rtx4060ti(),))
    nodes[1] = dataclasses.replace(nodes[1], trusted_network=False)
    nodes[2] = dataclasses.replace(nodes[2], gpus=(card(0, 8192, "AMD Radeon RX 7600", vendor="amd"),))
    for engine, title in (("vllm", "vLLM"), ("sglang", "SGLang")):
        err = refused(llama8b, nodes, engine=engine)
        assert len(err.reasons) == 2  # every reason, not only the first
        untrusted, no_nvidia = err.reasons
        assert "network to 'gpu1' is not marked as trusted" in untrusted
        assert f"{title} sends tensors between machines unencrypted" in untrusted
        assert "`switchyard peers trust gpu1 --network`" in untrusted
        assert "'gpu2' has no NVIDIA GPU (AMD Radeon RX 7600)" in no_nvidia
        assert str(err).startswith(f"cannot run 'm' on {title} across desk, gpu1, gpu2: ")
    # the head is this machine: its own flag is not asked for
    head_flag = machines(2, (rtx4060ti(),))
    head_flag[0] = dataclasses.replace(head_flag[0], trusted_network=False)
    plan_multinode(llama8b, engine="vllm", model_id="m", nodes=head_flag, settings=SETTINGS)


def test_a_machine_without_a_usable_nvidia_gpu_is_refused(llama8b: SafetensorsModel) -> None:
    nodes = machines(3, (rtx4060ti(),))
    nodes[1] = dataclasses.replace(nodes[1], gpus=None)
    nodes[2] = dataclasses.replace(nodes[2], gpus=(card(0, 11264, "NVIDIA GeForce GTX 1080 Ti", cc="6.1"),))
    reasons = refused(llama8b, nodes).reasons
    assert reasons[0] == "'gpu1' has not reported its hardware; run `switchyard peers check gpu1`"
    assert reasons[1] == "'gpu2' has no NVIDIA GPU of compute capability 7.0 or newer (Volta)"
    bare = machines(2, ())
    assert "'desk' has no NVIDIA GPU (no GPU)" in refused(llama8b, bare).reasons[0]


def test_sizes_that_do_not_divide_are_refused(llama8b: SafetensorsModel) -> None:
    two = machines(2, (rtx4060ti(),))
    assert "tensor parallel 1 x pipeline parallel 3 = 3 GPUs do not divide over 2 machines" in str(
        refused(llama8b, two, tensor_parallel=1, pipeline_parallel=3)
    )
    uneven = machines(2, (rtx4060ti(0), rtx4060ti(1)))
    uneven[1] = dataclasses.replace(uneven[1], gpus=(rtx4060ti(0),))
    assert "each machine would run 2 GPUs, and one of them has only 1 usable" in str(
        refused(llama8b, uneven, tensor_parallel=2, pipeline_parallel=2)
    )
    three = machines(3, (rtx4060ti(),))
    err = refused(llama8b, three, layout="tensor")  # tensor parallel 3 over 32 heads
    assert "tensor parallel size 3 does not divide the model's 32 attention heads" in str(err)
    assert "the pipeline layout (tensor parallel inside each machine) avoids it" in str(err)
    wide = machines(2, tuple(rtx4060ti(i) for i in range(6)))
    assert "tensor parallel 4 and 6 GPUs per machine: one must divide the other" in str(
        refused(llama8b, wide, tensor_parallel=4, pipeline_parallel=3)
    )
    tiny = model_of(LlamaDims(n_layer=2, hidden=256, heads=4, kv_heads=2, ff=512, vocab=1000))
    assert "pipeline parallel 4 is more stages than the model's 2 layers" in str(
        refused(tiny, machines(4, (rtx4060ti(),)))
    )
    with pytest.raises(SettingsError, match="two machines or more"):
        plan_multinode(llama8b, engine="vllm", model_id="m", nodes=two[:1], settings=SETTINGS)
    with pytest.raises(SettingsError, match="no multi-node plan"):
        plan_multinode(llama8b, engine="llama.cpp", model_id="m", nodes=two, settings=SETTINGS)


def test_the_heads_that_do_not_divide_use_fewer_cards_per_machine() -> None:
    """Six cards per machine and 32 heads: tensor parallel 4 on each, the plan says why."""
    plan = plan_multinode(
        model_of(LLAMA3_8B),
        engine="vllm",
        model_id="m",
        nodes=machines(2, tuple(rtx4060ti(i) for i in range(6))),
        settings=SETTINGS,
    )
    assert (plan.tensor_parallel, plan.pipeline_parallel) == (4, 2)
    assert any("4 of 6 GPUs per machine" in n for n in plan.notes)


def test_a_card_too_small_for_its_stage_is_refused_with_the_numbers(llama70b: SafetensorsModel) -> None:
    """Llama-3-70B over two single 24 GiB cards: 70 GB per stage cannot fit; both machines say so."""
    err = refused(llama70b, machines(2, (rtx4090(),)))
    assert len(err.reasons) == 2
    assert err.reasons[0].startswith("'desk': m (stage 1 of 2, on desk) needs ")
    assert err.reasons[1].startswith("'gpu1': m (stage 2 of 2, on gpu1) needs ")
    assert "for weights" in err.reasons[0]


# ---- a launch a peer sent: this machine's own checks -------------------------------------------------------
def test_a_node_checks_a_sent_launch_on_its_own(llama8b: SafetensorsModel) -> None:
    """What a peer checks before it runs a head's launch, whatever the head says: every reason at once."""
    plan = plan_multinode(
        llama8b, engine="vllm", model_id="m", nodes=machines(2, (rtx4090(),)), settings=SETTINGS
    )
    part = plan.nodes[1]
    library = {part.model_path}
    assert launch_refusals(part, library=library, gpus=(rtx4090(),)) == []
    # the head's own rank, another folder, a variable beyond the plan's, no such card: all named
    bad = dataclasses.replace(part, rank=0, env={**part.env, "LD_PRELOAD": "/tmp/x.so"}, gpus=(0, 3))
    said = launch_refusals(bad, library=library, gpus=(rtx4090(),))
    assert len(said) == 3, said
    assert "rank 0 is the head's own process" in said[0]
    assert "sets LD_PRELOAD, which no multi-node plan sets" in said[1]
    assert "asks for GPU 3 and this machine has NVIDIA GPU 0" in said[2]
    elsewhere = launch_refusals(part, library={"/srv/models/m"}, gpus=(rtx4090(),))
    assert elsewhere == [
        f"{part.model_path!r} is not a model folder of this machine's library: every machine of a multi-node "
        "model needs the same model files in its own library (pull it here first)"
    ]
    # the words after the program must start the engine's server on that folder, nothing else
    other = dataclasses.replace(part, args=("bench", *part.args[1:]))
    assert (
        "does not start vLLM's server on that folder"
        in launch_refusals(other, library=library, gpus=(rtx4090(),))[0]
    )
    # this machine's card, read now: too little free for the part, or no NVIDIA card at all
    busy = dataclasses.replace(rtx4090(), memory_free=512 * MIB)
    (short,) = launch_refusals(part, library=library, gpus=(busy,))
    assert short.startswith(
        f"GPU 0 (NVIDIA GeForce RTX 4090) has 512 MiB free and this part needs {part.card_bytes // MIB} MiB"
    )
    (none,) = launch_refusals(part, library=library, gpus=(), gpu_note="NVML: Driver Not Loaded")
    assert none == (
        "this machine has no NVIDIA GPU (NVML: Driver Not Loaded); vLLM runs only on NVIDIA cards with CUDA"
    )
    assert launch_refusals(dataclasses.replace(part, engine="llama.cpp"), library=library, gpus=()) == [
        "engine 'llama.cpp' has no multi-node part; a launch names vllm or sglang"
    ]


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed here")
def test_a_node_without_the_engine_says_what_to_install(llama8b: SafetensorsModel, isolated_env: Any) -> None:
    plan = plan_multinode(
        llama8b, engine="sglang", model_id="m", nodes=machines(2, (rtx4090(),)), settings=SETTINGS
    )
    with pytest.raises(
        EngineUnavailableError,
        match="SGLang is not installed on this machine: sglang is not installed: switchyard engine install",
    ):
        node_process(plan.nodes[1], settings=SETTINGS, port=9, ppid=1)


def test_a_model_across_peers_needs_the_server_that_holds_them() -> None:
    """`nodes` in a model's overrides; without a running server's broker registered, a start says so."""
    check_overrides("m", {"nodes": ["desk", "laptop"]})
    with pytest.raises(SettingsError, match=r"\['nodes'\] must be a list of paired peers' names"):
        check_overrides("m", {"nodes": ["desk", 4]})
    settings = SETTINGS.with_changes(model_overrides={"m": {"nodes": "desk, laptop"}})
    assert nodes_of(settings, "m") == ("desk", "laptop") and nodes_of(SETTINGS, "m") == ()
    assert registered() is None
    entry = SimpleNamespace(id="m")
    with pytest.raises(
        EngineUnavailableError, match=r"only a running `switchyard serve --tls` with those peers"
    ):
        launch_across("vllm", entry, settings, None, ("desk", "laptop"))  # type: ignore[arg-type]


def test_a_node_takes_only_the_plans_options_and_its_own(llama8b: SafetensorsModel) -> None:
    """The head's extra args reach a peer's part, but an option outside the plan's and the sizing ones (one
    that can load code or read files) runs there only if that machine's own extra args name it too."""
    for engine, key, sizing in (
        ("vllm", "vllm_extra_args", "--enforce-eager"),
        ("sglang", "sglang_extra_args", "--disable-cuda-graph"),
    ):
        extra = {key: f"--trust-remote-code {sizing}"}
        head = dataclasses.replace(SETTINGS, cuda=dataclasses.replace(SETTINGS.cuda, **extra))
        plan = plan_multinode(
            llama8b, engine=engine, model_id="m", nodes=machines(2, (rtx4090(),)), settings=head
        )
        part = plan.nodes[1]
        library = {part.model_path}
        assert "--trust-remote-code" in part.args
        (said,) = launch_refusals(part, library=library, gpus=(rtx4090(),))
        assert said == (
            "the launch passes --trust-remote-code, which this machine does not take from another (such "
            "an option can load code or read files here): to allow it, add it to this machine's own "
            f"cuda.{key} too"
        )
        # the same option in this machine's own settings: allowed; `--name=value` spellings are read too
        mine = own_flags(head, engine)
        assert launch_refusals(part, library=library, gpus=(rtx4090(),), own_flags=mine) == []
        sneaky = dataclasses.replace(part, args=(*part.args, "--worker-cls=evil.Worker"))
        assert (
            "passes --worker-cls,"
            in launch_refusals(sneaky, library=library, gpus=(rtx4090(),), own_flags=mine)[0]
        )
        # everything the plan itself writes passes, extra args or not
        plain = plan_multinode(
            llama8b, engine=engine, model_id="m", nodes=machines(2, (rtx4090(),)), settings=SETTINGS
        )
        assert launch_refusals(plain.nodes[1], library={plain.nodes[1].model_path}, gpus=(rtx4090(),)) == []
