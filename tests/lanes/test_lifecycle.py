"""The lane state machine and the supervisor, in-process, with real engine processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from app.core.errors import EngineStartError, LaneBusyError
from app.core.events import Event, EventBus
from app.core.paths import Paths
from app.core.settings import Settings
from app.lanes.lane import LaneState
from app.runtime import Runtime
from tests.conftest import link_models
from tests.support.tinymodels import write_unknown_arch_gguf


class Recorder:
    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.events: list[Event] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Recorder:
        ready = asyncio.Event()

        async def run() -> None:
            async with self.bus.subscribe() as q:
                ready.set()
                while True:
                    self.events.append(await q.get())

        self._task = asyncio.create_task(run())
        await ready.wait()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def transitions(self, lane: str) -> list[tuple[str, str]]:
        return [
            (e.data["previous"], e.data["state"])
            for e in self.events
            if e.kind == "lane.state" and e.data["lane"] == lane
        ]

    async def wait_state(self, lane: str, state: str, within: float = 10) -> Event:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for e in self.events:
                if e.kind == "lane.state" and e.data["lane"] == lane and e.data["state"] == state:
                    return e
            await asyncio.sleep(0.02)
        raise AssertionError(f"{lane} never reached {state}: {self.transitions(lane)}")


@pytest.fixture
def models(tmp_path: Path, model_store: Path) -> Path:
    return link_models(
        tmp_path / "models", *(model_store / n for n in ("tiny.gguf", "tiny2.gguf", "embed.gguf"))
    )


async def make_runtime(models: Path, **settings: object) -> Runtime:
    s = Settings.flat(models_dirs=(models,), **settings)  # type: ignore[arg-type]
    return Runtime(settings=s, paths=Paths.from_env())


@pytest.fixture
async def rt(models: Path) -> AsyncIterator[Runtime]:
    runtime = await make_runtime(models)
    async with runtime:
        yield runtime


async def test_start_stop_crash_restart_transitions(rt: Runtime) -> None:
    sup = rt.supervisor
    async with Recorder(rt.bus) as rec:
        lane = await sup.ensure("tiny")
        assert lane.state is LaneState.READY and lane.proc is not None
        first_pid = lane.proc.pid
        t_kill = time.monotonic()
        os.kill(first_pid, signal.SIGKILL)
        failed = await rec.wait_state("tiny", "failed", within=5)
        assert time.monotonic() - t_kill < 1.0, "a dead engine must be seen within a second"
        assert "exited unexpectedly with code -9" in failed.data["reason"]
        lane = await sup.ensure("tiny")
        assert lane.state is LaneState.READY and lane.restarts == 1 and lane.proc is not None
        assert lane.proc.pid != first_pid
        await sup.unload("tiny")
        assert rec.transitions("tiny") == [
            ("stopped", "starting"),
            ("starting", "ready"),
            ("ready", "failed"),
            ("failed", "starting"),
            ("starting", "ready"),
            ("ready", "stopping"),
            ("stopping", "stopped"),
        ]
        assert not psutil.pid_exists(lane.proc.pid) or psutil.Process(lane.proc.pid).status() == "zombie"


async def test_concurrent_requests_start_the_engine_once(rt: Runtime) -> None:
    async with Recorder(rt.bus) as rec:
        lanes = await asyncio.gather(*(rt.supervisor.ensure("tiny") for _ in range(6)))
        assert all(ln is lanes[0] for ln in lanes)
        assert rec.transitions("tiny") == [("stopped", "starting"), ("starting", "ready")]


async def test_swap_keeps_one_generation_lane(rt: Runtime) -> None:
    sup = rt.supervisor
    async with Recorder(rt.bus) as rec:
        a = await sup.ensure("tiny")
        emb = await sup.ensure("embed")  # embeddings have their own budget
        b = await sup.ensure("tiny2")
        assert a.state is LaneState.STOPPED and b.state is LaneState.READY and emb.state is LaneState.READY
        stopping = [e for e in rec.events if e.data.get("state") == "stopping"]
        assert stopping and "swapped out for tiny2" in stopping[0].data["reason"]
        # the stop of the first happened before the second began to start
        order = [(e.data["lane"], e.data["state"]) for e in rec.events if e.kind == "lane.state"]
        assert order.index(("tiny", "stopped")) < order.index(("tiny2", "starting"))


async def test_swap_waits_for_in_flight_then_gives_busy(models: Path) -> None:
    runtime = await make_runtime(models, drain_timeout_s=0.5)
    async with runtime:
        sup = runtime.supervisor
        async with sup.use("tiny") as lane:
            with pytest.raises(LaneBusyError, match="still serving 1 request"):
                await sup.ensure("tiny2")
            assert lane.state is LaneState.READY
        # once the request is done the swap goes through
        assert (await sup.ensure("tiny2")).state is LaneState.READY


async def test_idle_ttl_unloads(models: Path) -> None:
    runtime = await make_runtime(models, idle_ttl_s=0.6, model_overrides={"embed": {"ttl_s": 0}})
    async with runtime, Recorder(runtime.bus) as rec:
        await runtime.supervisor.ensure("tiny")
        emb = await runtime.supervisor.ensure("embed")
        ev = await rec.wait_state("tiny", "stopped", within=5)
        assert "idle" in ev.data["reason"]
        assert emb.state is LaneState.READY  # ttl 0: never unloaded


async def test_engine_exit_during_start_fails_at_once_with_log(rt: Runtime, models: Path) -> None:
    write_unknown_arch_gguf(models / "alien.gguf")
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as exc:
        await rt.supervisor.ensure("alien")
    assert time.monotonic() - t0 < 10
    msg = exc.value.message
    assert "exited with code" in msg and "engine log:" in msg and "nosucharch" in msg
    lane = rt.supervisor.get_lane("alien")
    assert lane.state is LaneState.FAILED
    assert any("nosucharch" in ln for ln in lane.ring.tail(50))
    log_file = rt.paths.lane_logs / "alien.log"
    assert "nosucharch" in log_file.read_text()


def _fake_binary(tmp_path: Path, body: str) -> str:
    p = tmp_path / "fake-llama-server"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return str(p)


async def test_silent_engine_hits_stall_deadline(tmp_path: Path, models: Path) -> None:
    binary = _fake_binary(tmp_path, "exec sleep 60")
    runtime = await make_runtime(
        models, runtime="llama-server", llama_server_path=binary, start_stall_s=0.8, stop_grace_s=1
    )
    async with runtime:
        t0 = time.monotonic()
        with pytest.raises(EngineStartError, match="did not become ready"):
            await runtime.supervisor.ensure("tiny")
        assert time.monotonic() - t0 < 5
        lane = runtime.supervisor.get_lane("tiny")
        assert lane.proc is not None and lane.proc.proc.returncode is not None


async def test_progress_extends_deadline_up_to_the_cap(tmp_path: Path, models: Path) -> None:
    binary = _fake_binary(tmp_path, "while true; do echo loading tensors; sleep 0.1; done")
    runtime = await make_runtime(
        models,
        runtime="llama-server",
        llama_server_path=binary,
        start_stall_s=0.5,
        start_max_s=2.5,
        stop_grace_s=1,
    )
    async with runtime:
        t0 = time.monotonic()
        with pytest.raises(EngineStartError, match="did not become ready within"):
            await runtime.supervisor.ensure("tiny")
        took = time.monotonic() - t0
        assert 2.3 < took < 6, took  # kept alive past the 0.5 s stall by its output, stopped at the cap
        assert "loading tensors" in "\n".join(runtime.supervisor.get_lane("tiny").ring.tail(5))


async def test_missing_file_after_listing(rt: Runtime, models: Path) -> None:
    (models / "tiny2.gguf").unlink()
    from app.core.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError):
        await rt.supervisor.ensure("tiny2")


async def test_shutdown_stops_every_engine(models: Path) -> None:
    runtime = await make_runtime(models)
    async with runtime:
        a = await runtime.supervisor.ensure("tiny")
        b = await runtime.supervisor.ensure("embed")
        pids = [a.proc.pid, b.proc.pid]  # type: ignore[union-attr]
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_log_ring_survives_unwritable_log_file(tmp_path: Path) -> None:
    from app.lanes.proc import LogRing

    ring = LogRing(max_lines=3, file=tmp_path / "l.log")
    ring.add("one")
    assert ring._fh is not None
    ring._fh.close()  # writing now fails like a full disk does
    ring._fh = open("/dev/full", "w")
    ring.add("two")
    ring.add("three")
    assert ring.tail(3)[-1] == "three"
    assert any("log file writing stopped" in ln for ln in ring.tail(3))
    assert (tmp_path / "l.log").read_text() == "one\n"


async def test_stop_while_starting_escalates_to_sigkill(tmp_path: Path, models: Path) -> None:
    # an engine that ignores SIGTERM and never becomes ready
    binary = _fake_binary(tmp_path, "trap '' TERM\nwhile true; do echo still loading; sleep 0.1; done")
    runtime = await make_runtime(models, runtime="llama-server", llama_server_path=binary, stop_grace_s=0.5)
    async with runtime, Recorder(runtime.bus) as rec:
        starting = asyncio.create_task(runtime.supervisor.ensure("tiny"))
        await rec.wait_state("tiny", "starting")
        lane = runtime.supervisor.get_lane("tiny")
        await asyncio.sleep(0.3)
        assert lane.proc is not None
        pid = lane.proc.pid
        t0 = time.monotonic()
        await lane.stop(reason="user stop")
        assert 0.4 < time.monotonic() - t0 < 5  # waited the grace period, then killed
        with pytest.raises(EngineStartError, match="cancelled by a stop"):
            await starting
        assert lane.state is LaneState.STOPPED
        assert lane.proc.proc.returncode == -signal.SIGKILL
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


async def test_unload_works_after_the_file_is_gone(rt: Runtime, models: Path) -> None:
    lane = await rt.supervisor.ensure("tiny2")
    (models / "tiny2.gguf").unlink()
    await rt.supervisor.unload("tiny2")
    assert lane.state is LaneState.STOPPED and lane.snapshot()["pid"] is None
