"""The engine's own buffer report, parsed from real llama.cpp load logs."""

from __future__ import annotations

from pathlib import Path

from app.core.paths import Paths
from app.core.settings import Settings
from app.lanes.footprint import MIB, parse_footprint
from app.runtime import Runtime
from tests.conftest import link_models

CAPTURED = [
    "--- switchyard: starting old at Mon",
    "0.00.022187 I load_tensors:   CPU_Mapped model buffer size =    11.00 MiB",
    "--- switchyard: starting large at Tue",
    "0.00.022.187 I load_tensors:   CPU_Mapped model buffer size =    97.08 MiB",
    "0.00.022.190 I load_tensors:        CUDA0 model buffer size =  1024.50 MiB",
    "0.00.022.583 I llama_context:        CPU  output buffer size =     0.00 MiB",
    "0.00.022.715 I llama_kv_cache:        CPU KV buffer size =    64.00 MiB",
    "0.00.059.896 I sched_reserve:        CPU compute buffer size =    16.02 MiB",
    "0.00.059.897 I sched_reserve:      CUDA0 compute buffer size =   300.00 MiB",
]


def test_parse_captured_log_latest_start_only() -> None:
    fp = parse_footprint(CAPTURED)
    assert fp.devices["CPU"]["weights"] == round(97.08 * MIB)
    assert fp.devices["GPU0"]["weights"] == round(1024.5 * MIB)
    assert fp.devices["CPU"]["kv_cache"] == 64 * MIB
    assert fp.total("compute") == round(16.02 * MIB) + 300 * MIB
    assert fp.devices["CPU"]["output"] == 0


async def test_ready_lane_reports_measured_buffers(tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "m", model_store / "tiny.gguf")
    rt = Runtime(settings=Settings.flat(models_dirs=(models,), parallel=2), paths=Paths.from_env())
    async with rt:
        lane = await rt.supervisor.ensure("tiny")
        snap = lane.snapshot()
        m = snap["measured"]
        assert m is not None and "CPU" in m["devices"]
        # tiny: 2 layers x 2 kv heads x 16 dims x (2+2) bytes x 4096 cells = 1 MiB of f16 KV
        assert m["totals"]["kv_cache"] == 1 * MIB
        assert m["totals"]["weights"] > 0 and m["totals"]["compute"] > 0
        assert m["rss_bytes"] and m["rss_bytes"] > m["totals"]["weights"]
        await rt.supervisor.unload("tiny")
        assert lane.snapshot()["measured"] is None


def test_store_keeps_figures_per_file_and_sets_aside_a_corrupt_file(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from app.lanes.footprint import Footprint, FootprintStore

    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    plan = SimpleNamespace(
        params=SimpleNamespace(model_path=str(model)),
        public=lambda: {"params": {"ctx_size": 1}},
        predicted=lambda: {"total": 5},
    )
    fp = Footprint()
    fp.add("CPU", "kv_cache", 7)
    store = FootprintStore(tmp_path / "footprints.json")
    store.record(SimpleNamespace(plan=plan, measured=fp, model_id="m"))
    got = store.get("m", path=model)
    assert got is not None and got["measured"]["totals"]["kv_cache"] == 7 and got["predicted"] == {"total": 5}
    model.write_bytes(b"y" * 11)
    assert store.get("m", path=model) is None
    (tmp_path / "footprints.json").write_text("{not json")
    assert store.get("m", path=model) is None
    assert list(tmp_path.glob("footprints.corrupt-*"))  # kept for the user, not deleted


def test_a_gpu_backends_pinned_host_buffers_are_host_memory() -> None:
    """On offload the host keeps small compute and output buffers in the GPU backend's pinned memory, named
    `<backend>_Host` (ggml-cuda.cu, ggml-vulkan.cpp, ggml-sycl.cpp of the vendored llama.cpp): the plan's
    CPU, never a device of their own, nor GPU memory."""
    fp = parse_footprint(
        [
            "I load_tensors:        CUDA0 model buffer size =  1024.00 MiB",
            "I load_tensors:   CPU_Mapped model buffer size =    97.00 MiB",
            "I llama_context:  CUDA_Host  output buffer size =     0.50 MiB",
            "I llama_context:      CUDA0 compute buffer size =   300.00 MiB",
            "I llama_context:  CUDA_Host compute buffer size =    12.00 MiB",
            "I llama_context: Vulkan_Host compute buffer size =     4.00 MiB",
        ]
    )
    assert set(fp.devices) == {"CPU", "GPU0"}
    assert fp.devices["CPU"] == {"weights": 97 * MIB, "output": MIB // 2, "compute": 16 * MIB}
    assert fp.devices["GPU0"] == {"weights": 1024 * MIB, "compute": 300 * MIB}
