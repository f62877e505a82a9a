"""A lane's start plan is made once and off the event loop (app/lanes/supervisor.py `_prepare`, Lane._start):
the catalog, the pin, the kind choice and its runtime probe, the memory prediction and the plan. A recording
`docker` shim whose `info` takes a second stands in for a slow daemon: a start asks it once, and the loop
keeps turning meanwhile."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from app.core.errors import SwitchyardError
from app.core.paths import Paths
from app.core.settings import Settings
from app.lanes.lane import LaneState
from app.runtime import Runtime
from tests.conftest import link_models

INFO_S = 1.0
# `info` answers after INFO_S (a daemon that is slow to answer); anything else (ps, rm, run) fails at once,
# so the start ends with the engine failing to come up: only the plan is under test here
SHIM = f"""#!{sys.executable}
import json, os, sys, time
args = sys.argv[1:]
with open(os.environ["SHIM_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
if args[:1] == ["info"]:
    time.sleep({INFO_S})
    print(json.dumps({{"Runtimes": {{"runc": {{}}}}}}))
    sys.exit(0)
sys.exit(1)
"""


@pytest.fixture
def shim_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(SHIM)
    (bindir / "docker").chmod(0o755)
    log = tmp_path / "docker.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SHIM_LOG", str(log))
    return log


async def _stall_while(aw: asyncio.Future[object]) -> float:
    """The longest the event loop went without running a 10 ms ticker while `aw` ran."""
    worst, last = 0.0, time.monotonic()
    while not aw.done():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        worst, last = max(worst, now - last), now
    return worst


async def test_a_start_asks_the_runtime_once_and_off_the_loop(
    shim_log: Path, model_store: Path, tmp_path: Path
) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    # residency "memory": the start predicts its footprint first (the memory plan), then builds the plan
    settings = Settings.flat(models_dirs=(models,), runtime="docker", residency="memory")
    async with Runtime(settings=settings, paths=Paths.from_env()) as rt:
        assert rt.supervisor.hardware is not None  # the prediction is made (it needs the hardware)
        start = asyncio.ensure_future(rt.supervisor.ensure("tiny"))
        stall = await _stall_while(start)
        with pytest.raises(SwitchyardError):
            await start  # the shim's `run` fails: the engine never comes up
        lane = rt.supervisor.lanes["tiny"]
        assert lane.state is LaneState.FAILED and lane.plan is not None and lane.plan.runtime == "docker"
    calls = [json.loads(line) for line in shim_log.read_text().splitlines()]  # noqa: ASYNC240
    infos = [c for c in calls if c[:1] == ["info"]]
    assert len(infos) == 1, calls  # the kind choice, the prediction and the build share one answer
    assert stall < INFO_S / 2, f"the event loop stalled {stall:.2f} s during the start"
