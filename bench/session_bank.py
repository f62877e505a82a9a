"""Session banking: the returning turn of a long conversation after a swap, banked against not banked.

Two `switchyard serve` processes run side by side, alike but for `session_bank` (on / off), each with the
large generated model (tests/support/tinymodels.py LARGE: 512 wide, 8 layers) and the tiny one, one lane at a
time
(`single` residency, `max_loaded_lanes` 1), one 4096-token slot. For each pair, on both servers in turn
(which side goes first alternates):

1. a new conversation on the large model is grown to about `--tokens` prompt tokens (three turns);
2. one request to the tiny model: the large lane is swapped out (banking on: its slot is saved);
3. `POST /api/models/large/load`: the large lane is started again and is ready;
4. the next turn of the conversation, streamed: time to first token is taken from here (engine start-up
   is not in it), and the answer's `cached_tokens`.

Printed: TTFT per side (median and each pair), the banked/unbanked ratio, the checkpoint's size and the
restore time (the bank's own counters). Exits 0 whatever the figures: a benchmark, not a test.

    .venv/bin/python bench/session_bank.py --pairs 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.tinymodels import CHAT, LARGE, write_tiny_gguf  # noqa: E402

PINNED = {"grammar": 'root ::= "the answer is 42"'}


class Server:
    """One `python -m app serve` on a free port in its own home."""

    def __init__(self, home: Path, models: Path, *, bank: bool) -> None:
        home.mkdir(parents=True)
        settings = {"max_loaded_lanes": 1, "parallel": 1, "ctx_size": 4096, "session_bank": bank}
        (home / "settings.json").write_text(json.dumps(settings))
        env = dict(os.environ, SWITCHYARD_HOME=str(home), PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
        argv = [sys.executable, "-m", "app", "serve", "--port", "0", "--models-dir", str(models)]
        argv += ["--log-level", "warning"]
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        self.url = ""
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.startswith("listening on "):
                    self.url = line.split()[-1]
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(60):
            raise SystemExit("serve did not start")
        self.http = httpx.Client(base_url=self.url, timeout=300)

    def chat(self, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": model, "messages": messages, "max_tokens": 24, **PINNED}
        r = self.http.post("/v1/chat/completions", json=body)
        if r.status_code != 200:
            raise SystemExit(f"{model}: HTTP {r.status_code}: {r.text}")
        return dict(r.json())

    def ttft(self, model: str, messages: list[dict[str, Any]]) -> tuple[float, int]:
        """(seconds to the first content token, cached prompt tokens) of one streamed turn."""
        body = {"model": model, "messages": messages, "max_tokens": 24, "stream": True, **PINNED}
        body["stream_options"] = {"include_usage": True}
        t0 = time.perf_counter()
        first, cached = 0.0, 0
        with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                choices = event.get("choices") or []
                if not first and choices and (choices[0].get("delta") or {}).get("content"):
                    first = time.perf_counter() - t0
                usage = event.get("usage") or {}
                cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or cached)
        return first, cached

    def metric(self, name: str) -> float:
        for line in self.http.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _conversation(pair: int, tokens: int) -> list[dict[str, Any]]:
    # the byte-fallback vocabulary makes one token of each byte: a turn of N characters is N tokens
    per = tokens // 3
    return [{"role": "system", "content": f"Conversation {pair}. " + "Keep careful notes. " * (per // 20)}]


def _one_side(s: Server, pair: int, tokens: int) -> dict[str, float]:
    convo = _conversation(pair, tokens)
    per = tokens // 3
    for turn in range(2):
        convo.append(
            {"role": "user", "content": f"Part {turn}: " + "the river bends east here. " * (per // 27)}
        )
        answer = s.chat("large", convo)
        convo.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
    prompt = int(answer["usage"]["prompt_tokens"])
    s.chat("tiny", [{"role": "user", "content": "hello"}])  # swaps the large lane out
    restore_before = s.metric("switchyard_session_bank_restore_seconds_total")
    s.http.post("/api/models/large/load").raise_for_status()
    convo.append({"role": "user", "content": "And what comes after that?"})
    ttft, cached = s.ttft("large", convo)
    restore = s.metric("switchyard_session_bank_restore_seconds_total") - restore_before
    return {"ttft_s": ttft, "cached": cached, "prompt_tokens": prompt, "restore_s": restore}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=3000, help="the conversation's prompt before the swap")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-bank-"))
    models = root / "models"
    models.mkdir()
    # LARGE's weights and shape, with a trained window that holds the conversation (LARGE says 2048)
    write_tiny_gguf(models / "large.gguf", dataclasses.replace(LARGE, n_ctx_train=8192))
    write_tiny_gguf(models / "tiny.gguf", CHAT)
    sides = {
        "banked": Server(root / "on", models, bank=True),
        "unbanked": Server(root / "off", models, bank=False),
    }
    runs: dict[str, list[dict[str, float]]] = {"banked": [], "unbanked": []}
    try:
        for pair in range(args.pairs):
            order = ["banked", "unbanked"] if pair % 2 == 0 else ["unbanked", "banked"]
            for name in order:
                runs[name].append(_one_side(sides[name], pair, args.tokens))
        bank = sides["banked"].http.get("/api/bank").json()
    finally:
        for s in sides.values():
            s.stop()
    for name, rows in runs.items():
        ttfts = [r["ttft_s"] for r in rows]
        print(
            f"{name:9s} TTFT median {statistics.median(ttfts) * 1000:7.1f} ms  each "
            + " ".join(f"{t * 1000:.0f}" for t in ttfts)
            + f"  cached {[int(r['cached']) for r in rows]}  prompt ~{int(rows[0]['prompt_tokens'])} tokens"
        )
    ratios = [b["ttft_s"] / u["ttft_s"] for b, u in zip(runs["banked"], runs["unbanked"], strict=True)]
    print(
        f"banked / unbanked TTFT: median {statistics.median(ratios):.3f}, "
        f"each {[round(r, 3) for r in ratios]}"
    )
    restores = [r["restore_s"] for r in runs["banked"]]
    print(f"restore (the bank's own timing): median {statistics.median(restores) * 1000:.1f} ms")
    sizes = [c["bytes"] for c in bank["checkpoints"]]
    tokens = [c["tokens"] for c in bank["checkpoints"]]
    if sizes:
        per_token = statistics.median(s / t for s, t in zip(sizes, tokens, strict=True) if t)
        print(
            f"checkpoints: {len(sizes)}, median {statistics.median(sizes) / 2**20:.1f} MiB for "
            f"{int(statistics.median(tokens))} tokens ({per_token / 1024:.1f} KiB per token)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
