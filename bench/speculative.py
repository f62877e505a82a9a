"""Speculative decoding on the llama.cpp lane, side by side in one run (issue 16).

A real `switchyard serve` holds the LARGE generated model (512 wide, 8 layers, f32) and a q8_0 copy of the
same weights (it shares the tokenizer, so it can draft). For each lane setting — speculation off, each
n-gram type, the q8_0 draft — `POST /api/models/large/load` restarts the lane with it, then two workloads
run greedy:

  copy  a grammar forces the answer to repeat a passage of the prompt (as code editing does)
  free  free generation, `ignore_eos`, the same number of tokens

and, for the draft, the copy workload at temperature 0.8 (where a draft's guesses are mostly refused).
Tokens per second are the engine's own (`timings.predicted_per_second`, best of `--repeat`); `x off` is
against the "off" row; `accepted` is draft_n_accepted / draft_n; `same` says the copy answer was
byte-identical to the passage. The machine's load average is printed: on a shared machine, read the
ratios, not the figures.

    .venv/bin/python bench/speculative.py [--repeat 2] [--tokens 256]

Exits 0 whatever the figures: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import gguf
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import running_server  # noqa: E402
from tests.support.tinymodels import LARGE, write_tiny_gguf  # noqa: E402

PASSAGE = "def scale(values, factor):\n    return [v * factor for v in values]\n\n" * 3
SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("off", {"type": "off"}),
    ("ngram_simple", {"type": "ngram_simple"}),
    ("ngram_map_k", {"type": "ngram_map_k"}),
    ("ngram_map_k4v", {"type": "ngram_map_k4v"}),
    ("ngram_mod", {"type": "ngram_mod"}),
    ("ngram_cache", {"type": "ngram_cache"}),
    ("draft q8_0", {"type": "draft", "draft": "large-q8_0", "n_max": 8}),
]


def write_q8_copy(src: Path, dest: Path) -> Path:
    """`src` with every 2-D weight quantized to q8_0 (norms stay f32): the same model, a smaller file."""
    reader = gguf.GGUFReader(str(src), "r")
    w = gguf.GGUFWriter(str(dest), "llama")
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            items = [bytes(f.parts[i]) if sub == gguf.GGUFValueType.STRING else f.parts[i][0] for i in f.data]
            w.add_array(name, [i.decode() if isinstance(i, bytes) else i.item() for i in items])
        elif f.types[0] == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[f.data[0]]).decode())
        else:
            w.add_key_value(name, f.parts[f.data[0]][0].item(), f.types[0])
    for t in reader.tensors:
        data = np.array(t.data, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
        if data.ndim == 2:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        out: dict[str, Any] = json.loads(r.read())
    return out


def one(url: str, workload: str, *, tokens: int, temperature: float) -> dict[str, Any]:
    if workload == "copy":
        extra: dict[str, Any] = {"grammar": "root ::= " + json.dumps(PASSAGE)}
        prompt = "Repeat this exactly:\n" + PASSAGE
        tokens = len(PASSAGE.encode()) + 8  # at most a token per byte: room for the whole passage
    else:
        extra = {"ignore_eos": True}
        prompt = "Write a long story about a lighthouse keeper."
    body = {"model": "large", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens}
    out = post(url + "/v1/chat/completions", {**body, **extra, "temperature": temperature})
    t = out.get("timings") or {}
    return {
        "tps": float(t.get("predicted_per_second") or 0.0),
        "drafted": int(t.get("draft_n") or 0),
        "accepted": int(t.get("draft_n_accepted") or 0),
        "same": out["choices"][0]["message"]["content"] == PASSAGE if workload == "copy" else None,
    }


def best(url: str, workload: str, *, repeat: int, tokens: int, temperature: float = 0.0) -> dict[str, Any]:
    runs = [one(url, workload, tokens=tokens, temperature=temperature) for _ in range(repeat)]
    return max(runs, key=lambda r: r["tps"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=160, help="tokens of free generation")
    ap.add_argument("--threads", type=int, default=0, help="engine threads (0: the usable cores)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        large = write_tiny_gguf(root / "models" / "large.gguf", LARGE)
        write_q8_copy(large, root / "models" / "large-q8_0.gguf")
        (root / "home").mkdir()
        (root / "home" / "settings.json").write_text(json.dumps({"threads": args.threads}))
        rows: list[tuple[str, str, dict[str, Any]]] = []
        with running_server(root / "home", root / "models") as s:
            for label, spec in SETTINGS:
                post(s.url + "/api/models/large/load", {"speculative": spec, "parallel": 1})
                for workload in ("copy", "free"):
                    rows.append(
                        (label, workload, best(s.url, workload, repeat=args.repeat, tokens=args.tokens))
                    )
                if spec["type"] == "draft":
                    r = best(s.url, "copy", repeat=args.repeat, tokens=args.tokens, temperature=0.8)
                    rows.append((label, "copy T=0.8", r))
        load = os.getloadavg()[0]
        print(
            f"load average {load:.1f}, {os.cpu_count()} cores, best of {args.repeat}, threads {args.threads}"
        )
        base = {w: r["tps"] for lbl, w, r in rows if lbl == "off"}
        print("| setting | workload | tok/s | x off | drafted | accepted | same |")
        print("|---|---|---:|---:|---:|---:|---|")
        for label, workload, r in rows:
            ref = base.get(workload.split()[0]) or 0.0
            ratio = f"{r['tps'] / ref:.2f}" if ref else "-"
            acc = f"{100 * r['accepted'] / r['drafted']:.0f} %" if r["drafted"] else "-"
            same = "" if r["same"] is None else ("yes" if r["same"] else "no")
            print(f"| {label} | {workload} | {r['tps']:.1f} | {ratio} | {r['drafted']} | {acc} | {same} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
