"""The stop pipe: where no signal reaches an engine (Windows without a console), the server asks it to stop
by closing its standard input, and our workers leave on that at once; an engine that ignores the pipe is
killed after the grace. POSIX keeps SIGTERM; here the pipe is forced on to test the same path on Linux
(tests/windows/checks/platform_checks.py runs it as Windows code, where it is the default)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from app.core.platform.procs import STOP_PIPE_ENV, stop_by_pipe
from app.lanes.proc import EngineProcess, LogRing

WORKER = (
    "import os, sys, time\n"
    "from app.lanes.parentwatch import watch_stop_pipe\n"
    "assert os.environ.get(sys.argv[1]) == '1', 'the stop pipe was not announced'\n"
    "watch_stop_pipe()\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)
REPO = Path(__file__).resolve().parents[2]
DEAF = "print('ready', flush=True)\nimport time\ntime.sleep(120)\n"


async def _started(script: str, tmp: Path, *, stop_pipe: bool) -> tuple[EngineProcess, LogRing]:
    ring = LogRing(max_lines=100, file=None)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    engine = await EngineProcess.spawn(
        (sys.executable, "-c", script, STOP_PIPE_ENV),
        env=env,
        ring=ring,
        on_port=lambda _p: None,
        stop_pipe=stop_pipe,
    )
    deadline = time.monotonic() + 30
    while "ready" not in ring.lines:
        assert engine.proc.returncode is None, list(ring.lines)
        assert time.monotonic() < deadline, list(ring.lines)
        await asyncio.sleep(0.05)
    return engine, ring


def test_the_pipe_is_the_platforms_own_choice() -> None:
    assert stop_by_pipe() is (sys.platform == "win32")


async def test_a_worker_leaves_when_its_stop_pipe_closes(tmp_path: Path) -> None:
    engine, ring = await _started(WORKER, tmp_path, stop_pipe=True)
    started = time.monotonic()
    code = await engine.terminate(grace=20)
    took = time.monotonic() - started
    # exit 0 is the worker's own leaving; a kill after the grace would be -9 and take 20 s
    assert code == 0, (code, list(ring.lines))
    assert took < 5, f"the stop took {took:.1f} s"


async def test_an_engine_deaf_to_the_pipe_is_killed_after_the_grace(tmp_path: Path) -> None:
    engine, _ = await _started(DEAF, tmp_path, stop_pipe=True)
    started = time.monotonic()
    code = await engine.terminate(grace=1)
    assert code == -9 and 0.9 <= time.monotonic() - started < 10


async def test_without_the_pipe_the_worker_is_not_told_and_sigterm_asks(tmp_path: Path) -> None:
    engine, _ = await _started(DEAF, tmp_path, stop_pipe=False)
    assert engine.proc.stdin is None
    assert await engine.terminate(grace=20) == -15
