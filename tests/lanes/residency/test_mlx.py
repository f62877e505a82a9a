"""The MLX lane's contract under residency, for real: `mlx_lm.server` (mlx's CPU build) on generated llama
folders, in-process. capacity "runtime-managed", the trained window as `ctx`, no KV estimate, no context
flag, co-residency on the measured settle footprint only, and the prompt bounded by the window (counted
with the model's own tokenizer.json)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.core.errors import ContextLengthExceededError
from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.server.gateway.prompt_window import check_window, mlx_window
from tests.lanes.residency.test_memory import settled
from tests.support.mlxgen import write_mlx_llama

pytest.importorskip("mlx_lm")
pytest.importorskip("tokenizers")

WINDOW = 64
DEFAULT_CTX = 96  # the configured default context: the bound of a folder whose config.json has no window


@pytest.fixture(scope="module")
def mlx_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("mlx-residency")
    for name, window in (("small-mlx", WINDOW), ("nowindow-mlx", None)):
        folder = write_mlx_llama(d / name)
        cfg = json.loads((folder / "config.json").read_text())
        cfg.pop("max_position_embeddings")
        if window is not None:
            cfg["max_position_embeddings"] = window
        (folder / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture
async def rt(mlx_models: Path) -> AsyncIterator[Runtime]:
    s = Settings.flat(
        models_dirs=(mlx_models,),
        residency="memory",
        max_loaded_lanes=2,
        ctx_size=DEFAULT_CTX,
        mlx_prompt_cache_size=4,  # mlx-lm's own prompt cache: MLX lanes do not bank
        mlx_prompt_cache_mib=64,
    )
    async with Runtime(settings=s, paths=Paths.from_env()) as runtime:
        yield runtime


async def test_mlx_lane_contract_and_window_preflight(rt: Runtime) -> None:
    sup = rt.supervisor
    idle = sup.lane_for(rt.catalog.get("nowindow-mlx"))  # never started: its row still tells the window
    row = {r["model"]: r for r in sup.snapshot()}["nowindow-mlx"]
    assert row["capacity"] == "runtime-managed" and row["ctx"] == 0 and row["kv_estimate"] is None
    assert sup.need_of(idle) is None  # no prediction for MLX: measured only

    lane = await sup.load("small-mlx")
    assert lane.plan is not None
    assert not any("ctx" in a or "context" in a or "max-tokens" in a for a in lane.plan.argv)
    argv = " ".join(lane.plan.argv)  # and the engine, started with them, took its prompt-cache knobs
    assert "--prompt-cache-size 4" in argv and f"--prompt-cache-bytes {64 << 20}" in argv
    await settled(rt, "small-mlx")
    row = {r["model"]: r for r in sup.snapshot()}["small-mlx"]
    assert row["capacity"] == "runtime-managed" and row["ctx"] == WINDOW and row["kv_estimate"] is None
    fp = row["footprint"]
    assert isinstance(fp, dict) and fp["source"] == "measured" and fp["total"] > 10 << 20
    assert sup.need_of(lane) == sup.settled["small-mlx"]

    # the prompt is counted with the model's tokenizer: 3 words fit, a window's worth does not
    assert mlx_window(lane, rt.settings) == (WINDOW, Path(lane.plan.params.model_path))
    short = {"messages": [{"role": "user", "content": "w3 w4 w5"}]}
    await check_window(lane, short, route="chat", settings=rt.settings)
    long = {"messages": [{"role": "user", "content": [{"type": "text", "text": "w3 " * WINDOW}]}]}
    with pytest.raises(ContextLengthExceededError, match=rf"at least {WINDOW} tokens.*window of {WINDOW}"):
        await check_window(lane, long, route="chat", settings=rt.settings)
    with pytest.raises(ContextLengthExceededError) as exc:
        await check_window(lane, {"prompt": ["w3", "w4 " * 70]}, route="completions", settings=rt.settings)
    assert exc.value.param == "prompt" and "70 tokens" in exc.value.message
    assert "max_position_embeddings in its config.json" in exc.value.message

    # the folder without a trained window, started for real: ctx 0, and admission falls back to the
    # configured default context (a prompt past the other model's 64-token window fits; past 96 does not)
    bare = await sup.load("nowindow-mlx")
    assert bare.plan is not None and getattr(bare.plan.params, "trained_context", "?") is None
    assert {r["model"]: r for r in sup.snapshot()}["nowindow-mlx"]["ctx"] == 0
    assert mlx_window(bare, rt.settings) == (DEFAULT_CTX, Path(bare.plan.params.model_path))
    between = {"messages": [{"role": "user", "content": "w3 " * 80}]}
    with pytest.raises(ContextLengthExceededError):
        await check_window(lane, between, route="chat", settings=rt.settings)
    await check_window(bare, between, route="chat", settings=rt.settings)
    with pytest.raises(ContextLengthExceededError, match=rf"window of {DEFAULT_CTX} tokens") as exc:
        await check_window(
            bare, {"messages": [{"role": "user", "content": "w3 " * 120}]}, route="chat", settings=rt.settings
        )
    assert "max_position_embeddings" not in exc.value.message
    assert "no trained window" in exc.value.message and "ctx_size" in exc.value.message
