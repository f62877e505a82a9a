"""The split lane's plan (app/fit/split.py): placement rules on their own, and each machine's planned
weights, KV cache and compute checked against the buffers the real llama.cpp RPC build reports when it
loads with the plan's flags over two real ggml-rpc-server workers on 127.0.0.1."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from app.core.errors import BadRequestError
from app.fit.memory import MIB, FitParams
from app.fit.split import SplitMachine, SplitPlan, plan_split
from app.formats.gguf_layout import GGUFLayout, read_gguf_layout
from app.lanes.peers.rpc import HEAD, WORKER, missing_build_advice, rpc_bin
from tests.support.tinymodels import TinySpec, write_tiny_gguf

# ten layers of 3.0 MiB (f32), 2 KiB of KV per cell per layer: one layer placed wrong moves megabytes
SPLIT_MODEL = TinySpec(n_embd=256, n_layer=10, n_head=4, n_head_kv=2, n_ff=768, n_ctx_train=8192, seed=34)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("split") / "split10.gguf", SPLIT_MODEL)


@pytest.fixture(scope="module")
def layout(model: Path) -> GGUFLayout:
    lay = read_gguf_layout(model)
    assert isinstance(lay, GGUFLayout)
    return lay


def head(mib: float, bandwidth: float | None = 20e9) -> SplitMachine:
    return SplitMachine("", int(mib * MIB), bandwidth)


def peer(name: str, mib: float, bandwidth: float | None = 10e9, rtt_s: float = 0.001) -> SplitMachine:
    return SplitMachine(name, int(mib * MIB), bandwidth, rtt_s)


def placed_layers(plan: SplitPlan, n_layer: int) -> list[int]:
    """Which machine (0 = head, i = i-th worker) llama.cpp puts each layer and the output layer on, by its
    own rule (llama-model.cpp load_tensors), from the plan's flags alone: float32 cumulative proportions,
    upper_bound over them."""
    args = plan.engine_args()
    ngl = int(args[args.index("-ngl") + 1])
    split = (
        [float(x) for x in args[args.index("--tensor-split") + 1].split(",")]
        if "--tensor-split" in args
        else []
    )
    cum = np.cumsum(np.array(split, dtype=np.float32), dtype=np.float32)
    cum = (cum / cum[-1]).astype(np.float32) if len(cum) else cum
    start, act = max(n_layer + 1 - ngl, 0), min(ngl, n_layer + 1)
    out = []
    for il in range(n_layer + 1):
        if il < start or il - start >= act:
            out.append(0)
            continue
        f = np.float32(il - start) / np.float32(act)
        out.append(1 + int(np.searchsorted(cum, f, side="right")))
    return out


def planned_layers(plan: SplitPlan) -> list[int]:
    out = []
    for i, s in enumerate(plan.shares):
        out += [i] * s.layers
    last = len(plan.shares) - 1
    return [*out, last]  # the output layer: with the last worker, or on the head when it is alone


# ------------------------------------------------------------------------------------------ placement


def test_fits_no_single_machine_but_the_pair(layout: GGUFLayout) -> None:
    params = FitParams(ctx_size=4096)
    alone = plan_split(layout, params=params, head=head(90), workers=[])
    assert not alone.fits
    assert "short" in alone.reason and "this machine" in alone.reason
    plan = plan_split(layout, params=params, head=head(90), workers=[peer("b", 80)])
    assert plan.fits, plan.reason
    assert [s.machine for s in plan.shares] == ["", "b"] and plan.workers == ("b",)
    assert sum(s.layers for s in plan.shares) == layout.block_count
    for s in plan.shares:
        assert 0 < s.total <= s.budget
        assert s.weights > 0 and s.kv > 0 and s.compute > 0
    # the offer carries the numbers: what one machine would need, and each machine's part
    assert "no fewer hold it" in plan.reason and "MiB" in plan.reason
    assert f"peer b {plan.shares[1].layers} layers" in plan.reason
    assert plan.shares[-1].output and not plan.shares[0].output
    assert plan.engine_args()[:2] == ["-ngl", str(plan.shares[1].layers + 1)]
    assert plan.engine_args()[-2:] == ["--fit", "off"]
    assert placed_layers(plan, layout.block_count) == planned_layers(plan)
    # bandwidth bound plus one round trip to b per token
    assert plan.tokens_per_s is not None and "1 network round trip (1.0 ms)" in plan.speed_note
    public = plan.public()
    assert public["machines"][1]["machine"] == "b" and public["engine_args"] == plan.engine_args()


def test_fewest_machines_then_the_faster(layout: GGUFLayout) -> None:
    params = FitParams(ctx_size=4096)
    every = [peer("slow", 200, bandwidth=1e9), peer("fast", 200, bandwidth=50e9), peer("spare", 200)]
    plan = plan_split(layout, params=params, head=head(70), workers=every)
    assert plan.fits and plan.workers == ("fast",)  # one worker is enough: the others cost a hop for nothing
    roomy = plan_split(layout, params=params, head=head(200), workers=every)
    assert roomy.fits and roomy.workers == () and roomy.engine_args() == ["-ngl", "0", "--fit", "off"]
    unknown = plan_split(layout, params=params, head=head(70), workers=[peer("b", 200, bandwidth=None)])
    assert unknown.tokens_per_s is None and "peer b not measured" in unknown.speed_note


def test_three_machines_in_rpc_order_follow_the_engine_rule(layout: GGUFLayout) -> None:
    for ctx, budgets in ((2048, (55, 60, 60)), (8192, (85, 50, 70)), (8192, (90, 70, 50))):
        plan = plan_split(
            layout,
            params=FitParams(ctx_size=ctx),
            head=head(budgets[0]),
            workers=[peer("b", budgets[1]), peer("c", budgets[2])],
        )
        assert plan.fits and plan.workers == ("b", "c"), plan.reason
        assert all(s.total <= s.budget for s in plan.shares)
        assert plan.shares[0].layers >= 1  # no pipeline parallelism (its four input copies are not planned)
        assert placed_layers(plan, layout.block_count) == planned_layers(plan)


def test_one_worker_may_take_every_layer(layout: GGUFLayout) -> None:
    plan = plan_split(layout, params=FitParams(ctx_size=8192), head=head(60), workers=[peer("b", 200)])
    assert plan.fits and plan.shares[0].layers == 0 and plan.shares[1].layers == layout.block_count
    assert plan.n_gpu_layers == layout.block_count + 1
    assert placed_layers(plan, layout.block_count) == planned_layers(plan)


def test_fitting_nowhere_says_what_is_short(layout: GGUFLayout) -> None:
    plan = plan_split(
        layout, params=FitParams(ctx_size=8192), head=head(60), workers=[peer("b", 40), peer("c", 40)]
    )
    assert not plan.fits
    assert "does not fit across 3 machines" in plan.reason and "short in all" in plan.reason
    over = [s for s in plan.shares if s.over]
    assert over and all(f"{s.over / MIB:.1f} MiB over" in plan.reason for s in over)
    assert sum(s.layers for s in plan.shares) == layout.block_count  # the attempt still places every layer
    tight = plan_split(
        layout, params=FitParams(ctx_size=4096), head=head(70), workers=[peer("b", 45), peer("c", 45)]
    )
    assert not tight.fits and "do not divide among these budgets" in tight.reason


def test_bad_workers_are_refused(layout: GGUFLayout) -> None:
    params = FitParams(ctx_size=2048)
    with pytest.raises(BadRequestError, match="named twice"):
        plan_split(layout, params=params, head=head(60), workers=[peer("b", 50), peer("b", 50)])
    with pytest.raises(BadRequestError, match="peer's name"):
        plan_split(layout, params=params, head=head(60), workers=[peer("", 50)])


# ------------------------------------------------------------------------- against the real engine

_BUFFER = re.compile(
    r"(?:(?P<cpu>CPU\w*)|RPC\d+\[[^\]:]+:(?P<port>\d+)\])\s+(?P<what>model|KV|compute)"
    r"\s+buffer size\s*=\s*(?P<mib>[0-9.]+) MiB"
)


@dataclass(frozen=True)
class Case:
    ctx: int
    head_mib: float
    worker_mib: tuple[float, ...]
    layers: tuple[int, ...]  # the split this case is chosen to exercise


CASES = {
    # head 1, b 8, c the last layer and the output layer
    "uneven-2k": Case(2048, 55, (60, 60), (1, 8, 1)),
    "three-ways-8k": Case(8192, 85, (50, 70), (4, 2, 4)),
    # the head keeps only the embeddings; the one worker holds every layer and the output layer
    "one-worker-all-8k": Case(8192, 60, (200,), (0, 10)),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _listening(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"ggml-rpc-server on {port} exited with {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"ggml-rpc-server did not listen on {port}")


def _measure(
    model: Path, plan: SplitPlan, ctx: int, bin_dir: Path, started: list[tuple[int, subprocess.Popen[str]]]
) -> dict[str, dict[str, int]]:
    """Start one worker per planned peer and the head with the plan's flags; read each machine's buffers."""
    # the build's own shared libraries where it has them; an abort exits at once, without a debugger's stack
    env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir), "GGML_NO_BACKTRACE": "1"}
    ports: dict[int, str] = {}
    for name in plan.workers:
        port = _free_port()
        proc = subprocess.Popen(
            [str(bin_dir / WORKER), "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        started.append((port, proc))
        _listening(port, proc)
        ports[port] = name
    argv = [
        str(bin_dir / HEAD), "-m", str(model), "-c", str(ctx), "-np", "1", "-lv", "4",
        "--host", "127.0.0.1", "--port", str(_free_port()),
        "--rpc", ",".join(f"127.0.0.1:{p}" for p in ports), *plan.engine_args(),
    ]  # fmt: skip
    engine = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    watchdog = threading.Timer(60, engine.kill)
    watchdog.start()
    seen: dict[str, dict[str, int]] = {}
    tail: list[str] = []
    try:
        assert engine.stdout is not None
        for line in engine.stdout:
            tail = [*tail[-30:], line]
            m = _BUFFER.search(line)
            if m:
                machine = "" if m["cpu"] else ports[int(m["port"])]
                part = {"model": "weights", "KV": "kv", "compute": "compute"}[m["what"]]
                seen.setdefault(machine, {}).setdefault(part, 0)
                seen[machine][part] += round(float(m["mib"]) * MIB)
            if "listening on" in line:
                break
        else:
            raise AssertionError("llama-server stopped before it listened:\n" + "".join(tail))
    finally:
        watchdog.cancel()
        # its buffers are read; a head connected to workers can sit out SIGTERM for seconds
        engine.kill()
        engine.wait()
    return seen


@pytest.mark.parametrize("case", list(CASES))
def test_plan_matches_the_engines_buffers(model: Path, layout: GGUFLayout, case: str) -> None:
    bin_dir = rpc_bin()
    if bin_dir is None:
        pytest.skip(missing_build_advice())
    c = CASES[case]
    names = ("b", "c")
    plan = plan_split(
        layout,
        params=FitParams(ctx_size=c.ctx),
        head=head(c.head_mib),
        workers=[peer(n, mib) for n, mib in zip(names, c.worker_mib, strict=False)],
    )
    assert plan.fits, plan.reason
    assert tuple(s.layers for s in plan.shares) == c.layers
    started: list[tuple[int, subprocess.Popen[str]]] = []
    try:
        seen = _measure(model, plan, c.ctx, bin_dir, started)
    finally:
        for _, proc in started:
            _stop(proc)
    assert set(seen) == {s.machine for s in plan.shares}
    # the log rounds to 0.01 MiB; the plan must agree within 1 MiB per machine and part
    for s in plan.shares:
        got = seen[s.machine]
        for part, planned in (("weights", s.weights), ("kv", s.kv), ("compute", s.compute)):
            assert abs(planned - got.get(part, 0)) <= MIB, (case, s.machine or "head", part, planned, got)
