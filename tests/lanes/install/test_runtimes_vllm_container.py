"""vLLM and SGLang in their upstream images through a recording `docker` shim (no daemon, no GPU here; the
NVIDIA card is a recorded probe): the runtime choice (package, else auto's container; docker or podman by
name), the exact `run` argv (GPU flags, the model folder read-only under /models, loopback-only port,
labels, engine variables by name and never a secret, the image pinned to the engine's version), a lane
served through it end to end, the container removed at stop and leftovers reaped before a start."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from app.core.errors import EngineUnavailableError
from app.core.paths import Paths
from app.core.settings import Settings
from app.formats.detect import detect_format
from app.formats.safetensors_meta import SafetensorsModel
from app.lanes.engines.cuda import SGLANG, VLLM, cuda_plan
from app.lanes.engines.plan import StartContext
from app.lanes.install.containers import container_name, home_label, load_images, model_mount
from app.lanes.install.store import load_manifest
from app.lanes.lane import LaneState
from app.library.model import ModelEntry
from app.runtime import Runtime
from tests.lanes.install.test_runtimes_build import A100_OLD, H200
from tests.support.modelgen import LlamaDims, llama_tensors, write_hf_dir
from tests.support.release_host import STANDIN
from tests.support.standin_llama_server import STANDIN_TEXT

DIMS = LlamaDims(heads=6, kv_heads=2, hidden=96)
MODEL_ID = "small-llama"
# the engine families a container receives by name: cleared from this test's environment so the expected
# `--env` list is exact wherever the suite runs
_ENGINE_PREFIXES = ("CUDA_", "NVIDIA_", "HIP_", "ROCR_", "ROCM_", "HSA_", "GGML_", "LLAMA_", "VK_", "OMP_",
                    "VLLM_", "SGLANG_", "NCCL_", "TORCH_", "PYTORCH_")  # fmt: skip

# Records each call (argv and the names of the variables it got); `info` lists the runtimes SHIM_INFO
# names; `ps` prints SHIM_PS; `run` starts the stand-in engine on the published host port with the
# arguments that follow the image (the stand-in ignores the engine flags it does not know).
SHIM = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["SHIM_LOG"], "a") as f:
    f.write(json.dumps({{"argv": args, "env": sorted(os.environ)}}) + "\\n")
if args[:1] == ["info"]:
    runtimes = {{name: {{}} for name in os.environ.get("SHIM_INFO", "runc,nvidia").split(",")}}
    print(json.dumps({{"Runtimes": runtimes}}))
elif args[:1] == ["ps"]:
    print(os.environ.get("SHIM_PS", ""))
elif args[:1] == ["run"]:
    port = args[args.index("--publish") + 1].split(":")[1]
    engine = args[args.index(os.environ["SHIM_IMAGE"]) + 1:]
    engine[engine.index("--port") + 1] = port
    engine[engine.index("--host") + 1] = "127.0.0.1"
    os.execv(sys.executable, [sys.executable, {str(STANDIN)!r}, *engine])
"""


def _calls(log: Path) -> list[dict[str, list[str]]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for cli in ("docker", "podman"):
        (bindir / cli).write_text(SHIM)
        (bindir / cli).chmod(0o755)
    log = tmp_path / "docker.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SHIM_LOG", str(log))
    monkeypatch.setenv("SHIM_IMAGE", str(load_images()["vllm"].image_for("cuda12")))
    for name in list(os.environ):
        if name.upper().startswith(_ENGINE_PREFIXES):
            monkeypatch.delenv(name)
    # the server's secrets: none may reach the container or the docker client's environment
    monkeypatch.setenv("HF_TOKEN", "hf_secret_never_forwarded")
    monkeypatch.setenv("VLLM_API_KEY", "sk-would-lock-the-gateway-out")
    monkeypatch.setenv("SWITCHYARD_API_KEY", "sk-switchyard")
    return log


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "models" / MODEL_ID
    write_hf_dir(folder, DIMS.config(), llama_tensors(DIMS))
    return folder


def _entry(folder: Path) -> ModelEntry:
    return ModelEntry(MODEL_ID, folder, None, None, format="safetensors", kind_name="chat")


def _facts(folder: Path) -> SafetensorsModel:
    facts = detect_format(folder).facts
    assert isinstance(facts, SafetensorsModel)
    return facts


def test_images_are_pinned_to_the_engines_versions() -> None:
    images, manifest = load_images(), load_manifest()
    assert set(images) == {"vllm", "sglang"}
    for lane, image in images.items():
        version = manifest[lane].version
        assert image.image_for("cuda12") == f"{image.image}:v{version}-cu129"
        assert image.image_for("cuda13") == f"{image.image}:v{version}-cu130"
        assert image.image_for("cpu") is None and image.image_for("rocm") is None
    assert images["vllm"].image == "vllm/vllm-openai" and images["sglang"].image == "lmsysorg/sglang"


def test_the_package_first_then_a_container_in_auto(shim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got = VLLM.install(Settings())  # no vllm package here; a docker daemon (the shim) with NVIDIA's runtime
    assert got.installed and got.version == "vllm/vllm-openai through docker"
    assert "vLLM is not installed as a package, so the upstream image vllm/vllm-openai runs" in got.note
    assert VLLM.start_refusal(Settings(), A100_OLD) is None
    # a runtime that is llama.cpp's alone, or an order without containers: the package only
    for settings in (Settings.flat(runtime="bin"), Settings.flat(runtime_order="bin,path,xllamacpp")):
        only = SGLANG.install(settings)
        assert not only.installed and "sglang is not installed" in only.note and "docker" not in only.note
    monkeypatch.setenv("SHIM_INFO", "runc")  # a daemon without the NVIDIA runtime (and no CDI spec here)
    if not any(Path(p).exists() for p in ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml")):
        none = VLLM.install(Settings())
        assert not none.installed and "vllm is not installed" in none.note
        assert "docker: no GPU runtime" in none.note and "nvidia-container-toolkit" in none.note
    monkeypatch.setenv("PATH", str(shim.parent / "empty"))
    named = VLLM.install(Settings.flat(runtime="podman"))
    assert not named.installed
    assert named.note == "no vLLM runtime can start here (podman: podman is not on PATH)"


def test_vllm_run_argv_is_exact(shim: Path, model_dir: Path) -> None:
    settings = Settings.flat(
        runtime="docker", engine_env={"vllm": {"VLLM_LOGGING_LEVEL": "DEBUG", "MY_TOKEN": "x"}}
    )
    plan = VLLM.build(_entry(model_dir), settings, StartContext(ppid=77, port=41000, hardware=A100_OLD))
    home = Paths.from_env().home
    name = container_name(MODEL_ID, home=home)
    wrapper = (sys.executable, "-m", "app.lanes.guard", "77", "--",
               sys.executable, "-m", "app.lanes.install.containers", "docker", name, "--")  # fmt: skip
    assert plan.argv[: len(wrapper)] == wrapper and plan.runtime == "docker" and plan.port == 41000
    run = plan.argv[len(wrapper) :]
    image = "vllm/vllm-openai:v" + load_manifest()["vllm"].version + "-cu129"  # driver 535: CUDA 12
    forwarded = ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "DO_NOT_TRACK", "HF_HUB_OFFLINE",
                 "VLLM_LOGGING_LEVEL", "VLLM_NO_USAGE_STATS")  # fmt: skip
    head = (
        "docker", "run", "--rm", "--name", name,
        "--label", f"io.switchyard.home={home_label(home)}", "--label", "io.switchyard.pid=77",
        "--label", f"io.switchyard.lane={MODEL_ID}", "--publish", "127.0.0.1:41000:8080",
        "--gpus", "all", "--shm-size", "16g", "--volume", f"{model_dir}:/models/{MODEL_ID}:ro",
        *(x for n in forwarded for x in ("--env", n)), image,
        f"/models/{MODEL_ID}", "--served-model-name", MODEL_ID, "--host", "0.0.0.0", "--port", "8080",
    )  # fmt: skip
    assert run[: len(head)] == head
    # the memory share and the extra arguments are the package's own, unchanged
    host = cuda_plan(_facts(model_dir), engine="vllm", model_id=MODEL_ID, settings=settings,
                     hardware=A100_OLD, port=41000, ppid=77)  # fmt: skip
    tail = host.argv[host.argv.index("41000") + 1 :]
    assert run[len(head) :] == tail and "--gpu-memory-utilization" in tail
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0" and plan.env["HF_HUB_OFFLINE"] == "1"
    # no secret: not on the command line, not among the names, not in the docker client's environment
    text = " ".join(plan.argv)
    for secret in ("HF_TOKEN", "VLLM_API_KEY", "SWITCHYARD_API_KEY", "MY_TOKEN", "hf_secret", "sk-"):
        assert secret not in text
    assert not {"HF_TOKEN", "VLLM_API_KEY", "SWITCHYARD_API_KEY"} & set(plan.env)


def test_sglang_in_its_image_per_build_and_cli(shim: Path, model_dir: Path) -> None:
    for hw, suffix, cli, gpu in (
        (A100_OLD, "cu129", "docker", ("--gpus", "all")),
        (H200, "cu130", "podman", ("--device", "nvidia.com/gpu=all")),  # podman: NVIDIA's CDI device
    ):
        settings = Settings.flat(runtime=cli)
        plan = SGLANG.build(_entry(model_dir), settings, StartContext(ppid=5, port=42000, hardware=hw))
        run = plan.argv[plan.argv.index("run") - 1 :]
        assert run[0] == cli and plan.runtime == cli
        at = run.index("--publish")
        assert run[at + 1] == "127.0.0.1:42000:8080" and run[at + 2 : at + 4] == gpu
        image = f"lmsysorg/sglang:v{load_manifest()['sglang'].version}-{suffix}"
        after = run[run.index(image) + 1 :]
        assert after[:10] == (
            "python3", "-m", "sglang.launch_server", "--model-path", f"/models/{MODEL_ID}",
            "--served-model-name", MODEL_ID, "--host", "0.0.0.0", "--port",
        )  # fmt: skip
        assert after[10] == "8080" and "--mem-fraction-static" in after
        assert f"{model_dir}:/models/{MODEL_ID}:ro" in run


def test_a_hugging_face_snapshot_mounts_its_repository(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--small"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_text("{}")
    snap = repo / "snapshots" / "rev1"
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/abc")
    mount, inside = model_mount(snap)
    assert (mount.host, mount.container, mount.read_only) == (str(repo), "/models/models--org--small", True)
    assert inside == "/models/models--org--small/snapshots/rev1"
    far = tmp_path / "elsewhere" / "deep" / "er" / "model"
    far.mkdir(parents=True)
    (far / "model.safetensors").symlink_to(tmp_path / "weights.safetensors")
    with pytest.raises(EngineUnavailableError, match="outside the folder a container would see"):
        model_mount(far)


@pytest.fixture
async def vllm_rt(shim: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Runtime]:
    monkeypatch.setenv("SHIM_PS", f"switchyard-gone-old 999999999\nswitchyard-live-x {os.getpid()}")
    settings = Settings.flat(
        models_dirs=(model_dir.parent,),
        runtime="docker",
        engine_env_pass=("SHIM_LOG", "SHIM_IMAGE", "SHIM_PS"),
        monitor_interval_s=0,
    )
    rt = Runtime(settings=settings, paths=Paths.from_env())
    async with rt:
        rt.supervisor.hardware = A100_OLD  # a recorded NVIDIA probe: no card here
        yield rt


async def test_a_vllm_lane_runs_in_its_image_is_reaped_before_and_removed_after(
    vllm_rt: Runtime, shim: Path, model_dir: Path
) -> None:
    lane = await vllm_rt.supervisor.ensure(MODEL_ID)
    assert lane.state is LaneState.READY and lane.plan is not None
    assert lane.plan.engine == "vllm" and lane.plan.runtime == "docker"
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(f"{lane.base_url}/v1/chat/completions", json=body) as resp:
            assert (await resp.json())["choices"][0]["message"]["content"] == STANDIN_TEXT
    calls = [c["argv"] for c in _calls(shim)]
    run_at = next(i for i, c in enumerate(calls) if c[:1] == ["run"])
    # the dead server's container went before this one started; the live server's stayed
    assert ["rm", "--force", "switchyard-gone-old"] in calls[:run_at]
    assert not any("switchyard-live-x" in c for c in calls)
    run = calls[run_at]
    assert f"{model_dir}:/models/{MODEL_ID}:ro" in run
    assert run[run.index("--publish") + 1] == f"127.0.0.1:{lane.plan.port}:8080"
    docker_env = _calls(shim)[run_at]["env"]
    assert not {"HF_TOKEN", "VLLM_API_KEY", "SWITCHYARD_API_KEY"} & set(docker_env)
    assert not any("TOKEN" in a or "API_KEY" in a for a in run)
    name = container_name(MODEL_ID, home=vllm_rt.paths.home)
    await vllm_rt.supervisor.unload(MODEL_ID)
    after = [c["argv"] for c in _calls(shim)][run_at + 1 :]
    assert ["rm", "--force", name] in after
