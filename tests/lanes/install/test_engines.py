"""Engines in environments of their own (issue 6), without installing one from PyPI: the manifest, the
state file, which interpreter a lane runs, failure keeping the previous version, pin/rollback/remove, the
CLI and the admin API. The environments here are real (`python -m venv --without-pip`, ≈ 0.2 s) but hold no
engine; the real installs from PyPI are in test_engines_pypi.py (slow)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app.__main__ import main
from app.core.errors import (
    EngineBusyError,
    EngineInstallError,
    EngineInUseError,
    EngineStateError,
    NoEnginePythonError,
    UnknownEngineError,
)
from app.core.events import EventBus
from app.core.paths import Paths
from app.core.settings import Settings
from app.hardware.build_choice import BUILDS
from app.lanes.engines.kind import engine_python
from app.lanes.engines.llamacpp.kind import worker_argv as llama_worker_argv
from app.lanes.engines.mlx import mlx_plan
from app.lanes.engines.plan import StartContext
from app.lanes.engines.registry import engine_kinds
from app.lanes.install import engine as engine_install
from app.lanes.install.store import (
    EngineState,
    EngineStore,
    InstalledVersion,
    check_version,
    load_manifest,
    spec_for,
    venv_python,
)
from app.lanes.install.venv import base_python
from app.lanes.workers.params import LlamaParams
from app.library.model import ModelEntry
from app.routing.engines import LANES


def bare_venv(store: EngineStore, lane: str, version: str) -> InstalledVersion:
    """A real environment without pip or the engine: enough for the interpreter to be chosen and run."""
    folder = store.lane_dir(lane) / version
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return InstalledVersion(version=version, dir=version, installed_at=time.time())


@pytest.fixture
def store() -> EngineStore:
    return EngineStore(Paths.from_env().engines)  # the isolated SWITCHYARD_HOME of this test


# ---- the manifest ---------------------------------------------------------------------------------------
def test_manifest_names_routing_lanes_with_worker_needs() -> None:
    manifest = load_manifest()
    assert set(manifest) <= set(LANES)
    assert {"llama.cpp", "mistral.rs", "mlx", "vllm", "sglang", "whisper.cpp", "piper"} <= set(manifest)
    for lane, spec in manifest.items():
        assert spec.lane == lane and check_version(spec.version) == spec.version
        assert spec.requirements(spec.version)[0] == f"{spec.dist}=={spec.version}"
    # our HTTP workers need aiohttp in the engine's environment; the CUDA engines are not imported to check
    assert "aiohttp>=3.13" in spec_for("piper").worker and "aiohttp>=3.13" in spec_for("whisper.cpp").worker
    assert not spec_for("vllm").verify_import and spec_for("piper").verify_import


def test_manifest_pins_what_the_test_venv_runs() -> None:
    """The pinned version is the one the suite's own engines are: bump both together."""
    checked = 0
    for spec in load_manifest().values():
        try:
            have = importlib.metadata.version(spec.dist)
        except importlib.metadata.PackageNotFoundError:
            continue  # not in this venv (vLLM, SGLang on a machine without a GPU)
        assert have == spec.version, f"{spec.dist}: engines.toml pins {spec.version}, .venv has {have}"
        checked += 1
    assert checked >= 3  # xllamacpp, piper-tts, pywhispercpp at least
    mlx = spec_for("mlx")
    with_mlx = [r for r in mlx.also if r.startswith("mlx[cpu]==")]
    if sys.platform == "linux" and with_mlx:
        try:
            assert with_mlx[0].split("==")[1].split(";")[0] == importlib.metadata.version("mlx")
        except importlib.metadata.PackageNotFoundError:
            pass


def test_companions_are_pinned_only_at_the_manifest_version() -> None:
    mlx = spec_for("mlx")
    pinned = mlx.requirements(mlx.version)
    other = mlx.requirements("0.31.1")
    assert pinned[0] == f"mlx-lm=={mlx.version}" and "mlx[cpu]==0.32.4; sys_platform == 'linux'" in pinned
    assert other == ["mlx-lm==0.31.1", "mlx[cpu]; sys_platform == 'linux'"]


@pytest.mark.parametrize("bad", ["", "latest", "../x", "1.0/..", "1..2", "-1", "a" * 80])
def test_versions_that_could_name_a_folder_elsewhere_are_refused(bad: str) -> None:
    with pytest.raises(EngineStateError, match="not a version"):
        check_version(bad)


def test_unknown_engine_names_the_known_ones(store: EngineStore) -> None:
    with pytest.raises(UnknownEngineError, match="piper") as exc:
        store.lane_dir("../../etc")
    assert exc.value.status == 404


# ---- the state file -------------------------------------------------------------------------------------
def test_state_round_trips_atomically_and_malformed_is_reported(store: EngineStore) -> None:
    assert store.read("piper") == EngineState()
    state = EngineState(
        current=InstalledVersion("1.8.0", "1.8.0", 1.0, ("piper-tts==1.8.0",)), pinned="1.7.0"
    )
    store.write("piper", state)
    assert store.read("piper") == state
    assert sorted(p.name for p in store.lane_dir("piper").iterdir()) == ["state.json"]  # no temp file left
    store.state_file("piper").write_text('{"current": {"version": "1.8.0", "dir": "../../x"}}')
    with pytest.raises(EngineStateError, match=r"state\.json cannot be read.*engine remove piper"):
        store.read("piper")
    assert store.current("piper") is None  # a lane falls back instead of failing
    store.state_file("piper").write_text("{not json")
    with pytest.raises(EngineStateError):
        store.read("piper")


# ---- which interpreter a lane runs ----------------------------------------------------------------------
def test_a_lane_prefers_the_engines_own_environment(store: EngineStore, tmp_path: Path) -> None:
    found = engine_python("piper", "piper", "piper-tts")
    assert found is not None and found.where == "app" and found.python == sys.executable
    store.write("piper", EngineState(current=bare_venv(store, "piper", "1.8.0")))
    found = engine_python("piper", "piper", "piper-tts")
    assert found is not None and found.managed and found.version == "1.8.0"
    assert found.python == str(venv_python(store.lane_dir("piper") / "1.8.0"))
    kind = engine_kinds()["piper"]
    install = kind.install(Settings())
    assert install.installed and install.version == "piper-tts 1.8.0" and "own environment" in install.note
    voice = tmp_path / "v.onnx"
    voice.write_bytes(b"x")
    entry = ModelEntry(id="v", path=voice, facts=None, problem=None, format="piper")
    plan = kind.build(entry, Settings(), StartContext(ppid=os.getpid(), port=0, hardware=None))
    assert plan.argv[:3] == (found.python, "-m", "app.lanes.workers.piper")
    assert plan.env["PYTHONNOUSERSITE"] == "1" and "VIRTUAL_ENV" not in plan.env
    # PYTHONPATH holds our package and nothing else: the engine's own packages are not shadowed
    shim = Path(plan.env["PYTHONPATH"])
    assert [p.name for p in shim.iterdir()] == ["app"]
    assert (shim / "app").resolve() == Path(__file__).resolve().parents[3] / "app"
    # and the engine's interpreter really imports our worker from there (its engine is not installed here)
    probe = "import app.lanes.workers.params as w, sys; print(w.__file__); print(sys.prefix)"
    run = subprocess.run(
        [found.python, "-c", probe], env=plan.env, capture_output=True, text=True, check=True
    )
    where, prefix = run.stdout.split()
    assert (
        Path(where).resolve()
        == Path(__file__).resolve().parents[3] / "app" / "lanes" / "workers" / "params.py"
    )
    assert prefix == str(store.lane_dir("piper") / "1.8.0")
    # a recorded version whose interpreter is gone is not used: back to the app's own
    store.write("piper", EngineState(current=InstalledVersion("9.9", "9.9", 0.0)))
    assert engine_python("piper", "piper", "piper-tts").where == "app"  # type: ignore[union-attr]


def test_llama_cpp_and_mlx_run_the_environments_interpreter(store: EngineStore, tmp_path: Path) -> None:
    store.write("llama.cpp", EngineState(current=bare_venv(store, "llama.cpp", "2026.10.11549")))
    found = engine_python("llama.cpp", "xllamacpp", "xllamacpp")
    assert found is not None and found.managed
    params = LlamaParams("m.gguf", "m", 4096, 1, 2, "f16", "auto", -1, False, None)
    assert llama_worker_argv(params, ppid=1, engine=found)[:3] == (
        found.python,
        "-m",
        "app.lanes.workers.llamacpp",
    )
    assert llama_worker_argv(params, ppid=1)[:3] == (sys.executable, "-m", "app.lanes.workers.llamacpp")
    store.write("mlx", EngineState(current=bare_venv(store, "mlx", "0.32.2")))
    mlx = engine_python("mlx", "mlx_lm", "mlx-lm")
    folder = tmp_path / "m"
    folder.mkdir()
    entry = ModelEntry(id="m", path=folder, facts=None, problem=None, format="mlx")
    plan = mlx_plan(entry, Settings(), ppid=os.getpid(), free_port=1234, engine=mlx)
    assert mlx is not None and plan.argv[plan.argv.index("--") + 1] == mlx.python
    assert "PYTHONPATH" not in plan.env  # mlx_lm.server is the engine's own program, not our worker


# Switchyard's own dependencies that an engine's environment does not have: a worker must not import them
NOT_IN_ENGINE_ENVS = {"gguf", "huggingface_hub", "psutil", "keyring", "pynvml", "uvloop", "yaml", "PySide6"}
# the folder rule: every module in app/lanes/workers/ runs inside an engine's environment
WORKERS = sorted(
    p.stem
    for p in (Path(__file__).resolve().parents[3] / "app" / "lanes" / "workers").glob("*.py")
    if p.stem != "__init__"
)


def test_the_workers_folder_holds_the_workers() -> None:
    assert {"llamacpp", "mistralrs", "whisper", "piper", "http_host", "params"} <= set(WORKERS)


@pytest.mark.parametrize("worker", WORKERS)
def test_workers_import_only_what_an_engine_environment_has(worker: str) -> None:
    code = (
        f"import sys, app.lanes.workers.{worker}\n"
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules} - set(sys.stdlib_module_names))))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert not set(run.stdout.split()) & NOT_IN_ENGINE_ENVS, run.stdout


def test_which_python_creates_the_environments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert base_python(None) == sys.executable  # a source tree: the interpreter Switchyard runs on
    assert base_python(sys.executable) == sys.executable
    with pytest.raises(NoEnginePythonError, match="engine_python is set to '/nope/python3'"):
        base_python("/nope/python3")
    # a frozen bundle has no Python of its own: the newest 3.11+ on PATH, or a message saying what to do
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    bare_path = tmp_path / "bin"
    bare_path.mkdir()
    monkeypatch.setenv("PATH", str(bare_path))
    with pytest.raises(NoEnginePythonError, match=r"no Python 3\.11 or newer was found on PATH"):
        base_python(None)
    (bare_path / "python3").symlink_to(sys.executable)
    assert base_python(None) == str(bare_path / "python3")


# ---- install, pin, rollback, remove ---------------------------------------------------------------------
async def test_a_failed_install_leaves_the_current_version_working(store: EngineStore) -> None:
    """An unresolvable version fails in pip within seconds; the new folder is gone, state.json unchanged."""
    store.write("piper", EngineState(current=bare_venv(store, "piper", "1.8.0")))
    before = store.state_file("piper").read_bytes()
    bus = EventBus()
    seen: list[str] = []
    async with bus.subscribe() as q:
        started = time.monotonic()
        with pytest.raises(EngineInstallError) as exc:
            await engine_install.install("piper", store=store, bus=bus, version="0.0.0.dev0")
        took = time.monotonic() - started
        while not q.empty():
            seen.append(q.get_nowait().kind)
    msg = exc.value.message
    assert "piper-tts==0.0.0.dev0" in msg and "piper 1.8.0 is still installed and in use" in msg
    assert ("pip could not install" in msg) or ("creating the environment" in msg)
    assert took < 90, took
    assert store.state_file("piper").read_bytes() == before
    assert sorted(p.name for p in store.lane_dir("piper").iterdir() if not p.name.startswith(".")) == [
        "1.8.0",
        "state.json",
    ]
    assert store.current("piper") is not None and store.current("piper").version == "1.8.0"  # type: ignore[union-attr]
    assert seen[0] == "engine.started" and "engine.progress" in seen


async def test_installing_the_kept_version_switches_without_pip(store: EngineStore) -> None:
    cur, prev = bare_venv(store, "piper", "1.8.0"), bare_venv(store, "piper", "1.7.0")
    store.write("piper", EngineState(current=cur, previous=prev))
    same = await engine_install.install("piper", store=store, version="1.8.0")
    assert not same.changed and same.version == "1.8.0"
    back = await engine_install.install("piper", store=store, version="1.7.0")
    assert back.changed and back.version == "1.7.0" and back.previous == "1.8.0" and back.seconds < 5
    state = engine_install.rollback("piper", store=store)
    assert state.current == cur and state.previous == prev


def test_pin_rollback_and_remove(store: EngineStore) -> None:
    with pytest.raises(EngineStateError, match="no previous version"):
        engine_install.rollback("piper", store=store)
    assert engine_install.pin("piper", "1.7.0", store=store).pinned == "1.7.0"
    assert engine_install.target_version(spec_for("piper"), store.read("piper"), None) == "1.7.0"
    assert engine_install.target_version(spec_for("piper"), store.read("piper"), "1.6.1") == "1.6.1"
    assert engine_install.pin("piper", None, store=store).pinned is None
    with pytest.raises(EngineStateError):
        engine_install.pin("piper", "../1", store=store)
    store.write("piper", EngineState(current=bare_venv(store, "piper", "1.8.0")))
    python = str(venv_python(store.lane_dir("piper") / "1.8.0"))
    sleeper = subprocess.Popen([python, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        with pytest.raises(EngineInUseError, match=f"pid {sleeper.pid}"):
            engine_install.remove("piper", store=store)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert engine_install.remove("piper", store=store) == ["1.8.0"]
    assert not store.lane_dir("piper").exists()
    assert engine_install.remove("piper", store=store) == []


def test_one_change_at_a_time(store: EngineStore) -> None:
    with engine_install.lane_lock(store, "piper"), pytest.raises(EngineBusyError, match="wait"):
        engine_install.pin("piper", "1.7.0", store=store)
    assert engine_install.pin("piper", "1.7.0", store=store).pinned == "1.7.0"  # free again


# ---- the CLI --------------------------------------------------------------------------------------------
def test_cli_ls_json_and_table(capsys: pytest.CaptureFixture[str], store: EngineStore) -> None:
    store.write("piper", EngineState(current=bare_venv(store, "piper", "1.8.0"), pinned="1.7.0"))
    assert main(["engine", "ls", "--json"]) == 0
    rows = {r["engine"]: r for r in json.loads(capsys.readouterr().out)["engines"]}
    assert set(rows) >= {"llama.cpp", "piper", "whisper.cpp", "vllm", "sglang", "mlx"}
    piper = rows["piper"]
    assert (piper["installed"], piper["version"], piper["where"]) == (True, "1.8.0", "managed")
    assert piper["path"] == str(store.lane_dir("piper") / "1.8.0")
    assert (piper["pinned"], piper["pinned_by"], piper["manifest_version"]) == ("1.7.0", "you", "1.8.0")
    assert piper["can_start"] is True and piper["health"] == "ok"
    if not rows["vllm"]["installed"]:
        assert rows["vllm"]["can_start"] is False and "vllm is not installed" in rows["vllm"]["health"]
    assert main(["engine", "ls"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["KIND", "INSTALLED", "PINNED", "BUILD", "PATH", "HEALTH"]
    line = next(ln for ln in table if ln.startswith("piper "))
    assert "1.8.0 (own env)" in line and "1.7.0 (you)" in line and line.rstrip().endswith("ok")
    llama = next(ln for ln in table if ln.startswith("llama.cpp "))
    build = llama[table[0].index("BUILD") :].split()[0]
    assert build == rows["llama.cpp"]["build"] and build in BUILDS  # the build this machine calls for


def test_cli_pin_rollback_remove_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine", "pin", "piper", "1.7.0"]) == 0
    assert "piper-tts 1.7.0 (pinned by you)" in capsys.readouterr().out
    assert main(["engine", "pin", "piper"]) == 0
    assert capsys.readouterr().out.strip() == "piper: piper-tts 1.7.0 (you)"
    assert main(["engine", "pin", "piper", "--clear"]) == 0
    assert "the version Switchyard tests" in capsys.readouterr().out
    assert main(["engine", "rollback", "piper"]) == 2
    assert "no previous version to roll back to" in capsys.readouterr().err
    assert main(["engine", "install", "nope"]) == 2
    assert "'nope' is not an engine Switchyard installs" in capsys.readouterr().err
    assert main(["engine", "remove", "piper"]) == 0  # only the cleared pin's state was there
    assert capsys.readouterr().out.strip() == "piper: no environment of its own to remove"
    assert main(["engine", "update", "--all"]) == 0  # nothing installed in its own environment: nothing to do
    with pytest.raises(SystemExit):
        main(["engine", "update"])  # a kind or --all


# ---- the admin API --------------------------------------------------------------------------------------
async def test_admin_api_lists_pins_refuses_and_streams_a_failed_install(store: EngineStore) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from app.runtime import Runtime
    from app.server.app import make_app

    store.write("piper", EngineState(current=bare_venv(store, "piper", "1.8.0")))
    before = store.state_file("piper").read_bytes()
    rt = Runtime(settings=Settings.flat(plan_memory=False, monitor_interval_s=0), paths=Paths.from_env())
    async with TestClient(TestServer(make_app(rt))) as client:
        r = await client.get("/api/engines")
        body = await r.json()
        assert r.status == 200 and body["jobs"] == []
        piper = next(e for e in body["engines"] if e["engine"] == "piper")
        assert piper["where"] == "managed" and piper["version"] == "1.8.0"
        r = await client.post("/api/engines/nope/install", json={})
        assert r.status == 404 and (await r.json())["error"]["code"] == "engine_not_found"
        r = await client.post("/api/engines/piper/pin", json={"version": 3})
        assert r.status == 400 and (await r.json())["error"]["param"] == "version"
        r = await client.post("/api/engines/piper/rollback")
        assert r.status == 400 and "no previous version" in (await r.json())["error"]["message"]
        r = await client.post("/api/engines/piper/update")  # 1.8.0 is the manifest's version
        assert (await r.json())["status"] == "up_to_date"

        events = await client.get("/api/engines/events")
        assert (await events.content.readline()).decode().strip() == "event: snapshot"
        r = await client.post("/api/engines/piper/install", json={"version": "0.0.0.dev0"})
        job = await r.json()
        assert r.status == 202 and job["state"] == "running" and job["engine"] == "piper"
        again = await client.post("/api/engines/piper/install", json={})
        assert again.status == 409 and (await again.json())["error"]["code"] == "engine_busy"
        kinds: list[str] = []
        failed: dict[str, Any] = {}
        async with asyncio.timeout(90):
            name = ""
            while not failed:
                line = (await events.content.readline()).decode().strip()
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                    kinds.append(name)
                elif line.startswith("data: ") and name == "engine.failed":
                    failed = json.loads(line.removeprefix("data: "))
        assert "engine.started" in kinds and "engine.progress" in kinds
        assert failed["id"] == job["id"] and failed["code"] == "engine_install_failed"
        detail = await (await client.get(f"/api/engines/jobs/{job['id']}")).json()
        assert detail["state"] == "failed" and "0.0.0.dev0" in detail["error"] and detail["tail"]
        assert store.state_file("piper").read_bytes() == before

        r = await client.post("/api/engines/piper/pin", json={"version": "1.7.0"})
        assert r.status == 200 and (await r.json())["pinned"] == "1.7.0"
        r = await client.delete("/api/engines/piper")
        assert r.status == 200 and (await r.json())["removed"] == ["1.8.0"]
        assert (await client.get("/api/engines/jobs/eng-999")).status == 404
