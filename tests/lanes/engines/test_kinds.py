"""The engine-kind interface without engines: vLLM/SGLang command lines and budgets, the choice of kind,
the audio decoder, `doctor`'s lane report and the GPU check script's answer on a machine without a GPU.
Real runs of piper and whisper.cpp are in test_lane_audio.py."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.fit.gpu_share import GPUShareRefused
from app.formats.detect import detect_format
from app.formats.safetensors_meta import SafetensorsModel
from app.hardware.model import CPUInfo, GPUInfo, Hardware, MemoryInfo
from app.hardware.probe import probe
from app.lanes.engines.cuda import cuda_plan, nvidia_cards
from app.lanes.engines.mlx import mlx_plan
from app.lanes.engines.plan import StartContext
from app.lanes.engines.registry import choose_kind, engine_kinds
from app.lanes.install.installed import installed_lanes, lane_report
from app.lanes.workers.audio import AudioError, decode, read_wav, resample
from app.library.model import ModelEntry
from tests.support.modelgen import LlamaDims, llama_tensors, write_hf_dir

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[3]
DIMS = LlamaDims(heads=6, kv_heads=2, hidden=96)  # 6 heads / 2 KV heads: tensor parallel 1 or 2 only


def gpu(index: int, gib: int = 24, cc: str = "8.9") -> GPUInfo:
    return GPUInfo(
        index, "nvidia", f"NVIDIA L4 #{index}", gib * GIB, gib * GIB, 0, "550", cc, False, None, "nvml"
    )


def hw(*gpus: GPUInfo) -> Hardware:
    return Hardware(
        os="linux",
        arch="x86_64",
        cpu=CPUInfo("cpu", 8, 16, 16, None, ("avx2",)),
        memory=MemoryInfo(total=64 * GIB, available=48 * GIB, swap_total=0, swap_free=0, cgroup_limit=None),
        gpus=gpus,
        engine_devices=(),
        bandwidth=None,
    )


@pytest.fixture
def model(tmp_path: Path) -> SafetensorsModel:
    folder = tmp_path / "org" / "small-llama"
    write_hf_dir(folder, DIMS.config(), llama_tensors(DIMS))
    facts = detect_format(folder).facts
    assert isinstance(facts, SafetensorsModel)
    return facts


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_vllm_command_line_pins_the_plan(model: SafetensorsModel) -> None:
    s = Settings.flat(vllm_extra_args="--enforce-eager --seed 3")
    plan = cuda_plan(
        model, engine="vllm", model_id="org/small-llama", settings=s, hardware=hw(gpu(0)), port=8123, ppid=1
    )
    argv = plan.argv
    assert argv[:5] == (sys.executable, "-m", "app.lanes.guard", "1", "--")  # dies with the server
    assert argv[5:8] == ("vllm", "serve", str(model.path))
    assert flag(argv, "--served-model-name") == "org/small-llama" and flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--port") == "8123" and plan.port == 8123 and plan.health_path == "/health"
    assert flag(argv, "--max-model-len") == "8192"  # the trained window (under the 32k cap)
    assert flag(argv, "--tensor-parallel-size") == "1"
    assert float(flag(argv, "--gpu-memory-utilization")) == pytest.approx(plan.params.fraction)
    assert 0 < plan.params.fraction < 1
    assert argv[-3:] == ("--enforce-eager", "--seed", "3")  # the extra-args setting comes last, as given
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0" and plan.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert plan.env["HF_HUB_OFFLINE"] == "1" and plan.memory == "fraction"
    pred = plan.predicted()
    assert pred is not None and pred["devices"][0]["device"] == "GPU0" and pred["total"] > 0


def test_sglang_command_line_and_context_setting(model: SafetensorsModel) -> None:
    s = Settings.flat(ctx_size=4096, sglang_extra_args="--disable-radix-cache")
    plan = cuda_plan(model, engine="sglang", model_id="m", settings=s, hardware=hw(gpu(0)), port=9000, ppid=7)
    argv = plan.argv
    assert argv[5:8] == (sys.executable, "-m", "sglang.launch_server")
    assert flag(argv, "--model-path") == str(model.path) and flag(argv, "--served-model-name") == "m"
    assert flag(argv, "--context-length") == "4096" and flag(argv, "--tp-size") == "1"
    assert float(flag(argv, "--mem-fraction-static")) == pytest.approx(plan.params.fraction)
    assert int(flag(argv, "--max-total-tokens")) >= 4096
    assert argv[-1] == "--disable-radix-cache"


def test_tensor_parallel_is_held_to_the_heads(model: SafetensorsModel) -> None:
    # 4 cards, but 6 heads / 2 KV heads split only 1 or 2 ways: the lane takes 2 cards
    plan = cuda_plan(
        model,
        engine="vllm",
        model_id="m",
        settings=Settings(),
        hardware=hw(*(gpu(i) for i in range(4))),
        port=1,
        ppid=1,
    )
    assert flag(plan.argv, "--tensor-parallel-size") == "2" and plan.params.gpus == (0, 1)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert [d["device"] for d in plan.predicted()["devices"]] == ["GPU0", "GPU1"]  # type: ignore[index]


def test_two_lanes_share_one_card(model: SafetensorsModel) -> None:
    card = hw(gpu(0, gib=24))
    first = cuda_plan(model, engine="vllm", model_id="a", settings=Settings(), hardware=card, port=1, ppid=1)
    used = {"GPU0": first.predicted()["total"]}  # type: ignore[index]
    second = cuda_plan(
        model, engine="sglang", model_id="b", settings=Settings(), hardware=card, port=2, ppid=1, used=used
    )
    promised = first.predicted()["total"] + second.predicted()["total"]  # type: ignore[index]
    assert promised <= 24 * GIB  # the second lane's fraction leaves the first lane's share alone
    # a card too small for what is promised already: refused with numbers, nothing started
    with pytest.raises(GPUShareRefused):
        cuda_plan(
            model,
            engine="vllm",
            model_id="c",
            settings=Settings(),
            hardware=card,
            port=3,
            ppid=1,
            used={"GPU0": int(23.9 * GIB)},
        )


def test_cuda_lanes_refuse_without_an_nvidia_gpu(model: SafetensorsModel, tmp_path: Path) -> None:
    kinds = engine_kinds()
    for lane in ("vllm", "sglang"):
        why = kinds[lane].start_refusal(Settings(), hw())
        assert why is not None and ("not installed" in why or "NVIDIA GPU" in why)
    entry = ModelEntry("org/small-llama", model.path, None, None, format="safetensors", kind_name="chat")  # type: ignore[arg-type]
    if kinds["mistral.rs"].install(Settings()).installed:  # plain weights without CUDA: mistral.rs runs them
        assert choose_kind(entry, Settings(), kinds=kinds, hardware=hw(), pinned=None).lane == "mistral.rs"
    awq = tmp_path / "org" / "small-llama-awq"
    quant = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm", "zero_point": True}
    write_hf_dir(awq, DIMS.config(quantization_config=quant), llama_tensors(DIMS, "awq", group=32))
    quantized = ModelEntry("org/awq", awq, None, None, format="safetensors", kind_name="chat")
    with pytest.raises(EngineUnavailableError) as exc:  # AWQ kernels: only the CUDA lanes are asked
        choose_kind(quantized, Settings(), kinds=kinds, hardware=hw(), pinned=None)
    assert "vLLM" in exc.value.message and "SGLang" in exc.value.message
    assert "mistral.rs" not in exc.value.message
    with pytest.raises(EngineUnavailableError, match="pinned to piper"):
        choose_kind(entry, Settings(), kinds=kinds, hardware=hw(), pinned="piper")
    with pytest.raises(EngineUnavailableError, match="NVIDIA GPU"):  # the plan itself refuses, too
        cuda_plan(model, engine="vllm", model_id="m", settings=Settings(), hardware=hw(), port=1, ppid=1)


def test_kinds_for_each_format() -> None:
    kinds = engine_kinds()
    assert list(kinds) == [
        "llama.cpp",
        "llama.cpp-compat",  # a second llama.cpp build; starts only once registered (llamacpp/compat.py)
        "mistral.rs",
        "mlx",
        "vllm",
        "sglang",
        "sd.cpp",
        "whisper.cpp",
        "piper",
    ]
    voice = ModelEntry("v", Path("v.onnx"), None, None, format="piper", kind_name="speech")
    asr = ModelEntry("w", Path("w.bin"), None, None, format="whisper-ggml", kind_name="transcription")
    assert choose_kind(voice, Settings(), kinds=kinds, hardware=None, pinned=None).lane == "piper"
    assert choose_kind(asr, Settings(), kinds=kinds, hardware=None, pinned=None).lane == "whisper.cpp"
    assert kinds["piper"].capabilities(voice) == {"speech"}
    assert kinds["whisper.cpp"].capabilities(asr) == {"transcription", "translation"}
    assert kinds["mlx"].memory == "runtime-managed" and kinds["llama.cpp"].memory == "planned"


def test_doctor_lane_report_says_why_not() -> None:
    rows = {r["lane"]: r for r in lane_report(Settings(), hw())}
    assert set(rows) == set(installed_lanes(Settings()))
    assert (
        rows["piper"]["installed"]
        and rows["piper"]["can_start"]
        and rows["piper"]["capabilities"] == ["speech"]
    )
    assert rows["whisper.cpp"]["can_start"] and "pywhispercpp" in str(rows["whisper.cpp"]["version"])
    assert not rows["vllm"]["can_start"] and rows["vllm"]["why_not"]
    assert rows["sd.cpp"]["has_lane"] and rows["sd.cpp"]["capabilities"] == ["images"]


def test_gpu_check_script_says_why_it_cannot_run_here() -> None:
    hardware = probe(bandwidth_cache=None)
    if nvidia_cards(hardware):
        pytest.skip("an NVIDIA GPU is present: run bench/gpu_check.py itself (docs/engines.md)")
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "no NVIDIA GPU found" in out.stdout and "Nothing to check" in out.stdout


# ---- audio in --------------------------------------------------------------------------------------


def _wav(samples: np.ndarray, rate: int, width: int, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        if width == 1:
            w.writeframes((samples * 127 + 128).astype(np.uint8).tobytes())
        elif width == 3:
            ints = (samples * 8388607).astype("<i4")
            w.writeframes(b"".join(struct.pack("<i", v)[:3] for v in ints))
        else:
            dtype, scale = ("<i2", 32767) if width == 2 else ("<i4", 2147483647)
            w.writeframes((samples * scale).astype(dtype).tobytes())
    return buf.getvalue()


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_pcm_wavs_of_every_width_decode_to_the_same_signal(width: int) -> None:
    t = np.arange(800) / 8000
    sig = (0.5 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
    got, rate = read_wav(_wav(sig, 8000, width))
    assert rate == 8000 and got.shape == sig.shape
    assert np.abs(got - sig).max() < (0.02 if width == 1 else 1e-3)


def test_stereo_is_mixed_and_any_rate_is_resampled_to_16k() -> None:
    left = np.full(4410, 0.5, dtype=np.float32)
    both = np.stack([left, -left * 0.0], axis=1).reshape(-1)
    out = decode(_wav(both, 44100, 2, channels=2))
    assert out.size == 1600 and abs(float(out.mean()) - 0.25) < 1e-3  # 0.1 s, the mean of L and R
    assert resample(np.zeros(10, dtype=np.float32), 16000).size == 10


def test_unreadable_audio_says_what_to_send(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no ffmpeg on this PATH
    with pytest.raises(AudioError, match="ffmpeg"):
        decode(b"ID3\x04" + b"\0" * 100, filename="a.mp3")
    with pytest.raises(AudioError, match="fmt or data chunk"):
        decode(b"RIFF\x04\0\0\0WAVE")


def test_mlx_command_line_is_runtime_managed(tmp_path: Path) -> None:
    folder = tmp_path / "mlx-llama"
    write_hf_dir(folder, DIMS.config(), llama_tensors(DIMS))
    entry = ModelEntry("mlx-llama", folder, None, None, format="mlx", kind_name="chat")
    plan = mlx_plan(entry, Settings.flat(mlx_extra_args="--max-tokens 64"), ppid=1, free_port=5000)
    assert plan.argv[:5] == (sys.executable, "-m", "app.lanes.guard", "1", "--")
    assert plan.argv[5:8] == (sys.executable, "-m", "mlx_lm.server")
    assert flag(plan.argv, "--model") == "mlx-llama" and flag(plan.argv, "--port") == "5000"
    assert plan.cwd is not None and (Path(plan.cwd) / "mlx-llama").resolve() == folder.resolve()
    assert plan.argv[-2:] == ("--max-tokens", "64") and plan.port == 5000
    assert plan.env["HF_HUB_OFFLINE"] == "1" and Path(plan.env["HF_HUB_CACHE"]).is_dir()
    assert plan.memory == "runtime-managed" and plan.params.trained_context == 8192
    assert plan.predicted() is None  # no made-up KV estimate
    kind = engine_kinds()["mlx"]
    if not kind.install(Settings()).installed:
        with pytest.raises(EngineUnavailableError, match="mlx-lm is not installed"):
            kind.build(entry, Settings(), StartContext(ppid=1, port=5000, hardware=None))


def test_doctor_command_reports_every_lane(tmp_path: Path) -> None:
    env = {**os.environ, "SWITCHYARD_HOME": str(tmp_path / "home")}
    run = [sys.executable, "-m", "app", "doctor"]
    out = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    lanes = {ln["lane"]: ln for ln in json.loads(out.stdout)["lanes"]}
    assert set(lanes) == {
        "llama.cpp",
        "llama.cpp-compat",
        "mistral.rs",
        "mlx",
        "vllm",
        "sglang",
        "sd.cpp",
        "whisper.cpp",
        "piper",
    }
    assert lanes["piper"]["can_start"] and lanes["whisper.cpp"]["can_start"]
    assert lanes["vllm"]["can_start"] is False and lanes["vllm"]["why_not"]
    compat = lanes["llama.cpp-compat"]  # nothing registered: says how
    assert compat["can_start"] is False and "engine register llama.cpp-compat" in compat["why_not"]
    text = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env, cwd=REPO).stdout
    assert "piper        installed - piper-tts" in text and "; can start here" in text
    assert "sd.cpp       not available; cannot start here: no executable sd-server was found" in text
