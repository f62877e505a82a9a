"""Speed calibration per device on a machine with an NVIDIA card (docs/fit.md#speed): the GPU's factor
from its own measurements and bandwidth, full and split placements, and devices nothing was measured on.

No card runs here, so the GPU's measurements are recorded ones: llama.cpp's llama-bench on an RTX 4090
(CUDA, every layer offloaded), CodeLlama 7B in F16 and Q8_0, as posted by ggerganov in
https://github.com/ggml-org/llama.cpp/pull/4766 (2024-01-10): tg 128 61.03 and 98.13 tokens/s, pp 512
11048.22 and 7664.00. The layouts below have that model's shapes and tensor types; their sizes match the
12.55 and 6.67 GiB the same run printed. The 4090's bandwidth is what its NVML facts give (a 384-bit bus
at a 10501 MHz memory clock, double data rate). The CPU rows are illustrative figures for this
machine's 80 GiB/s copy bandwidth (tests/fit/test_fit.py `machine`), not a recording.

Also: the card's bandwidth read through NVML (tests/hardware/test_probe.py's fake module, with the memory bus
and clock queries added), the device a load's answers are filed under (CPU, GPU, or GPU+CPU for a split),
and `explain` listing every calibrated device.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pynvml
import pytest

from app.advice.doctor import render_doctor
from app.advice.explain import SPLIT, entry_for_path, explain, render, speed_device
from app.advice.inputs import AdviceInputs
from app.core.paths import Paths
from app.core.settings import Settings
from app.fit.memory import FitParams
from app.fit.plan import (
    CPU,
    GIB,
    GPU,
    Budget,
    FitReport,
    SpeedCalibration,
    bandwidth_bound,
    calibrated,
    device_bandwidths,
    plan_placements,
    rate,
)
from app.formats.gguf_layout import GGUFLayout, read_gguf_layout
from app.hardware.model import GPUInfo, Hardware
from app.hardware.nvidia import read_nvidia
from app.lanes.engines.plan import LaunchPlan
from app.lanes.engines.registry import calibrating_lanes
from app.lanes.lane import Lane
from app.lanes.proc import LogRing
from app.lanes.supervisor import Supervisor
from app.library.db import Database
from app.library.opening import open_catalog
from app.library.speeds import LoadKey, Speed, SpeedStore, calibrate
from app.library.store import Library
from app.runtime import Runtime
from tests.hardware.test_probe import A100_80, H100_A, RTX_4090, Card, FakeNVML
from tests.support.machines import machine, nvidia, unified_gpu
from tests.support.tinymodels import LARGE, write_tiny_gguf

CALIBRATING = calibrating_lanes()  # the lanes whose measured speeds calibrate the model

RTX_4090_READ = 384 / 8 * 10_501e6 * 2  # bytes/s the card reads: bus width x memory clock x 2 transfers
RTX_4090_BW = 2 * RTX_4090_READ  # on the CPU's copy scale (reads plus writes), as device_bandwidths gives it
MEASURED_4090 = {"f16": (11048.22, 61.03), "q8_0": (7664.00, 98.13)}  # (prompt, generation) tok/s
CTX = FitParams(ctx_size=512)  # llama-bench's tg 128 runs on a near-empty context
N_LAYER, N_EMBD, N_FF, VOCAB = 32, 4096, 11008, 32016


def _bytes(elements: int, tensor_type: str) -> int:
    return elements * 2 if tensor_type == "f16" else elements // 32 * 34  # q8_0: 34 bytes a 32-block


def codellama_7b(base: GGUFLayout, tensor_type: str) -> GGUFLayout:
    """CodeLlama 7B's shapes: 32 layers, 32 KV heads of 128, FFN 11008, vocab 32016; norms in f32."""
    layer = _bytes(4 * N_EMBD * N_EMBD + 3 * N_EMBD * N_FF, tensor_type) + 2 * N_EMBD * 4
    embd = _bytes(VOCAB * N_EMBD, tensor_type)
    return dataclasses.replace(
        base,
        block_count=N_LAYER,
        embedding_length=N_EMBD,
        vocab_size=VOCAB,
        head_count=(32,) * N_LAYER,
        head_count_kv=(32,) * N_LAYER,
        feed_forward_length=(N_FF,) * N_LAYER,
        key_length=128,
        value_length=128,
        kv_layers=(True,) * N_LAYER,
        swa_layers=(False,) * N_LAYER,
        sliding_window=None,
        expert_count=None,
        expert_used_count=None,
        layer_bytes=(layer,) * N_LAYER,
        token_embd_bytes=embd,
        output_bytes=embd + N_EMBD * 4,
        other_bytes=0,
        context_length=16384,
        file_type=f"mostly_{tensor_type}",
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GGUFLayout]:
    base = read_gguf_layout(write_tiny_gguf(tmp_path_factory.mktemp("gpu") / "base.gguf", LARGE))
    assert isinstance(base, GGUFLayout)
    out = {t: codellama_7b(base, t) for t in MEASURED_4090}
    for t, gib in (("f16", 12.55), ("q8_0", 6.67)):  # the sizes llama-bench printed for these files
        lay = out[t]
        size = sum(lay.layer_bytes) + lay.token_embd_bytes + lay.output_bytes
        assert round(size / GIB, 2) == gib, (t, size / GIB)
    return out


RTX_4090_MACHINE = machine(
    ram_gib=64, gpus=(dataclasses.replace(nvidia(24564), memory_bandwidth=RTX_4090_READ),)
)
CPU_BW = float(RTX_4090_MACHINE.bandwidth.all_cores) if RTX_4090_MACHINE.bandwidth else 0.0
BANDWIDTHS = {CPU: CPU_BW, GPU: RTX_4090_BW}  # what device_bandwidths says for this machine (tested below)


def _plan(lay: GGUFLayout, *, gpu_layers: int | None = None, gpus: bool = True) -> FitReport:
    hw = RTX_4090_MACHINE if gpus else machine(ram_gib=64)
    return plan_placements(lay, hw, params=CTX, budget=Budget.of(hw), gpu_layers=gpu_layers)


def _bpt(lay: GGUFLayout) -> int:
    """What the recorder files with a row: the chosen placement's bytes per token."""
    chosen = _plan(lay).chosen
    assert chosen is not None and chosen.bytes_per_token
    return chosen.bytes_per_token


@pytest.fixture(scope="module")
def gpu_rows(models: dict[str, GGUFLayout]) -> list[Speed]:
    return [
        Speed(f"codellama-7b-{t}", "llama.cpp", GPU, p, g, _bpt(models[t]), 9, 0.0)
        for t, (p, g) in MEASURED_4090.items()
    ]


@pytest.fixture(scope="module")
def cpu_rows(models: dict[str, GGUFLayout]) -> list[Speed]:
    # illustrative: about 0.7 of this machine's CPU bound for the Q8_0 file, 0.75 for the F16 one
    return [
        Speed("codellama-7b-q8_0", "llama.cpp", CPU, 40.0, 4.2, _bpt(models["q8_0"]), 9, 0.0),
        Speed("codellama-7b-f16", "llama.cpp", CPU, 30.0, 2.4, _bpt(models["f16"]), 9, 0.0),
    ]


def test_the_gpu_factor_comes_from_its_own_rows_and_bandwidth(
    gpu_rows: list[Speed], cpu_rows: list[Speed]
) -> None:
    cals = calibrate([*cpu_rows, *gpu_rows], lanes=CALIBRATING, bandwidth=BANDWIDTHS)
    assert set(cals) == {CPU, GPU}
    gpu = cals[GPU]
    # by hand: each model's tokens/s over (half the card's bandwidth / the bytes it reads a token)
    by_hand = statistics.median(s.gen_tps * (s.bytes_per_token or 0) / (RTX_4090_BW / 2) for s in gpu_rows)
    assert gpu.efficiency == pytest.approx(by_hand) and gpu.models == 2 and gpu.bandwidth == RTX_4090_BW
    assert gpu.per_token_s == 0  # no model under 16 MiB a token measured on the card
    assert 0.6 < gpu.efficiency < 0.9  # the reads reach 70-80 % of the card's figure
    # the CPU's rows and bandwidth play no part in it, and the GPU's none in the CPU's
    assert calibrate(gpu_rows, lanes=CALIBRATING, bandwidth=BANDWIDTHS) == {GPU: gpu}
    assert (
        calibrate([*cpu_rows, *gpu_rows], lanes=CALIBRATING, bandwidth={CPU: CPU_BW * 4, GPU: RTX_4090_BW})[
            GPU
        ]
        == gpu
    )
    assert cals[CPU] == calibrate(cpu_rows, lanes=CALIBRATING, bandwidth=CPU_BW)[CPU]
    assert cals[CPU].efficiency == pytest.approx(
        statistics.median(s.gen_tps / bandwidth_bound(s.bytes_per_token or 1, CPU_BW) for s in cpu_rows)
    )
    # a device with no bandwidth is not calibrated: one figure is the CPU's alone
    assert set(calibrate([*cpu_rows, *gpu_rows], lanes=CALIBRATING, bandwidth=CPU_BW)) == {CPU}
    assert calibrate(gpu_rows, lanes=CALIBRATING, bandwidth={CPU: CPU_BW}) == {}
    # the card's own figure moves the efficiency, never what it predicts for the bytes it was fitted on
    halved = calibrate(gpu_rows, lanes=CALIBRATING, bandwidth={GPU: RTX_4090_BW / 2})[GPU]
    assert halved.efficiency == pytest.approx(gpu.efficiency * 2)
    for s in gpu_rows:
        assert halved.seconds(s.bytes_per_token or 1) == pytest.approx(gpu.seconds(s.bytes_per_token or 1))


@pytest.mark.parametrize("tensor_type", list(MEASURED_4090))
def test_full_gpu_placement_is_calibrated_by_the_gpu_factor_within_30_percent(
    models: dict[str, GGUFLayout], gpu_rows: list[Speed], cpu_rows: list[Speed], tensor_type: str
) -> None:
    r = _plan(models[tensor_type])
    p = r.chosen
    assert p is not None and r.verdict == "gpu" and p.gpu_layers == N_LAYER + 1
    assert p.read_bytes == {GPU: p.bytes_per_token}
    assert p.tokens_per_s is None and "GPU memory bandwidth" in p.speed_note
    cals = calibrate([*cpu_rows, *gpu_rows], lanes=CALIBRATING, bandwidth=BANDWIDTHS)
    c = calibrated(r, cals).chosen
    assert c is not None and c.calibrated and c.tokens_per_s_range is None and c.tokens_per_s is not None
    gpu = cals[GPU]
    assert c.tokens_per_s == pytest.approx(
        gpu.efficiency * RTX_4090_BW / 2 / (p.bytes_per_token or 1), abs=0.1
    )
    assert "GPU" in c.speed_note and "CPU" not in c.speed_note
    assert calibrated(r, cals).summary.endswith(f", about {rate(c.tokens_per_s)} tokens/s")
    measured = MEASURED_4090[tensor_type][1]
    assert abs(c.tokens_per_s - measured) / measured <= 0.3, (c.tokens_per_s, measured)
    # the CPU's calibration alone leaves a GPU placement as it was
    assert calibrated(r, {CPU: cals[CPU]}).chosen == p


def test_split_placement_adds_each_devices_part(
    models: dict[str, GGUFLayout], gpu_rows: list[Speed], cpu_rows: list[Speed]
) -> None:
    lay = models["f16"]
    r = _plan(lay, gpu_layers=16)  # half the layers on the card, the rest and the output layer on the CPU
    p = r.chosen
    assert p is not None and p.name == "partial" and p.tokens_per_s is None
    assert set(p.read_bytes) == {GPU, CPU} and sum(p.read_bytes.values()) == p.bytes_per_token
    kv_half = 32 * (128 + 128) * 2 * CTX.ctx_per_seq / 2  # 32 heads, K and V of 128, f16, half the context
    assert p.read_bytes[GPU] == int(16 * lay.layer_bytes[0] + 16 * kv_half)
    cals = calibrate([*cpu_rows, *gpu_rows], lanes=CALIBRATING, bandwidth=BANDWIDTHS)
    c = calibrated(r, cals).chosen
    assert c is not None and c.calibrated and c.tokens_per_s is not None
    gpu_s = p.read_bytes[GPU] / (cals[GPU].efficiency * RTX_4090_BW / 2)
    cpu_s = p.read_bytes[CPU] / (cals[CPU].efficiency * CPU_BW / 2)
    assert c.tokens_per_s == pytest.approx(1 / (gpu_s + cpu_s), abs=0.1)
    assert "GPU" in c.speed_note and "CPU" in c.speed_note and "16 layer(s) on the GPU" in c.speed_note
    full = calibrated(_plan(lay), cals).chosen
    cpu_only = calibrated(_plan(lay, gpus=False), cals).chosen
    assert full is not None and cpu_only is not None and full.tokens_per_s and cpu_only.tokens_per_s
    assert cpu_only.tokens_per_s < c.tokens_per_s < full.tokens_per_s
    # one device measured is not enough for a split: no figure, and the note says which is missing
    only_gpu = calibrated(r, {GPU: cals[GPU]}).chosen
    assert only_gpu is not None and only_gpu.tokens_per_s is None and not only_gpu.calibrated
    assert "calibrated: GPU (2 model(s)); not yet the CPU" in only_gpu.speed_note
    only_cpu = calibrated(r, {CPU: cals[CPU]}).chosen
    assert only_cpu is not None and only_cpu.tokens_per_s is None and not only_cpu.calibrated
    assert only_cpu.speed_note.endswith(
        "(calibrated: CPU (2 model(s)); not yet the GPU, so no figure for this split)"
    )


def test_a_device_with_no_rows_stays_a_range(models: dict[str, GGUFLayout], gpu_rows: list[Speed]) -> None:
    cals = calibrate(gpu_rows, lanes=CALIBRATING, bandwidth=BANDWIDTHS)  # nothing measured on the CPU
    assert set(cals) == {GPU}
    r = calibrated(_plan(models["q8_0"], gpus=False), cals)
    p = r.chosen
    assert p is not None and p.name == "cpu" and not p.calibrated and p.tokens_per_s is None
    assert p.tokens_per_s_range is not None and "tokens/s (not measured yet)" in r.summary
    both = calibrated(_plan(models["q8_0"]), cals)  # the GPU placement calibrated, the CPU one not
    gpu_p, cpu_p = both.placements[0], both.placements[-1]
    assert gpu_p.calibrated and not cpu_p.calibrated and cpu_p.tokens_per_s_range is not None


def test_cpu_calibration_is_unchanged_by_a_gpu(models: dict[str, GGUFLayout], cpu_rows: list[Speed]) -> None:
    r = _plan(models["q8_0"], gpus=False)
    p = r.chosen
    assert p is not None and p.read_bytes == {CPU: p.bytes_per_token} and p.raw_tokens_per_s
    cal = SpeedCalibration(efficiency=0.5, per_token_s=0.001, models=1)  # no bandwidth kept: still applies
    c = calibrated(r, {CPU: cal, GPU: SpeedCalibration(efficiency=1.5, bandwidth=RTX_4090_BW)}).chosen
    assert c is not None and c.tokens_per_s == pytest.approx(cal.predict(p.raw_tokens_per_s), abs=0.1)
    assert "CPU" in c.speed_note


def test_speeds_recorded_in_library_db_calibrate_per_device(tmp_path: Path, gpu_rows: list[Speed]) -> None:
    lib = Library(Database(Paths(tmp_path).home / "library.db"))
    try:
        store = SpeedStore(lib, calibrating=CALIBRATING)
        for s in gpu_rows:
            key = LoadKey("llama.cpp", GPU, s.bytes_per_token, object())
            store.record(s.model_id, key=key, prompt_tps=s.prompt_tps, gen_tps=s.gen_tps)
        got = store.calibration(bandwidth=BANDWIDTHS)
        assert set(got) == {GPU}
        assert got[GPU].efficiency == pytest.approx(
            calibrate(gpu_rows, lanes=CALIBRATING, bandwidth=BANDWIDTHS)[GPU].efficiency
        )
        assert store.calibration(bandwidth=CPU_BW) == {}  # the CPU's figure alone calibrates no card
    finally:
        lib.close()


def test_device_bandwidths_name_what_the_machine_knows() -> None:
    assert device_bandwidths(RTX_4090_MACHINE) == BANDWIDTHS
    # the card's figure stands without the CPU's, and a card whose driver gave none gets no GPU figure
    assert device_bandwidths(dataclasses.replace(RTX_4090_MACHINE, bandwidth=None)) == {GPU: RTX_4090_BW}
    unread = machine(ram_gib=64, gpus=(nvidia(24564),))
    assert device_bandwidths(unread) == {CPU: CPU_BW}
    assert device_bandwidths(dataclasses.replace(unread, bandwidth=None)) == {}
    apple = unified_gpu("apple", "Apple M2 Pro", source="sysctl")
    mac = dataclasses.replace(machine(ram_gib=32, os_="darwin"), gpus=(apple,))
    assert device_bandwidths(mac) == {CPU: CPU_BW, GPU: CPU_BW}  # the GPU reads the same memory


# ------------------------------------------------------------------ the card's bandwidth, read from NVML
# bus width (bits) and top memory clock (MHz) as NVML answers them on these cards (their published specs:
# 1008 GB/s, 3.35 TB/s and 2.04 TB/s)
MEMORY_BUS = {RTX_4090.bus_id: (384, 10501), H100_A.bus_id: (5120, 2619), A100_80.bus_id: (5120, 1593)}
GRAPHICS_MHZ = 2520  # what the graphics clock would answer: not the memory's


@dataclass
class MemoryNVML(FakeNVML):
    """tests/hardware/test_probe.py's NVML, with the memory bus width and clock queries a newer driver has."""

    bus: dict[str, tuple[int, int]] = field(default_factory=lambda: dict(MEMORY_BUS))
    clock_error: int | None = None  # the memory clock query raises this NVML error

    def nvmlDeviceGetMemoryBusWidth(self, h: Card) -> int:
        if h.bus_id not in self.bus:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.bus[h.bus_id][0]

    def nvmlDeviceGetMaxClockInfo(self, h: Card, clock_type: int) -> int:
        if self.clock_error is not None:
            raise pynvml.NVMLError(self.clock_error)
        if h.bus_id not in self.bus:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.bus[h.bus_id][1] if clock_type == pynvml.NVML_CLOCK_MEM else GRAPHICS_MHZ


def _with_cards(gpus: tuple[GPUInfo, ...]) -> Hardware:
    return dataclasses.replace(RTX_4090_MACHINE, gpus=gpus)


def test_nvml_bus_width_and_memory_clock_give_the_cards_bandwidth(gpu_rows: list[Speed]) -> None:
    (card,) = read_nvidia(MemoryNVML([RTX_4090])).gpus
    assert card.memory_bandwidth == RTX_4090_READ and round(card.memory_bandwidth / 1e9) == 1008
    assert card.public()["memory_bandwidth"] == RTX_4090_READ  # in the hardware JSON beside the rest
    hw = _with_cards((card,))
    assert device_bandwidths(hw) == {CPU: CPU_BW, GPU: 2 * RTX_4090_READ}
    # what the probe read is what calibrates the card's rows
    assert calibrate(gpu_rows, lanes=CALIBRATING, bandwidth=device_bandwidths(hw)) == calibrate(
        gpu_rows, lanes=CALIBRATING, bandwidth=BANDWIDTHS
    )
    h100, a100 = read_nvidia(MemoryNVML([H100_A, A100_80])).gpus
    assert h100.memory_bandwidth == pytest.approx(3.35e12, rel=0.001)
    assert a100.memory_bandwidth == pytest.approx(2.039e12, rel=0.001)
    # layers spread over both cards: the slower card sets the figure, whichever comes first
    assert device_bandwidths(_with_cards((h100, a100)))[GPU] == 2 * (a100.memory_bandwidth or 0)
    assert device_bandwidths(_with_cards((a100, h100)))[GPU] == 2 * (a100.memory_bandwidth or 0)


def test_nvml_without_the_memory_queries_leaves_the_card_uncalibrated() -> None:
    # bindings older than the queries (tests/hardware/test_probe.py's NVML has neither)
    (old,) = read_nvidia(FakeNVML([RTX_4090])).gpus
    (unsupported,) = read_nvidia(MemoryNVML([RTX_4090], bus={})).gpus  # the driver answers NotSupported
    (no_clock,) = read_nvidia(MemoryNVML([RTX_4090], clock_error=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)).gpus
    (zero,) = read_nvidia(MemoryNVML([RTX_4090], bus={RTX_4090.bus_id: (384, 0)})).gpus
    for card in (old, unsupported, no_clock, zero):
        assert card.memory_bandwidth is None and card.memory_total == 24564 * 1024 * 1024  # the rest read
        assert device_bandwidths(_with_cards((card,))) == {CPU: CPU_BW}
    # one card of two without a figure: no GPU figure rather than the other card's alone
    (a100,) = read_nvidia(MemoryNVML([A100_80])).gpus
    assert device_bandwidths(_with_cards((a100, dataclasses.replace(old, index=1)))) == {CPU: CPU_BW}


def test_doctor_and_explain_show_the_cards_bandwidth(tmp_path: Path) -> None:
    (card,) = read_nvidia(MemoryNVML([RTX_4090])).gpus
    (unread,) = read_nvidia(FakeNVML([RTX_4090])).gpus  # bindings without the memory queries
    hw = _with_cards((card, dataclasses.replace(unread, index=1)))
    models = {"dirs": [], "servable": 0, "broken": 0, "no_lane_yet": 0}
    report = {"home": str(tmp_path), "disk_free": 1 << 40, "hardware": hw.public(), "lanes": []}
    lines = render_doctor({**report, "models": models, "problems": []}).splitlines()
    assert next(x for x in lines if x.startswith("gpu 0:")).endswith(", driver 550.54.15, 1008 GB/s")
    assert "GB/s" not in next(x for x in lines if x.startswith("gpu 1:"))
    entry = entry_for_path(write_tiny_gguf(tmp_path / "large.gguf", LARGE))
    doc = explain(entry, inputs=AdviceInputs(Settings(), hw, pins={}, speed={})).public()
    assert [g["memory_bandwidth"] for g in doc["hardware"]["gpus"]] == [RTX_4090_READ, None]


# ------------------------------------------------------------------ which device a load's answers go under
def _runtime_with_lanes(tmp_path: Path, http: aiohttp.ClientSession, plans: dict[str, LaunchPlan]) -> Runtime:
    """A Runtime (not started) whose supervisor holds a lane per plan, each as a start leaves it."""
    settings = Settings.flat(models_dirs=(tmp_path / "models",))
    rt = Runtime(settings=settings, paths=Paths(tmp_path))
    library, catalog = open_catalog(settings, rt.paths)
    library.close()  # the lanes never start: the catalog is only held
    rt.supervisor = Supervisor(catalog=catalog, settings=settings, bus=rt.bus, log_dir=tmp_path / "logs")
    for model_id, plan in plans.items():
        lane = Lane(
            model_id=model_id,
            kind="llama.cpp",
            plan_factory=functools.partial(lambda p: p, plan),
            settings=settings,
            bus=rt.bus,
            ring=LogRing(max_lines=10, file=None),
            http=http,
        )
        lane.plan = plan  # what Lane.start sets from the factory
        rt.supervisor.lanes[model_id] = lane
    return rt


def _launch(report: FitReport | None) -> LaunchPlan:
    return LaunchPlan(
        runtime="llama-server",
        argv=("llama-server",),
        env={},
        health_path="/health",
        port=None,
        params=CTX,
        fit=report,
    )


async def test_load_key_files_cpu_gpu_and_split_loads_apart(
    tmp_path: Path, models: dict[str, GGUFLayout], gpu_rows: list[Speed]
) -> None:
    lay = models["q8_0"]
    reports = {
        "cpu": _plan(lay, gpus=False),
        "gpu": _plan(lay),  # every layer and the output layer on the card
        "split": _plan(lay, gpu_layers=16),
        "all-but-output": _plan(lay, gpu_layers=N_LAYER),  # the output layer still read on the CPU
    }
    plans = {m: _launch(r) for m, r in reports.items()} | {"unplanned": _launch(None)}
    async with aiohttp.ClientSession() as http:
        rt = _runtime_with_lanes(tmp_path, http, plans)
        keys = {m: rt._load_key(m) for m in plans}
        assert rt._load_key("not-loaded") is None
    want = {"cpu": CPU, "gpu": GPU, "split": SPLIT, "all-but-output": SPLIT, "unplanned": CPU}
    assert {m: k.device for m, k in keys.items() if k} == want
    for m, r in reports.items():
        key = keys[m]
        assert key is not None and r.chosen is not None and key.load is plans[m]
        assert key.lane == "llama.cpp" and key.bytes_per_token == r.chosen.bytes_per_token
        # a placement made without its read split is named from its layers the same way
        assert speed_device(dataclasses.replace(r.chosen, read_bytes={})) == want[m]
    # a split load's answers, slow as they are, move neither device's factor
    lib = Library(Database(Paths(tmp_path).home / "library.db"))
    try:
        store = SpeedStore(lib, calibrating=CALIBRATING)
        for s in gpu_rows:
            store.record(
                s.model_id,
                key=LoadKey("llama.cpp", GPU, s.bytes_per_token, object()),
                prompt_tps=s.prompt_tps,
                gen_tps=s.gen_tps,
            )
        split_key = keys["split"]
        assert split_key is not None
        store.record("codellama-7b-q8_0", key=split_key, prompt_tps=900.0, gen_tps=9.0)
        assert {s.device for s in store.all()} == {GPU, SPLIT}
        assert store.calibration(bandwidth=BANDWIDTHS) == calibrate(
            gpu_rows, lanes=CALIBRATING, bandwidth=BANDWIDTHS
        )
    finally:
        lib.close()


# ------------------------------------------------------------------ explain shows each device's calibration
def test_explain_lists_each_calibrated_device(
    tmp_path: Path, gpu_rows: list[Speed], cpu_rows: list[Speed]
) -> None:
    entry = entry_for_path(write_tiny_gguf(tmp_path / "large.gguf", LARGE))
    cals = calibrate([*cpu_rows, *gpu_rows], lanes=CALIBRATING, bandwidth=BANDWIDTHS)
    inputs = AdviceInputs(Settings(), RTX_4090_MACHINE, pins={}, speed=cals)
    doc = explain(entry, inputs=inputs).public()
    view = doc["speed_calibration"]
    assert [d["device"] for d in view["devices"]] == [CPU, GPU]
    gpu = view["devices"][1]
    assert gpu["efficiency"] == round(cals[GPU].efficiency, 3) and gpu["models"] == 2
    assert gpu["bandwidth"] == RTX_4090_BW
    # the CPU's figures stay at the top level, as a one-device view had them
    assert (
        view["device"] == CPU
        and view["models"] == 2
        and view["efficiency"] == view["devices"][0]["efficiency"]
    )
    text = render(doc)
    cpu_reads = f"(reads at {CPU_BW / 2e9:.0f} GB/s)"  # the bound's read rate: half the copy figure
    assert (
        f"speed calibration (CPU): {cals[CPU].efficiency:.2f} of the memory-bandwidth bound {cpu_reads}"
        in text
    )
    assert (
        f"speed calibration (GPU): {cals[GPU].efficiency:.2f} of the memory-bandwidth bound "
        "(reads at 1008 GB/s), from 2 measured model(s)"
    ) in text
    # the card alone calibrated: its figures are the top level's
    only = explain(entry, inputs=dataclasses.replace(inputs, speed={GPU: cals[GPU]})).public()
    assert only["speed_calibration"]["device"] == GPU and len(only["speed_calibration"]["devices"]) == 1
    assert "speed calibration (CPU)" not in render(only) and "speed calibration (GPU)" in render(only)
    assert explain(entry, inputs=dataclasses.replace(inputs, speed={})).public()["speed_calibration"] is None


def test_explain_matches_the_measured_row_to_the_planned_device(tmp_path: Path) -> None:
    entry = entry_for_path(write_tiny_gguf(tmp_path / "large.gguf", LARGE))
    rows = tuple(
        Speed(entry.id, "llama.cpp", device, 500.0, tps, 1 << 20, 9, 0.0)
        for device, tps in ((SPLIT, 40.0), (GPU, 90.0), (CPU, 20.0))
    )
    on = {}
    for name, hw, settings in (
        ("gpu", RTX_4090_MACHINE, Settings()),
        ("cpu", machine(ram_gib=64), Settings()),
        ("split", RTX_4090_MACHINE, Settings.flat(gpu_layers=1)),
    ):
        e = explain(entry, inputs=AdviceInputs(settings, hw, pins={}), speeds=rows)
        assert e.fit is not None and e.fit.chosen is not None and e.measured is not None
        on[name] = (speed_device(e.fit.chosen), e.measured.device, e.public()["measured_tokens_per_s"])
    assert on == {"gpu": (GPU, GPU, 90.0), "cpu": (CPU, CPU, 20.0), "split": (SPLIT, SPLIT, 40.0)}
