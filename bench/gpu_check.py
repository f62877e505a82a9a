"""`python bench/gpu_check.py [--model DIR] [--engines vllm,sglang] [--out FILE]`: start the vLLM and SGLang
lanes for real on an NVIDIA GPU and check them against their plans.

For each engine that is installed: build the lane's command exactly as the supervisor does
(app/lanes/engines/cuda.py, the share from app/fit/gpu_share.py), start it, wait for /health, send one chat
request and one completion, read the GPU memory the engine's processes hold (NVML), and compare it with
the plan's prediction. Then both engines at once on one card, each with its planned fraction, to show two
GPU lanes share it. Prints one JSON report (and writes it to --out).

Without --model it writes a small llama model with zero weights and a tiny tokenizer (needs the
`tokenizers` package, which vLLM and SGLang install): enough to test the plumbing and the memory budget.
Pass a real small model folder (e.g. a local Qwen2.5-0.5B-Instruct) to see real text.

On a machine without an NVIDIA GPU, or without either engine, it says so and exits 0.

`python bench/gpu_check.py llama-server [--binary BIN | --source LLAMA_CPP_DIR]` is the llama-server
runtime's proof instead (bench/gpu_llama_server.py: CUDA build, GPU serving, tokens/s, buffers vs plan).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core.settings import Settings  # noqa: E402
from app.hardware.probe import probe  # noqa: E402
from app.lanes.engines.cuda import nvidia_cards  # noqa: E402
from app.lanes.engines.plan import LaunchPlan, StartContext  # noqa: E402
from app.lanes.engines.registry import engine_kinds  # noqa: E402
from app.library.model import ModelEntry  # noqa: E402

READY_TIMEOUT_S = 900


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_small_model(folder: Path) -> Path:
    """A llama with zero weights (bf16), 2 layers, and a word-level tokenizer with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.support.modelgen import LlamaDims, llama_tensors, write_hf_dir

    dims = LlamaDims(n_layer=2, hidden=256, heads=8, kv_heads=4, ff=512, vocab=512)
    write_hf_dir(folder, dims.config(bos_token_id=1, eos_token_id=2), llama_tensors(dims))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, dims.vocab)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "chat_template": template,
            }
        )
    )
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return folder


def gpu_bytes_of(pids: set[int]) -> dict[str, int]:
    import pynvml

    pynvml.nvmlInit()
    try:
        out: dict[str, int] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if p.pid in pids and p.usedGpuMemory:
                    out[f"GPU{i}"] = out.get(f"GPU{i}", 0) + int(p.usedGpuMemory)
        return out
    finally:
        pynvml.nvmlShutdown()


def tree(pid: int) -> set[int]:
    import psutil

    try:
        proc = psutil.Process(pid)
        return {pid, *(c.pid for c in proc.children(recursive=True))}
    except psutil.Error:
        return {pid}


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return dict(json.loads(r.read()))


class Started:
    def __init__(self, engine: str, plan: LaunchPlan, log: Path) -> None:
        self.engine, self.plan, self.log = engine, plan, log
        self.t0 = time.monotonic()
        self.fh = log.open("w")
        self.proc = subprocess.Popen(
            plan.argv, env=plan.env, stdout=self.fh, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.plan.port}"

    def wait_ready(self) -> float:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.engine} exited with {self.proc.returncode}; log: {self.tail()}")
            try:
                with urllib.request.urlopen(self.url + self.plan.health_path, timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - self.t0
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.engine} not ready in {READY_TIMEOUT_S} s; log: {self.tail()}")

    def tail(self, n: int = 30) -> str:
        self.fh.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.fh.close()


def check_one(s: Started, model_id: str) -> dict[str, Any]:
    ready_s = s.wait_ready()
    chat = post(
        s.url + "/v1/chat/completions",
        {"model": model_id, "messages": [{"role": "user", "content": "w3 w4"}], "max_tokens": 8},
    )
    comp = post(s.url + "/v1/completions", {"model": model_id, "prompt": "w5 w6", "max_tokens": 8})
    measured = gpu_bytes_of(tree(s.proc.pid))
    predicted = s.plan.predicted() or {}
    per_card = {d["device"]: int(d["total"]) for d in predicted.get("devices", [])}
    return {
        "engine": s.engine,
        "ready_s": round(ready_s, 1),
        "argv": list(s.plan.argv),
        "fraction": s.plan.params.fraction,
        "chat_ok": bool(chat.get("choices"))
        and isinstance(chat["choices"][0]["message"].get("content"), str),
        "completion_ok": bool(comp.get("choices")),
        "chat_text": chat["choices"][0]["message"].get("content") if chat.get("choices") else None,
        "predicted_bytes": per_card,
        "measured_bytes": measured,
        "measured_over_predicted": {k: round(measured.get(k, 0) / v, 3) for k, v in per_card.items() if v},
    }


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["llama-server"]:  # the llama-server runtime's proof (bench/gpu_llama_server.py)
        sys.path.insert(0, str(REPO / "bench"))
        from gpu_llama_server import main as llama_server_main

        return llama_server_main(args_in[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="a local Hugging Face model folder (default: a generated one)")
    ap.add_argument("--engines", default="vllm,sglang")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    hw = probe(bandwidth_cache=None)
    if not nvidia_cards(hw):
        print("gpu_check: no NVIDIA GPU found (NVML); vLLM and SGLang cannot run here. Nothing to check.")
        return 0
    wanted = [e for e in args.engines.split(",") if e]
    kinds = engine_kinds()
    settings = Settings.flat(ctx_size=2048, parallel=4)
    # installed as the lanes see it: an engine environment of its own (`switchyard engine install`) or this
    # interpreter
    present = [e for e in wanted if e in kinds and kinds[e].install(settings).installed]
    if not present:
        print(
            f"gpu_check: none of {', '.join(wanted)} is installed; `switchyard engine install vllm` "
            f"(or sglang), or `pip install vllm` into {sys.executable}, first."
        )
        return 0
    work = Path(tempfile.mkdtemp(prefix="sy-gpu-check-"))
    folder = args.model or write_small_model(work / "small-llama")
    model_id = "gpu-check"
    entry = ModelEntry(model_id, folder, None, None, format="safetensors", kind_name="chat")
    report: dict[str, Any] = {
        "gpus": [g.public() for g in nvidia_cards(hw)],
        "model": str(folder),
        "runs": [],
    }
    # one at a time, then every present engine at once on the same card(s), each with its own share
    for engine in present:
        plan = kinds[engine].build(
            entry,
            settings,
            StartContext(ppid=os.getpid(), port=free_port(), hardware=hw),
        )
        s = Started(engine, plan, work / f"{engine}.log")
        try:
            report["runs"].append(check_one(s, model_id))
        except Exception as exc:  # report and go on: one engine's failure says nothing about the other
            report["runs"].append({"engine": engine, "error": str(exc)})
        finally:
            s.stop()
    if len(present) > 1:
        used: dict[str, int] = {}
        started: list[Started] = []
        together: list[dict[str, Any]] = []
        try:
            for engine in present:
                plan = kinds[engine].build(
                    entry,
                    settings,
                    StartContext(ppid=os.getpid(), port=free_port(), hardware=hw, used=used),
                )
                for d in (plan.predicted() or {}).get("devices", []):
                    used[d["device"]] = used.get(d["device"], 0) + int(d["total"])
                s = Started(engine, plan, work / f"{engine}-shared.log")
                started.append(s)
                s.wait_ready()  # one after another: each measures free memory when it starts
            for s in started:
                together.append(check_one(s, model_id))
        except Exception as exc:
            together.append({"error": str(exc)})
        finally:
            for s in started:
                s.stop()
        report["shared_card"] = together
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    ok = all(r.get("chat_ok") for r in report["runs"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
