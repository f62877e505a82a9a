"""Container runtimes through a recording `docker` shim (no daemon, no registry here): the exact `run`
argv (GPU flags per build, read-only mounts, loopback-only port, labels, variables by name and no secrets),
a lane served through it end to end, the container removed at the lane's stop, and leftovers reaped."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from app.core.paths import Paths
from app.core.settings import Settings
from app.lanes.engines.llamacpp.server import _in_container
from app.lanes.install.containers import (
    ContainerRun,
    Mount,
    container_name,
    forwarded_env,
    home_label,
    reap,
    run_argv,
)
from app.lanes.lane import LaneState
from app.lanes.workers.params import LlamaParams
from app.runtime import Runtime
from tests.conftest import link_models
from tests.support.release_host import STANDIN
from tests.support.standin_llama_server import STANDIN_TEXT

# The shim records each call (argv and the variables it was given), answers `info` and `ps`, and for
# `run` starts the stand-in llama-server on the published host port with the image's arguments.
SHIM = f"""#!{sys.executable}
import json, os, sys
log = os.environ["SHIM_LOG"]
args = sys.argv[1:]
with open(log, "a") as f:
    f.write(json.dumps({{"argv": args, "env": sorted(os.environ)}}) + "\\n")
if args[:1] == ["info"]:
    print(json.dumps({{"Runtimes": {{"runc": {{}}, "nvidia": {{}}}}}}))
elif args[:1] == ["ps"]:
    print(os.environ.get("SHIM_PS", ""))
elif args[:1] == ["run"]:
    port = args[args.index("--publish") + 1].split(":")[1]
    image_at = args.index(os.environ["SHIM_IMAGE"])
    engine = args[image_at + 1:]
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
    (bindir / "docker").write_text(SHIM)
    (bindir / "docker").chmod(0o755)
    log = tmp_path / "docker.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SHIM_LOG", str(log))
    monkeypatch.setenv("SHIM_IMAGE", "ghcr.io/ggml-org/llama.cpp:server-b7400")
    return log


def test_run_argv_is_exact_per_build() -> None:
    home = Path("/data/home")
    run = ContainerRun(
        cli="docker",
        image="ghcr.io/ggml-org/llama.cpp:server-cuda-b7400",
        name="switchyard-x-tiny",
        build="cuda12",
        host_port=41234,
        home=home,
        lane="tiny",
        mounts=(Mount("/m", "/models"),),
        env_names=("CUDA_VISIBLE_DEVICES",),
        args=("--model", "/models/tiny.gguf"),
        owner_pid=77,
    )
    assert run_argv(run) == (
        "docker", "run", "--rm", "--name", "switchyard-x-tiny",
        "--label", f"io.switchyard.home={home_label(home)}", "--label", "io.switchyard.pid=77",
        "--label", "io.switchyard.lane=tiny", "--publish", "127.0.0.1:41234:8080", "--gpus", "all",
        "--volume", "/m:/models:ro", "--env", "CUDA_VISIBLE_DEVICES",
        "ghcr.io/ggml-org/llama.cpp:server-cuda-b7400", "--model", "/models/tiny.gguf",
    )  # fmt: skip
    podman = run_argv(ContainerRun(**{**run.__dict__, "cli": "podman"}))
    assert podman[podman.index("--publish") + 2 : podman.index("--volume")] == (
        "--device",
        "nvidia.com/gpu=all",
    )
    rocm = run_argv(ContainerRun(**{**run.__dict__, "build": "rocm"}))
    assert "/dev/kfd" in rocm and "/dev/dri" in rocm and "--gpus" not in rocm


def test_only_engine_variables_are_forwarded_never_secrets() -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "0",
        "GGML_CUDA_NO_PINNED": "1",
        "LLAMA_API_KEY": "sk-engine",
        "HF_TOKEN": "hf_x",
        "SWITCHYARD_HOME": "/h",
        "PATH": "/usr/bin",
    }
    assert forwarded_env(env, extra={"MY_FLAG": "1", "OPENAI_API_KEY": "sk"}) == (
        "CUDA_VISIBLE_DEVICES",
        "GGML_CUDA_NO_PINNED",
        "MY_FLAG",
    )


@pytest.fixture
async def docker_rt(shim: Path, model_store: Path, tmp_path: Path) -> AsyncIterator[Runtime]:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    os.environ["HF_TOKEN"] = "hf_secret_never_forwarded"  # the server has one; the container must not
    try:
        rt = Runtime(
            settings=Settings.flat(
                models_dirs=(models,), runtime="docker", engine_env_pass=("SHIM_LOG", "SHIM_IMAGE")
            ),
            paths=Paths.from_env(),
        )
        async with rt:
            yield rt
    finally:
        del os.environ["HF_TOKEN"]


async def test_a_lane_runs_in_the_container_and_is_removed_at_stop(docker_rt: Runtime, shim: Path) -> None:
    lane = await docker_rt.supervisor.ensure("tiny")
    assert lane.state is LaneState.READY and lane.plan is not None and lane.plan.runtime == "docker"
    async with aiohttp.ClientSession() as s:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(f"{lane.base_url}/v1/chat/completions", json=body) as resp:
            assert (await resp.json())["choices"][0]["message"]["content"] == STANDIN_TEXT
    run = next(c for c in _calls(shim) if c["argv"][:1] == ["run"])
    argv = run["argv"]
    model_dir = str(Path(docker_rt.catalog.get("tiny").path).parent)
    assert f"{model_dir}:/models:ro" in argv and argv[argv.index("--model") + 1] == "/models/tiny.gguf"
    assert argv[argv.index("--publish") + 1] == f"127.0.0.1:{lane.plan.port}:8080"
    assert not any("HF_TOKEN" in a for a in argv) and "HF_TOKEN" not in run["env"]
    name = container_name("tiny", home=docker_rt.paths.home)
    await docker_rt.supervisor.unload("tiny")
    assert ["rm", "--force", name] in [c["argv"] for c in _calls(shim)]


def _hf_cached(hub: Path, repo: str, src: Path, rel: str) -> Path:
    """`src` laid out as huggingface_hub caches it: the bytes in blobs/<sha256>, the snapshot's file a
    relative link to that blob, refs/main naming the snapshot."""
    data = src.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    folder = hub / f"models--{repo.replace('/', '--')}"
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    (folder / "blobs" / sha).write_bytes(data)
    commit = "a" * 40
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    link = folder / "snapshots" / commit / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(folder / "blobs" / sha, link.parent))
    return link


def _host_side(inside: str, mounts: list[tuple[str, str]]) -> Path:
    """The host path a container path lands on through `mounts` (host, container)."""
    host, at = next((h, c) for h, c in mounts if inside.startswith(c + "/"))
    return Path(host, os.path.relpath(inside, at))


async def test_a_gguf_in_the_hf_cache_is_mounted_with_its_blobs(
    shim: Path, model_store: Path, tmp_path: Path
) -> None:
    # a snapshot's GGUF is a link into the repository's blobs/, here from a subfolder as split quants are
    link = _hf_cached(tmp_path / "hf" / "hub", "org/tiny-GGUF", model_store / "tiny.gguf", "Q8_0/tiny.gguf")
    rt = Runtime(
        settings=Settings.flat(runtime="docker", engine_env_pass=("SHIM_LOG", "SHIM_IMAGE")),
        paths=Paths.from_env(),
    )
    async with rt:
        assert rt.catalog.get("org/tiny-GGUF/tiny").path == link
        lane = await rt.supervisor.ensure("org/tiny-GGUF/tiny")
        assert lane.state is LaneState.READY
        await rt.supervisor.unload("org/tiny-GGUF/tiny")
    argv = next(c for c in _calls(shim) if c["argv"][:1] == ["run"])["argv"]
    volumes = [argv[i + 1].removesuffix(":ro").split(":") for i, a in enumerate(argv) if a == "--volume"]
    repo = link.parents[2].parent
    assert volumes == [[str(repo.resolve()), "/models"]]
    inside = argv[argv.index("--model") + 1]
    assert inside == "/models/snapshots/" + "a" * 40 + "/Q8_0/tiny.gguf"
    # the link, followed from where the mount puts it, stays inside the mount and reaches the blob
    landed = _host_side(inside, [(v[0], v[1]) for v in volumes])
    assert landed.is_symlink() and not os.path.isabs(os.readlink(landed))
    assert landed.resolve().is_relative_to(repo.resolve() / "blobs")
    assert landed.read_bytes() == (model_store / "tiny.gguf").read_bytes()


def test_a_projector_shares_the_models_mount_or_gets_its_own(model_store: Path, tmp_path: Path) -> None:
    hub = tmp_path / "hf" / "hub"
    model = _hf_cached(hub, "org/v-GGUF", model_store / "tiny.gguf", "v.gguf")
    proj = _hf_cached(hub, "org/v-GGUF", model_store / "tiny2.gguf", "mmproj-v.gguf")
    params = LlamaParams(str(model), "v", 512, 1, 1, "f16", "auto", 0, False, None, mmproj_path=str(proj))
    inside, mounts = _in_container(params)
    assert [(m.container, m.read_only) for m in mounts] == [("/models", True)]
    assert inside.mmproj_path == "/models/snapshots/" + "a" * 40 + "/mmproj-v.gguf"
    landed = _host_side(inside.mmproj_path, [(m.host, m.container) for m in mounts])
    assert landed.read_bytes() == (model_store / "tiny2.gguf").read_bytes()
    # a plain projector in another folder: that folder alone, under /mmproj, never walked for links
    plain = link_models(tmp_path / "elsewhere", model_store / "tiny2.gguf") / "tiny2.gguf"
    inside, mounts = _in_container(dataclasses.replace(params, mmproj_path=str(plain)))
    assert [(m.host, m.container) for m in mounts][1:] == [(str(plain.parent), "/mmproj")]
    assert inside.mmproj_path == "/mmproj/tiny2.gguf"


def test_leftovers_of_a_dead_server_are_reaped(
    shim: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHIM_PS", f"switchyard-old-tiny 999999999\nswitchyard-live-x {os.getpid()}")
    assert reap("docker", home=tmp_path) == ["switchyard-old-tiny"]
    calls = [c["argv"] for c in _calls(shim)]
    assert calls[0][:4] == ["ps", "--all", "--filter", f"label=io.switchyard.home={home_label(tmp_path)}"]
    assert calls[-1] == ["rm", "--force", "switchyard-old-tiny"]


def test_a_draft_and_adapters_are_mounted_where_the_container_sees_them(tmp_path: Path) -> None:
    models, drafts = tmp_path / "models", tmp_path / "drafts"
    for f in (models / "m.gguf", models / "style.gguf", drafts / "d.gguf", tmp_path / "loras" / "x.gguf"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"GGUF")
    params = LlamaParams(
        model_path=str(models / "m.gguf"),
        alias="m",
        ctx_size=512,
        parallel=1,
        threads=1,
        kv_type="f16",
        flash_attn="auto",
        gpu_layers=0,
        embedding=False,
        pooling=None,
        spec_type="draft_simple",
        draft_path=str(drafts / "d.gguf"),
        lora_paths=(str(models / "style.gguf"), str(tmp_path / "loras" / "x.gguf")),
        lora_scales=(1.0, 0.5),
    )
    inside, mounts = _in_container(params)
    assert [(m.host, m.container, m.read_only) for m in mounts] == [
        (str(models), "/models", True),
        (str(drafts), "/extra-draft", True),
        (str(tmp_path / "loras"), "/extra-lora-1", True),
    ]
    assert inside.model_path == "/models/m.gguf" and inside.draft_path == "/extra-draft/d.gguf"
    assert inside.lora_paths == ("/models/style.gguf", "/extra-lora-1/x.gguf")  # same folder, same mount
