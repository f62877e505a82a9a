"""`python bench/gpu_check.py llama-server [--binary BIN | --source DIR] [--out FILE]`: the GPU proof of
the llama-server runtime on an NVIDIA card.

1. A `llama-server` with CUDA: `--binary`, else built from a llama.cpp source snapshot (`--source`) for
   the card's architecture (`--arch`, default from NVML, e.g. 90 for an H200), llama-server target only.
2. Generated models (tests/support/tinymodels.py: random f32 llamas, a 135 MB one and a 370 MB one), each
started
   through Switchyard's own supervisor with `runtime = "path"` and the automatic GPU placement.
3. Per model: the lane serving on the GPU (llama.cpp's CUDA buffers in its load log), tokens per second
   (llama-server's own `timings` for 256 tokens, ignore_eos), and the predicted CUDA buffers (weights, KV,
   compute) against the ones llama.cpp reports, each within 5 % or 16 MiB.

Prints one JSON report (and writes it to --out) plus a Markdown table for docs/engines.md and
docs/fit.md. Without an NVIDIA GPU it says so and exits 0; it exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core.paths import Paths  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from app.hardware.probe import probe  # noqa: E402
from app.runtime import Runtime  # noqa: E402
from tests.support.tinymodels import LARGE, TinySpec, write_tiny_gguf  # noqa: E402

MIB = 1 << 20
TOLERANCE = 0.05
SLACK = 16 * MIB
MID = TinySpec(n_embd=1024, n_layer=8, n_head=16, n_head_kv=8, n_ff=2816, n_ctx_train=4096, seed=5)
COMPONENTS = ("weights", "kv_cache", "compute")


def build_llama_server(source: Path, build: Path, *, arch: str) -> Path:
    """cmake + build of llama-server alone with CUDA for `arch` (no curl: the machine is offline)."""
    jobs = str(os.cpu_count() or 4)
    configure = [
        "cmake", "-S", str(source), "-B", str(build), "-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}",
        "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_NATIVE=OFF",
        "-DCMAKE_BUILD_TYPE=Release",
    ]  # fmt: skip
    t0 = time.monotonic()
    subprocess.run(configure, check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], check=True)
    print(f"gpu_llama_server: built llama-server in {time.monotonic() - t0:.0f} s", flush=True)
    return build / "bin" / "llama-server"


def completion(base_url: str, *, tokens: int) -> dict[str, Any]:
    body = {"prompt": "Once upon a time", "n_predict": tokens, "ignore_eos": True, "temperature": 0}
    req = urllib.request.Request(
        f"{base_url}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return dict(json.loads(resp.read()))


def compare(predicted: dict[str, Any] | None, measured: dict[str, Any]) -> list[dict[str, Any]]:
    """Per GPU device and component: predicted vs reported bytes, and whether they agree."""
    rows = []
    for dev in (predicted or {}).get("devices", []):
        name = dev["device"]
        if name == "CPU":
            continue
        got = measured.get("devices", {}).get(name, {})
        for comp in COMPONENTS:
            want, have = int(dev.get(comp, 0)), int(got.get(comp, 0))
            ok = abs(want - have) <= max(TOLERANCE * have, SLACK)
            rows.append({"device": name, "component": comp, "predicted": want, "reported": have, "ok": ok})
    return rows


async def check_model(models: Path, model_id: str, binary: Path, *, tokens: int) -> dict[str, Any]:
    settings = Settings.flat(models_dirs=(models,), runtime="path", llama_server_path=str(binary))
    rt = Runtime(settings=settings, paths=Paths.from_env())
    async with rt:
        t0 = time.monotonic()
        lane = await rt.supervisor.ensure(model_id)
        ready_s = time.monotonic() - t0
        assert lane.plan is not None
        measured = lane.measured.public() if lane.measured else {"devices": {}}
        result = await asyncio.to_thread(completion, lane.base_url, tokens=tokens)
        rows = compare(lane.plan.predicted(), measured)
        on_gpu = any(k != "CPU" and v.get("weights", 0) > 0 for k, v in measured.get("devices", {}).items())
        return {
            "model": model_id,
            "runtime": lane.plan.runtime,
            "ready_s": round(ready_s, 2),
            "on_gpu": on_gpu,
            "tokens_per_s": result.get("timings", {}).get("predicted_per_second"),
            "prompt_per_s": result.get("timings", {}).get("prompt_per_second"),
            "placement": (lane.plan.predicted() or {}).get("placement"),
            "buffers": rows,
            "ok": on_gpu and bool(rows) and all(r["ok"] for r in rows),
        }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"GPU: {report['gpu']}; llama-server: {report['binary']}",
        "",
        "| model | on GPU | tok/s | component | predicted MiB | reported MiB | within 5 % or 16 MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in report["models"]:
        for r in m["buffers"]:
            lines.append(
                f"| {m['model']} | {m['on_gpu']} | {m['tokens_per_s'] or 0:.0f} | {r['component']} | "
                f"{r['predicted'] / MIB:.1f} | {r['reported'] / MIB:.1f} | {'yes' if r['ok'] else 'NO'} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", type=Path, help="a CUDA llama-server to use as it is")
    ap.add_argument("--source", type=Path, help="a llama.cpp source snapshot to build llama-server from")
    ap.add_argument("--build-dir", type=Path, help="where to build (default: a temporary folder)")
    ap.add_argument("--arch", help="CUDA architecture, e.g. 90 (default: the card's)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    hw = probe(engine=False)
    cards = [g for g in hw.gpus if g.vendor == "nvidia"]
    if not cards:
        why = "; ".join(hw.notes) or "NVML lists no card"
        print(f"gpu_llama_server: no NVIDIA GPU found ({why}). Nothing to check; the proof needs one.")
        return 0
    work = Path(tempfile.mkdtemp(prefix="sy-gpu-"))
    os.environ.setdefault("SWITCHYARD_HOME", str(work / "home"))
    binary = args.binary
    if binary is None:
        if args.source is None:
            print("gpu_llama_server: pass --binary BIN or --source LLAMA_CPP_DIR", file=sys.stderr)
            return 2
        arch = args.arch or (cards[0].compute_capability or "9.0").replace(".", "")
        binary = build_llama_server(args.source, args.build_dir or work / "build", arch=arch)
    models = work / "models"
    models.mkdir(parents=True)
    write_tiny_gguf(models / "large.gguf", LARGE)
    write_tiny_gguf(models / "mid.gguf", MID)
    report: dict[str, Any] = {"gpu": cards[0].name, "driver": cards[0].driver_version, "binary": str(binary)}
    report["models"] = [
        asyncio.run(check_model(models, mid, binary, tokens=args.tokens)) for mid in ("large", "mid")
    ]
    report["ok"] = all(m["ok"] for m in report["models"])
    text = json.dumps(report, indent=2)
    print(text)
    print(markdown(report))
    if args.out:
        args.out.write_text(text + "\n\n" + markdown(report) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
