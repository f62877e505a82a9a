"""Issue 18's follow-ups: a build through the server (POST /api/jobs, `engine install --detach`, the admin
install and update routes, each refusing an unknown build with the valid ones), the builds installed on
GET /api/engines, the package each build names read from the manifest, a container lane shown as one, the
capability lane installed only when a build is registered, and the sd.cpp hint naming `--pull-only`.

Installs are real (a virtual environment, pip, an import check) from a folder of stand-in wheels, as in
tests/lanes/install/test_builds.py: pip reads that folder and nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import io
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from app.__main__ import main
from app.core.paths import Paths
from app.core.settings import Settings
from app.lanes.engines.llamacpp import compat
from app.lanes.install import engine as engine_install
from app.lanes.install.containers import load_images
from app.lanes.install.listing import build_fields, build_packages, engine_rows
from app.lanes.install.store import EngineStore, load_manifest, spec_for
from app.routing.engines import install_hint
from app.runtime import Runtime
from app.server.app import make_app
from tests.lanes.install.test_builds import (
    CPU_VERSION,
    CUDA_VERSION,
    M3,
    MI300,
    XEON,
    _dists,
    _mistralrs,
    _wheel,
)
from tests.lanes.install.test_runtimes_build import H200

LLAMA_CPP_COMPAT = "llama.cpp-compat"
SD_CPP = "sd.cpp"

pytestmark = pytest.mark.timeout(300)
LANE = "mistral.rs"
MISTRAL = spec_for(LANE)
BUILDS_TEXT = "its builds are cpu, metal, cuda12, cuda13"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    _wheel(folder, "mistralrs", CPU_VERSION, _mistralrs("cpu", CPU_VERSION))
    _wheel(folder, "mistralrs-cuda", CUDA_VERSION, _mistralrs("cuda", CUDA_VERSION))
    _wheel(folder, "aiohttp", "3.13.0", {"aiohttp/__init__.py": ""})  # the mistral.rs worker's need
    return folder


@pytest.fixture
def store(wheels: Path, monkeypatch: pytest.MonkeyPatch) -> EngineStore:
    """The isolated data dir's engines, and a pip that reads the wheel folder and nothing else."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)
    return EngineStore(Paths.from_env().engines)


def _folder(build: str) -> str:
    return f"{MISTRAL.default_version(build)}-{build}"


def _detach(url: str, *argv: str) -> tuple[int, str, str]:
    """`switchyard engine install ... --detach --url URL` in this process (run it off the event loop)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["engine", "install", *argv, "--detach", "--url", url])
    return code, out.getvalue(), err.getvalue()


async def _error(resp: Any, status: int = 400) -> dict[str, Any]:
    doc = await resp.json()
    assert resp.status == status, doc
    return dict(doc["error"])


# ---- builds through the server ------------------------------------------------------------------------
async def test_job_install_and_update_routes_take_a_build(store: EngineStore) -> None:
    chosen, _why = engine_install.chosen_build(MISTRAL, None)  # what this machine's probe calls for
    other = "cuda12" if chosen == "cpu" else "cpu"  # a build that is not the chosen one
    rt = Runtime(settings=Settings.flat(plan_memory=False, monitor_interval_s=0), paths=Paths.from_env())
    async with TestClient(TestServer(make_app(rt))) as client:
        # POST /api/jobs: a build the engine has no package for, or not a string, starts nothing
        body = {"kind": "engine_install", "engine": LANE, "build": "rocm"}
        err = await _error(await client.post("/api/jobs", json=body))
        assert err["param"] == "build" and BUILDS_TEXT in err["message"] and "'rocm'" in err["message"]
        err = await _error(await client.post("/api/jobs", json={**body, "build": 12}))
        assert err["param"] == "build"
        body = {"kind": "engine_install", "engine": "piper", "build": "cuda12"}
        assert "piper has one build" in (await _error(await client.post("/api/jobs", json=body)))["message"]
        assert rt.engines.all() == [] and not store.lane_dir(LANE).exists()

        # `engine install --detach --build`: refused before any server is asked, then sent in the body
        url = str(client.make_url("")).rstrip("/")
        code, _out, err_text = await asyncio.to_thread(_detach, url, LANE, "--build", "vulkan")
        assert code == 2 and BUILDS_TEXT in err_text and rt.engines.all() == []
        code, out, err_text = await asyncio.to_thread(_detach, url, LANE, "--build", other)
        assert code == 0, err_text
        job_id = out.split()[0]
        job = await (await client.get(f"/api/jobs/{job_id}")).json()
        assert job["kind"] == "engine_install" and job["subject"] == LANE
        engine_job = await rt.engines.wait(job["source"])
        assert engine_job.build == other and engine_job.state == "completed", engine_job.error
        assert engine_job.result is not None and engine_job.result["build"] == other
        current = store.read(LANE).current
        assert current is not None and (current.build, current.dir) == (other, _folder(other))
        have = _dists(store, LANE, _folder(other))
        assert ("mistralrs-cuda" in have) == other.startswith("cuda")  # the build's own package went in

        # GET /api/engines: the build installed, the one this machine calls for, and the fix
        rows = {r["engine"]: r for r in (await (await client.get("/api/engines")).json())["engines"]}
        row = rows[LANE]
        assert (row["where"], row["installed_build"], row["build"]) == ("managed", other, chosen)
        assert f"`switchyard engine install {LANE} --build {chosen}`" in row["build_note"]
        assert row["build_requirements"] == [f"{MISTRAL.dist_for(chosen)}=={MISTRAL.default_version(chosen)}"]
        assert rows["piper"]["installed_build"] is None and rows["piper"]["build_note"] is None

        # the admin routes check the build as the job route does
        r = await client.post(f"/api/engines/{LANE}/install", json={"build": "vulkan"})
        assert BUILDS_TEXT in (await _error(r))["message"]
        r = await client.post("/api/engines/piper/install", json={"build": "cpu"})
        assert "piper has one build" in (await _error(r))["message"]
        r = await client.post(f"/api/engines/{LANE}/update", json={"build": ["cpu"]})
        assert (await _error(r))["param"] == "build"
        assert all(j.id == engine_job.id for j in rt.engines.all())  # no job was started by a refusal

        # update: the installed build asked for is up to date; without one, the probe's build differs
        r = await client.post(f"/api/engines/{LANE}/update", json={"build": other})
        doc = await r.json()
        assert r.status == 200 and doc == {
            "status": "up_to_date",
            "engine": LANE,
            "version": MISTRAL.default_version(other),
            "build": other,
        }
        r = await client.post(f"/api/engines/{LANE}/update")
        doc = await r.json()
        assert r.status == 202 and doc["status"] == "queued", doc
        assert doc["job"]["action"] == "update" and doc["job"]["build"] is None
        done = await rt.engines.wait(doc["job"]["id"])
        assert done.state == "completed" and done.result is not None, done.error
        assert (done.result["build"], done.result["previous"]) == (chosen, MISTRAL.default_version(other))
        r = await client.post(f"/api/engines/{LANE}/update", json={})
        assert (await r.json())["status"] == "up_to_date"

        # the admin install route with a build: a job that installs it (the kept one: no pip)
        r = await client.post(f"/api/engines/{LANE}/install", json={"build": other})
        started = await r.json()
        assert r.status == 202 and started["build"] == other
        back = await rt.engines.wait(started["id"])
        assert back.result is not None and back.result["build"] == other and back.result["changed"]
        assert any("switched to the kept" in line for line in back.lines)
        current = store.read(LANE).current
        assert current is not None and current.build == other


# ---- rows: packages, containers, the capability lane --------------------------------------------------
def test_the_package_each_build_names_comes_from_the_manifest() -> None:
    assert build_packages(MISTRAL) == {
        "cpu": "mistralrs",
        "metal": "mistralrs",
        "cuda12": "mistralrs-cuda",
        "cuda13": "mistralrs-cuda",
    }
    assert build_packages(spec_for("mlx")) == {
        "cpu": "mlx[cpu]",
        "cuda12": "mlx[cuda12]",
        "cuda13": "mlx[cuda13]",
        "metal": "mlx",
    }
    cases = [  # probe, mistral.rs's why ends with, MLX's why ends with
        (H200, "(mistralrs-cuda)", "(mlx[cuda13])"),
        (M3, "(mistralrs)", "(mlx)"),
        (XEON, "(mistralrs)", "(mlx[cpu])"),
        (MI300, "(mistralrs)", "(mlx[cpu])"),
    ]
    dists = {b.dist for s in load_manifest().values() for b in s.builds.values()}
    for hw, mistral, mlx in cases:
        mr = build_fields(LANE, Settings(), hw)
        assert mr["build_why"].endswith(mistral), mr
        assert mr["build_why"].rsplit("(", 1)[1].rstrip(")") in dists  # a distribution that exists
        assert build_fields("mlx", Settings(), hw)["build_why"].endswith(mlx)
    assert "mkl" not in build_fields(LANE, Settings(), XEON)["build_why"].lower()


SHIM = """#!/bin/sh
# a docker client whose daemon has NVIDIA's runtime; nothing else is asked of it here
[ "$1" = info ] && echo '{"Runtimes": {"runc": {}, "nvidia": {}}}'
"""


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(SHIM)
    (bindir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


async def test_a_lane_run_from_an_image_is_a_container_row(docker: None) -> None:
    settings = Settings.flat(runtime="docker", plan_memory=False, monitor_interval_s=0)
    rows = {r["engine"]: r for r in engine_rows(settings, H200)}
    for lane in ("vllm", "sglang"):
        row, image = rows[lane], load_images()[lane]
        assert (row["installed"], row["where"], row["runtime"]) == (True, "container", "docker"), row
        assert row["path"] == image.image_for("cuda13") and row["version"] == spec_for(lane).version
    rt = Runtime(settings=settings, paths=Paths.from_env())
    async with TestClient(TestServer(make_app(rt))) as client:
        listed = (await (await client.get("/api/engines")).json())["engines"]
        vllm = next(r for r in listed if r["engine"] == "vllm")
        assert vllm["where"] == "container" and vllm["path"].startswith("vllm/vllm-openai")
        assert "through" not in vllm["path"]


def test_the_capability_row_is_installed_only_when_a_build_is_registered(tmp_path: Path) -> None:
    assert importlib.util.find_spec("xllamacpp") is not None  # the app's interpreter has it: still not used

    def row() -> dict[str, Any]:
        return next(r for r in engine_rows(Settings(), XEON) if r["engine"] == LLAMA_CPP_COMPAT)

    nothing = row()
    assert (nothing["installed"], nothing["where"], nothing["path"]) == (False, None, None)
    assert not nothing["can_start"] and "engine register llama.cpp-compat" in nothing["health"]

    compat.register(python=sys.executable)
    by_python = row()
    assert (by_python["installed"], by_python["where"]) == (True, "registered")
    assert by_python["path"] == str(Path(sys.executable).absolute())
    assert by_python["version"] == importlib.metadata.version("xllamacpp") and by_python["can_start"]

    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\necho 'version: 7400 (abc1234)'\n")
    server.chmod(0o755)
    compat.register(llama_server=str(server))
    by_binary = row()
    assert (by_binary["where"], by_binary["path"]) == ("registered", str(server))
    assert by_binary["version"] == "version: 7400 (abc1234)"

    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        assert main(["engine", "ls"]) == 0
    line = next(ln for ln in table.getvalue().splitlines() if ln.startswith(LLAMA_CPP_COMPAT))
    assert "(registered)" in line and str(server) in line

    assert compat.unregister()
    assert row()["where"] is None


def test_the_sd_cpp_hint_names_the_pinned_release_first() -> None:
    hint = install_hint(SD_CPP)
    assert "switchyard serve --pull-only" in hint and "sd-server release" in hint
    assert hint.index("--pull-only") < hint.index("build stable-diffusion.cpp")
