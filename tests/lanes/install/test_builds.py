"""`engine install` puts in the build the hardware probe chooses (issue 18): per engine and build the
distribution (mistralrs-cuda, mistralrs) or the extra (mlx[cuda12]) named in engines.toml, `--build` to
override it and its refusal, the installed build recorded and shown by `engine ls`, and a failing
reinstall of the same version with another build leaving the working environment as it was.

Real environments and a real pip, without the internet: pip reads only a folder of tiny stand-in wheels
built here (PIP_NO_INDEX, PIP_FIND_LINKS), named and versioned as the manifest's distributions."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from app.__main__ import main
from app.core.errors import EngineStateError
from app.core.events import EventBus
from app.core.paths import Paths
from app.core.settings import Settings
from app.hardware.model import CPUInfo, GPUInfo, Hardware, MemoryInfo, Vendor
from app.lanes.install import engine as engine_install
from app.lanes.install.jobs import EngineJobs
from app.lanes.install.store import EngineState, EngineStore, InstalledVersion, spec_for, venv_python

pytestmark = pytest.mark.timeout(300)
GIB = 1 << 30
MISTRAL, MLX = spec_for("mistral.rs"), spec_for("mlx")
CPU_VERSION, CUDA_VERSION = MISTRAL.default_version("cpu"), MISTRAL.default_version("cuda12")
MLX_VERSION = "0.32.4"  # the mlx companion the manifest pins for every build
WHEEL = "Wheel-Version: 1.0\nGenerator: switchyard-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


# ---- recorded probes ------------------------------------------------------------------------------------
def _gpu(vendor: Vendor, name: str, *, driver: str | None = None) -> GPUInfo:
    return GPUInfo(0, vendor, name, 80 * GIB, 79 * GIB, GIB, driver, "8.0" if vendor == "nvidia" else None,
                   vendor == "apple", None, "nvml" if vendor == "nvidia" else "sysctl")  # fmt: skip


def _machine(os_name: str, arch: str, *gpus: GPUInfo, cpu: str = "AMD EPYC 7763") -> Hardware:
    return Hardware(
        os=os_name,
        arch=arch,
        cpu=CPUInfo(cpu, 8, 16, 16, None, ("avx2",)),
        memory=MemoryInfo(64 * GIB, 60 * GIB, 0, 0, None),
        gpus=gpus,
        engine_devices=(),
        bandwidth=None,
    )


A100 = _machine("linux", "x86_64", _gpu("nvidia", "NVIDIA A100-SXM4-80GB", driver="535.183.01"))
H200 = _machine("linux", "x86_64", _gpu("nvidia", "NVIDIA H200", driver="580.65.06"))
M3 = _machine("darwin", "arm64", _gpu("apple", "Apple M3 Max"), cpu="Apple M3 Max")
XEON = _machine("linux", "x86_64", cpu="Intel(R) Xeon(R) Gold 6338")
MI300 = _machine("linux", "x86_64", _gpu("amd", "AMD Instinct MI300X"))


# ---- a local wheel folder -------------------------------------------------------------------------------
def _wheel(
    folder: Path, name: str, version: str, files: dict[str, str], metadata: tuple[str, ...] = ()
) -> None:
    """A minimal pure-Python wheel (PEP 427): the files, METADATA, WHEEL and a RECORD with their hashes."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    content = {
        **files,
        f"{info}/METADATA": "\n".join(
            ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *metadata]
        )
        + "\n",
        f"{info}/WHEEL": WHEEL,
    }
    record = []
    for path, text in content.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as zf:
        for path, text in content.items():
            zf.writestr(path, text)
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")


def _mistralrs(build: str, version: str) -> dict[str, str]:
    return {"mistralrs/__init__.py": f"BUILD = {build!r}\n__version__ = {version!r}\n"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    _wheel(folder, "mistralrs", CPU_VERSION, _mistralrs("cpu", CPU_VERSION))
    _wheel(folder, "mistralrs-cuda", CUDA_VERSION, _mistralrs("cuda", CUDA_VERSION))
    # a CUDA build at the CPU build's version that installs but cannot load here, as on a machine whose
    # driver libraries are missing: the install fails after pip has written the new environment
    broken = "raise ImportError('libcuda.so.1: cannot open shared object file')\n"
    _wheel(folder, "mistralrs-cuda", CPU_VERSION, {"mistralrs/__init__.py": broken})
    _wheel(folder, "aiohttp", "3.13.0", {"aiohttp/__init__.py": ""})  # the mistral.rs worker's need
    _wheel(folder, "mlx-lm", MLX.version, {"mlx_lm/__init__.py": ""})
    extras = []
    for extra, dist in (("cpu", "mlx-cpu"), ("cuda12", "mlx-cuda-12"), ("cuda13", "mlx-cuda-13")):
        extras += [
            f"Provides-Extra: {extra}",
            f'Requires-Dist: {dist}=={MLX_VERSION}; platform_system == "Linux" and extra == "{extra}"',
        ]
        _wheel(folder, dist, MLX_VERSION, {})
    _wheel(folder, "mlx", MLX_VERSION, {"mlx/__init__.py": ""}, tuple(extras))
    return folder


@pytest.fixture
def store(wheels: Path, monkeypatch: pytest.MonkeyPatch) -> EngineStore:
    """The isolated data dir's engines, and a pip that reads the wheel folder and nothing else."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no pip.conf: no index, find-links or constraints
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)
    return EngineStore(Paths.from_env().engines)


def _dists(store: EngineStore, lane: str, folder: str) -> dict[str, str]:
    """The distributions installed in an environment, as its own interpreter lists them."""
    code = (
        "import importlib.metadata as m, json\n"
        "print(json.dumps({d.name: d.version for d in m.distributions()}))"
    )
    python = venv_python(store.lane_dir(lane) / folder)
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return {k.lower(): v for k, v in json.loads(out.stdout).items()}


def _ls() -> dict[str, dict]:
    return {r["engine"]: r for r in json.loads(_captured(["engine", "ls", "--json"]))["engines"]}


def _captured(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return buf.getvalue()


# ---- which package each probe gets ----------------------------------------------------------------------
LINUX = "; sys_platform == 'linux'"
CASES = [  # probe, mistral.rs build and its first requirement, MLX build and its companion
    (A100, "cuda12", f"mistralrs-cuda=={CUDA_VERSION}", "cuda12", f"mlx[cuda12]=={MLX_VERSION}{LINUX}"),
    (H200, "cuda13", f"mistralrs-cuda=={CUDA_VERSION}", "cuda13", f"mlx[cuda13]=={MLX_VERSION}{LINUX}"),
    (M3, "metal", f"mistralrs=={CPU_VERSION}", "metal", f"mlx=={MLX_VERSION}; sys_platform == 'darwin'"),
    (XEON, "cpu", f"mistralrs=={CPU_VERSION}", "cpu", f"mlx[cpu]=={MLX_VERSION}{LINUX}"),
    (MI300, "cpu", f"mistralrs=={CPU_VERSION}", "cpu", f"mlx[cpu]=={MLX_VERSION}{LINUX}"),
]


@pytest.mark.parametrize(("hw", "mr_build", "mr_req", "mlx_build", "mlx_req"), CASES)
def test_each_probe_gets_its_builds_packages(
    hw: Hardware, mr_build: str, mr_req: str, mlx_build: str, mlx_req: str
) -> None:
    empty = EngineState()
    mr = engine_install.plan(MISTRAL, empty, hardware=hw)
    assert (mr.build, mr.requirements[0]) == (mr_build, mr_req) and mr.why
    assert "aiohttp>=3.13" in mr.requirements  # the worker's needs come with every build
    mlx = engine_install.plan(MLX, empty, hardware=hw)
    assert mlx.build == mlx_build and mlx.requirements == (f"mlx-lm=={MLX.version}", mlx_req)
    # one-build engines keep their one package, whatever the probe
    piper = engine_install.plan(spec_for("piper"), empty, hardware=hw)
    assert piper.build is None and piper.requirements[0] == f"piper-tts=={spec_for('piper').version}"


def test_an_asked_version_or_pin_applies_to_the_build_s_own_distribution() -> None:
    pinned = EngineState(pinned="0.5.0")
    assert engine_install.plan(MISTRAL, pinned, build="cuda12").requirements[0] == "mistralrs-cuda==0.5.0"
    other = engine_install.plan(MLX, EngineState(), version="0.31.1", build="cuda12")
    assert other.requirements == ("mlx-lm==0.31.1", "mlx[cuda12]; sys_platform == 'linux'")


def test_unknown_builds_are_refused_with_the_valid_ones(
    store: EngineStore, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["engine", "install", "mistral.rs", "--build", "rocm"]) == 2
    err = capsys.readouterr().err
    assert "'rocm' is not a build of mistral.rs (no package for that build)" in err
    assert "its builds are cpu, metal, cuda12, cuda13" in err
    assert main(["engine", "install", "mlx", "--build", "cuda11"]) == 2
    assert (
        "'cuda11' is not a build of mlx (no such build); its builds are cpu, cuda12"
        in capsys.readouterr().err
    )
    assert main(["engine", "install", "piper", "--build", "cuda12"]) == 2
    assert "piper has one build (piper-tts" in capsys.readouterr().err
    assert main(["engine", "update", "--all", "--build", "cpu"]) == 2
    assert "--build goes with one engine" in capsys.readouterr().err
    assert not store.lane_dir("mistral.rs").exists()  # nothing was started
    jobs = EngineJobs(bus=EventBus(), settings=Settings(), store=store)
    with pytest.raises(EngineStateError, match="its builds are cpu, metal, cuda12, cuda13") as exc:
        jobs.start("mistral.rs", build="vulkan")
    assert exc.value.param == "build" and exc.value.status == 400 and jobs.all() == []


# ---- real installs from the wheel folder ----------------------------------------------------------------
def test_install_per_probe_override_ls_and_a_failed_rebuild_keeps_the_old(
    store: EngineStore, capsys: pytest.CaptureFixture[str]
) -> None:
    lane = "mistral.rs"
    bus_lines: list[str] = []
    # an A100 probe: the CUDA 12 build, mistralrs-cuda at its own pin
    done = asyncio.run(engine_install.install(lane, store=store, hardware=A100, on_line=bus_lines.append))
    assert (done.build, done.version, done.changed) == ("cuda12", CUDA_VERSION, True)
    assert f"pip install mistralrs-cuda=={CUDA_VERSION} aiohttp>=3.13" in bus_lines
    assert any(ln.startswith("cuda12 build: NVIDIA A100") for ln in bus_lines)
    cuda_dir = f"{CUDA_VERSION}-cuda12"
    assert Path(done.path) == store.lane_dir(lane) / cuda_dir
    have = _dists(store, lane, cuda_dir)
    assert have["mistralrs-cuda"] == CUDA_VERSION and "mistralrs" not in have
    state = store.read(lane)
    assert state.current is not None and (state.current.build, state.current.dir) == ("cuda12", cuda_dir)

    # engine ls: the installed build, and the fix when this machine calls for another one
    rows = _ls()
    row = rows[lane]
    assert (row["installed_build"], row["version"], row["where"]) == ("cuda12", CUDA_VERSION, "managed")
    cuda, plain = f"mistralrs-cuda=={CUDA_VERSION}", f"mistralrs=={CPU_VERSION}"
    carries = {"cpu": plain, "metal": plain, "cuda12": cuda, "cuda13": cuda}
    assert row["build_requirements"] == [carries[row["build"]]]  # what this machine's build installs
    if row["build"] != "cuda12":
        assert f"`switchyard engine install mistral.rs --build {row['build']}`" in row["build_note"]
        table = _captured(["engine", "ls"])
        assert f"cuda12->{row['build']}" in table and "mistral.rs: the cuda12 build is installed" in table
    else:
        assert row["build_note"] is None
    assert rows["piper"]["installed_build"] is None and rows["piper"]["build_requirements"] is None

    # --build overrides the probe: the CPU build at the engine's version; the CUDA one is kept as previous
    capsys.readouterr()
    assert main(["engine", "install", lane, "--build", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"pip install mistralrs=={CPU_VERSION} aiohttp>=3.13" in out
    assert f"{lane}: {CPU_VERSION} (cpu build) installed in" in out and f"previous {CUDA_VERSION}" in out
    cpu_dir = f"{CPU_VERSION}-cpu"
    have = _dists(store, lane, cpu_dir)
    assert have["mistralrs"] == CPU_VERSION and "mistralrs-cuda" not in have
    row = _ls()[lane]
    assert (row["installed_build"], row["version"], row["previous"]) == ("cpu", CPU_VERSION, CUDA_VERSION)
    assert main(["engine", "install", lane, "--build", "cpu"]) == 0  # same version and build: nothing to do
    assert f"{CPU_VERSION} (cpu build) is already installed" in capsys.readouterr().out

    # the same version with another build, failing after pip wrote the new environment: nothing changes
    before = store.state_file(lane).read_bytes()
    folders = sorted(p.name for p in store.lane_dir(lane).iterdir() if not p.name.startswith("."))
    assert main(["engine", "install", lane, "--build", "cuda12", "--version", CPU_VERSION]) == 1
    err = capsys.readouterr().err
    assert f"mistralrs-cuda {CPU_VERSION} installed but does not import" in err and "libcuda.so.1" in err
    assert f"mistral.rs {CPU_VERSION} is still installed and in use" in err
    assert store.state_file(lane).read_bytes() == before
    assert sorted(p.name for p in store.lane_dir(lane).iterdir() if not p.name.startswith(".")) == folders
    python = venv_python(store.lane_dir(lane) / cpu_dir)
    code = "import importlib.metadata as m, mistralrs; print(mistralrs.BUILD, m.version('mistralrs'))"
    still = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    assert still.returncode == 0 and still.stdout.split() == ["cpu", CPU_VERSION], still.stderr
    managed = store.current(lane)
    assert managed is not None and managed.venv == store.lane_dir(lane) / cpu_dir


def test_mlx_on_a_cuda_13_probe_installs_the_extra(store: EngineStore) -> None:
    done = asyncio.run(engine_install.install("mlx", store=store, hardware=H200))
    assert (done.build, done.version) == ("cuda13", MLX.version)
    have = _dists(store, "mlx", f"{MLX.version}-cuda13")
    assert have["mlx-lm"] == MLX.version and have["mlx"] == MLX_VERSION and have["mlx-cuda-13"] == MLX_VERSION
    assert "mlx-cpu" not in have and "mlx-cuda-12" not in have
    state = store.read("mlx")
    assert state.current is not None and state.current.requirements == (
        f"mlx-lm=={MLX.version}",
        "mlx[cuda13]==0.32.4; sys_platform == 'linux'",
    )


def test_a_broken_recorded_version_is_rebuilt_beside_it_then_pruned(store: EngineStore) -> None:
    """A recorded folder is never built over: a current whose interpreter is gone is rebuilt in a new
    folder, and deleted only once the new one is recorded."""
    broken = store.lane_dir("mistral.rs") / f"{CPU_VERSION}-cpu"
    (broken / "lib").mkdir(parents=True)
    (broken / "lib" / "marker").write_text("left by a half-deleted environment")
    store.write(
        "mistral.rs", EngineState(current=InstalledVersion(CPU_VERSION, broken.name, 1.0, build="cpu"))
    )
    done = asyncio.run(engine_install.install("mistral.rs", store=store, build="cpu"))
    assert done.changed and Path(done.path).name == f"{CPU_VERSION}-cpu.2" and done.previous is None
    state = store.read("mistral.rs")
    assert state.current is not None and (state.current.dir, state.current.build) == (
        f"{CPU_VERSION}-cpu.2",
        "cpu",
    )
    assert not broken.exists()  # pruned after the switch
    assert _dists(store, "mistral.rs", f"{CPU_VERSION}-cpu.2")["mistralrs"] == CPU_VERSION
