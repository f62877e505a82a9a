"""What the supervisor adds to an engine's own cold start: ensure() to ready, less the engine's own part.

Each cycle starts a lane on a generated tiny GGUF through a real Runtime (`supervisor.ensure`), then unloads
it. Three instants are taken in the server process: the ensure() call, the spawn (just before
`create_subprocess_exec`) and the moment the engine's first control line (`{"switchyard": "listening" ...}`,
printed once the model is loaded) is read off its stdout; then ensure() returning. So

    before spawn = spawn - call          (plan building, header reads ...)
    after line   = return - line seen    (health polling or the ready line, footprint waits, recording)
    overhead     = before spawn + after line

The engine's own part (spawn to line: interpreter start, imports, the model load) is reported beside it.

Then the lane serves `--requests` chat completions sent straight to the engine by a separate client process:
the server process's CPU time over that burst, less its idle rate, per request, is what reading the engine's
log lines costs the server (`log_cpu_ms_per_req`: nothing else of the server is in that path).

With `--old TREE` (a checkout or an export of an earlier commit, e.g. `git archive HEAD app | tar -x -C
/tmp/old`) the same cycles run against that tree too, in child processes interleaved round by round with the
side that goes first alternating, and the medians of both are printed. Cycle 1 of each child is a warm-up.

    .venv/bin/python bench/lane_cold_start.py                       # this tree only
    .venv/bin/python bench/lane_cold_start.py --old /tmp/old        # old vs new, interleaved

Exits 0 whatever the figures: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIELDS = ("before_spawn_ms", "after_line_ms", "overhead_ms", "engine_ms", "total_ms")
CLIENT = """
import json, sys, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()
for _ in range(n):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=60).read()
"""


# ---- one child: cycles against one tree ---------------------------------------------------------------
async def _log_cost(base_url: str, requests: int) -> float:
    """Server CPU ms per request while a client process talks to the engine directly."""
    idle_wall, idle_cpu = time.perf_counter(), time.process_time()
    await asyncio.sleep(2)
    idle_rate = (time.process_time() - idle_cpu) / (time.perf_counter() - idle_wall)
    wall, cpu = time.perf_counter(), time.process_time()
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, base_url + "/v1/chat/completions", str(requests)
    )
    await client.wait()
    await asyncio.sleep(0.2)  # the batched reader takes the last lines
    used = time.process_time() - cpu - idle_rate * (time.perf_counter() - wall)
    return used * 1000 / requests


async def _cycles(models: Path, cycles: int, requests: int) -> list[dict[str, float]]:
    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.lanes import proc as procmod
    from app.runtime import Runtime

    marks: dict[str, float] = {}
    real_exec = asyncio.create_subprocess_exec
    real_take = procmod.EngineProcess._take

    async def spawn_spy(*args: Any, **kwargs: Any) -> Any:
        marks["spawn"] = time.perf_counter()
        return await real_exec(*args, **kwargs)

    def take_spy(self: Any, data: Any, tag: str) -> None:
        # the old reader hands a list of lines, the new one a chunk: look for the control line in either
        text = b"\n".join(data) if isinstance(data, list) else data
        if tag == "out" and "line" not in marks and b'{"switchyard"' in text:
            marks["line"] = time.perf_counter()
        real_take(self, data, tag)

    asyncio.create_subprocess_exec = spawn_spy  # type: ignore[assignment]
    procmod.EngineProcess._take = take_spy  # type: ignore[method-assign]
    out: list[dict[str, float]] = []
    rt = Runtime(settings=Settings.flat(models_dirs=(models,)), paths=Paths.from_env())
    async with rt:
        for _ in range(cycles):
            marks.clear()
            t0 = time.perf_counter()
            await rt.supervisor.ensure("tiny")
            t1 = time.perf_counter()
            before, after = marks["spawn"] - t0, t1 - marks["line"]
            out.append(
                {
                    "before_spawn_ms": before * 1000,
                    "after_line_ms": after * 1000,
                    "overhead_ms": (before + after) * 1000,
                    "engine_ms": (marks["line"] - marks["spawn"]) * 1000,
                    "total_ms": (t1 - t0) * 1000,
                }
            )
            await rt.supervisor.unload("tiny")
            await asyncio.sleep(0.3)  # let the old engine's exit and the recording settle
        if requests:
            lane = await rt.supervisor.ensure("tiny")
            out[-1]["log_cpu_ms_per_req"] = await _log_cost(lane.base_url, requests)
    return out


def child(tree: Path, models: Path, cycles: int, requests: int) -> None:
    sys.path.insert(0, str(tree))
    os.chdir(tree)
    print(json.dumps(asyncio.run(_cycles(models, cycles, requests))))


# ---- the driver -----------------------------------------------------------------------------------------
def run_child(tree: Path, models: Path, cycles: int, requests: int) -> list[dict[str, float]]:
    home = tempfile.mkdtemp(prefix="sy-bench-home-")
    env = dict(os.environ, SWITCHYARD_HOME=home, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1")
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree), "--models", str(models)]
    done = subprocess.run(
        [*argv, "--cycles", str(cycles), "--requests", str(requests)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"child for {tree} failed:\n{done.stderr[-3000:]}")
    rows: list[dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows[1:]  # cycle 1 warms imports and caches


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {f: statistics.median(r[f] for r in rows) for f in FIELDS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, help="an earlier tree to compare with (interleaved)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cycles", type=int, default=6, help="starts per child (the first is a warm-up)")
    ap.add_argument("--requests", type=int, default=100, help="requests per child for the log cost (0: skip)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--models", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.models, args.cycles, args.requests)
        return 0
    sys.path.insert(0, str(REPO))
    from tests.support.tinymodels import CHAT, write_tiny_gguf

    models = Path(tempfile.mkdtemp(prefix="sy-bench-models-"))
    write_tiny_gguf(models / "tiny.gguf", CHAT)
    sides = {"new": REPO} | ({"old": args.old.resolve()} if args.old else {})
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            rows[name] += run_child(sides[name], models, args.cycles, args.requests)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"{'side':5} " + " ".join(f"{f:>16}" for f in FIELDS) + "   (medians, ms)")
    for name, got in rows.items():
        m = medians(got)
        print(f"{name:5} " + " ".join(f"{m[f]:16.1f}" for f in FIELDS) + f"   n={len(got)}")
    for name, got in rows.items():
        costs = [r["log_cpu_ms_per_req"] for r in got if "log_cpu_ms_per_req" in r]
        if costs:
            print(f"{name:5} log_cpu_ms_per_req median {statistics.median(costs):.3f} (n={len(costs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
