"""Engines in containers (docker or podman): the `run` command line, labels, and reaping leftovers.

A lane's container publishes its port on loopback only, mounts the model read-only, gets the GPU flags of
its build, and receives the engine's own variables by name (`-e NAME`: values stay off the command line);
the server's secrets are never among them. Every container carries our labels, so one left behind by a
server that was killed is found and removed at the next container start (`reap`).

`python -m app.lanes.install.containers CLI NAME -- RUN ARGS...` runs under the lane's guard: it starts the
container in the foreground and, when the lane stops it, stops and removes it by name.

The vLLM and SGLang images are listed under [containers] in engines.toml (`ContainerImage`, one tag per
build, at the engine's pinned version); `engine_in_container` turns the lane's own command line for the
Python package into the same engine run in its image.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import subprocess
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from app.core.errors import EngineUnavailableError
from app.core.frozen import module_argv
from app.core.platform.procs import pid_alive
from app.core.platform.signals import on_stop_signals_plain
from app.lanes.install.store import MANIFEST

if TYPE_CHECKING:
    from app.lanes.engines.plan import LaunchPlan

LABEL_HOME = "io.switchyard.home"  # which data dir's server owns it
LABEL_PID = "io.switchyard.pid"  # that server's pid: a container whose pid is gone is a leftover
LABEL_LANE = "io.switchyard.lane"
CONTAINER_PORT = 8080
MODELS_MOUNT = "/models"
STOP_GRACE_S = 5
# how far above a model folder the files it links to may lie: a Hugging Face snapshot
# (models--org--name/snapshots/REV) links into the repository's blobs/, two levels up
LINK_REACH = 2
# the engine's own switches, forwarded by name; anything that looks like a credential never is
_FORWARD_PREFIXES = (
    "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "ROCM_", "HSA_", "GGML_", "LLAMA_", "VK_", "OMP_", "VLLM_",
    "SGLANG_", "NCCL_", "TORCH_", "PYTORCH_",
)  # fmt: skip
# single names an engine reads besides those families (a local model: no hub requests, no telemetry)
_FORWARD_NAMES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "DO_NOT_TRACK")
_SECRET_MARKS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")


@dataclass(frozen=True)
class Mount:
    host: str
    container: str
    read_only: bool = True


@dataclass(frozen=True, kw_only=True)
class ContainerRun:
    """One engine container: what runs, where its port goes, what it sees."""

    cli: str  # "docker" or "podman" (the program: a path works too)
    image: str
    name: str
    build: str  # cpu, cuda12, cuda13, rocm, vulkan
    host_port: int
    home: Path
    lane: str
    container_port: int = CONTAINER_PORT
    mounts: tuple[Mount, ...] = ()
    env_names: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    run_flags: tuple[str, ...] = ()  # what the image needs besides the GPU (vLLM's shared memory)
    owner_pid: int = field(default_factory=os.getpid)


@dataclass(frozen=True)
class ContainerImage:
    """One engine's upstream image, from [containers.<lane>] in engines.toml."""

    lane: str
    image: str  # the repository, without a tag
    tags: dict[str, str]  # build -> tag, the engine's pinned version filled in
    command: tuple[str, ...]  # what runs before the engine's arguments; (): the image's entrypoint
    model_flag: str  # the flag before the model's path; "": the path is the first argument
    shm_size: str  # --shm-size; "": docker's default

    def image_for(self, build: str) -> str | None:
        tag = self.tags.get(build)
        return None if tag is None else f"{self.image}:{tag}"


@functools.lru_cache(maxsize=4)
def load_images(path: Path = MANIFEST) -> dict[str, ContainerImage]:
    """The [containers] table by lane; `{version}` in a tag is [engines.<lane>].version. It ships with
    the code, so a broken one raises."""
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    out: dict[str, ContainerImage] = {}
    for lane, c in raw.get("containers", {}).items():
        version = str(raw["engines"][lane]["version"])
        tags = {build: str(t).replace("{version}", version) for build, t in c["tags"].items()}
        out[lane] = ContainerImage(
            lane,
            str(c["image"]),
            tags,
            tuple(str(a) for a in c.get("command", ())),
            str(c.get("model_flag", "")),
            str(c.get("shm_size", "")),
        )
    return out


def home_label(home: Path) -> str:
    return hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:16]


def container_name(lane: str, *, home: Path) -> str:
    """A name docker accepts, one per lane per data dir."""
    safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in lane)[:40].strip("-.") or "lane"
    return f"switchyard-{home_label(home)[:8]}-{safe}"


def _cli_name(cli: str) -> str:
    return Path(cli).name


def gpu_flags(cli: str, build: str) -> list[str]:
    """The flags that hand the backend's GPU to a container."""
    if build.startswith("cuda"):
        # docker's NVIDIA runtime takes --gpus; podman reaches the card through its CDI spec
        return ["--device", "nvidia.com/gpu=all"] if _cli_name(cli) == "podman" else ["--gpus", "all"]
    if build == "rocm":
        return ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video"]
    if build == "vulkan":
        return ["--device", "/dev/dri"]
    return []


def forwarded_env(env: Mapping[str, str], *, extra: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The names passed into the container: engine switches and the user's engine_env, never secrets."""
    names = {n for n in env if n.upper().startswith(_FORWARD_PREFIXES) or n.upper() in _FORWARD_NAMES}
    names |= set(extra or {})
    return tuple(
        sorted(
            n
            for n in names
            if not any(m in n.upper() for m in _SECRET_MARKS) and not n.upper().startswith("SWITCHYARD")
        )
    )


def run_argv(run: ContainerRun) -> tuple[str, ...]:
    """`CLI run ...`: removed when it stops, labelled, port on 127.0.0.1 only, mounts read-only."""
    argv = [
        run.cli,
        "run",
        "--rm",
        "--name",
        run.name,
        "--label",
        f"{LABEL_HOME}={home_label(run.home)}",
        "--label",
        f"{LABEL_PID}={run.owner_pid}",
        "--label",
        f"{LABEL_LANE}={run.lane}",
        "--publish",
        f"127.0.0.1:{run.host_port}:{run.container_port}",
        *gpu_flags(run.cli, run.build),
        *run.run_flags,
    ]
    for m in run.mounts:
        argv += ["--volume", f"{m.host}:{m.container}{':ro' if m.read_only else ''}"]
    for name in run.env_names:
        argv += ["--env", name]
    return (*argv, run.image, *run.args)


def guarded_argv(run: ContainerRun, *, ppid: int) -> tuple[str, ...]:
    """The lane's command: the guard (dies with the server), then our wrapper (removes the container
    when the lane stops), then `CLI run ...`."""
    wrapper = (*module_argv("app.lanes.install.containers"), run.cli, run.name, "--")
    return (*module_argv("app.lanes.guard"), str(ppid), "--", *wrapper, *run_argv(run))


def model_mount(model: Path) -> tuple[Mount, str]:
    """A read-only mount under /models that holds the model folder and every file it links to, and the
    folder's path inside. A Hugging Face snapshot links into the repository's blobs/, so the repository
    is mounted; links that reach further are refused (the container would see broken files)."""
    base = model.resolve()
    targets = [
        (Path(root) / name).resolve()
        for root, dirs, names in os.walk(base)
        for name in (*dirs, *names)
        if (Path(root) / name).is_symlink()
    ]
    top = Path(os.path.commonpath([base, *targets]))
    inner = base.relative_to(top).parts
    if len(inner) > LINK_REACH or top == Path(top.anchor):
        far = next(t for t in targets if not t.is_relative_to(base))
        raise EngineUnavailableError(
            f"{model} links to {far}, outside the folder a container would see; copy the files into "
            "the folder, or use the engine's Python package instead of a container"
        )
    inside = PurePosixPath(MODELS_MOUNT, top.name, *inner)
    return Mount(str(top), str(PurePosixPath(MODELS_MOUNT, top.name))), str(inside)


def _engine_tail(argv: Sequence[str]) -> tuple[str, ...]:
    """What follows `--host 127.0.0.1 --port P` in a lane's own command line (the memory share and the
    extra arguments): the part that runs unchanged in the container."""
    for i in range(len(argv) - 3):
        if argv[i] == "--host" and argv[i + 1] == "127.0.0.1" and argv[i + 2] == "--port":
            return tuple(argv[i + 4 :])
    raise EngineUnavailableError(
        "the engine's command line has no `--host 127.0.0.1 --port P` to move into a container; report this"
    )


def engine_in_container(
    plan: LaunchPlan,
    *,
    cli: str,
    image: ContainerImage,
    build: str,
    model_id: str,
    model_path: Path,
    home: Path,
    ppid: int,
    engine_env: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """The lane's plan for the engine's Python package (vLLM, SGLang), run in its upstream image instead:
    the same memory share and extra arguments, the model folder read-only under /models, the port on
    loopback, the plan's engine variables by name. Leftovers of a killed server are reaped first."""
    tag = image.image_for(build)
    if tag is None or plan.port is None:
        raise EngineUnavailableError(
            f"no {image.lane} image for the {build} build; known: {sorted(image.tags)}"
        )
    mount, inside = model_mount(model_path)
    model_args = (image.model_flag, inside) if image.model_flag else (inside,)
    args = (
        *image.command,
        *model_args,
        "--served-model-name",
        model_id,
        "--host",
        "0.0.0.0",  # inside the container; the host publishes the port on 127.0.0.1 only
        "--port",
        str(CONTAINER_PORT),
        *_engine_tail(plan.argv),
    )
    reap(cli, home=home)
    run = ContainerRun(
        cli=cli,
        image=tag,
        name=container_name(model_id, home=home),
        build=build,
        host_port=plan.port,
        home=home,
        lane=model_id,
        mounts=(mount,),
        env_names=forwarded_env(plan.env, extra=engine_env),
        args=args,
        run_flags=("--shm-size", image.shm_size) if image.shm_size else (),
        owner_pid=ppid,
    )
    note = f"{image.lane} runs in {tag} through {_cli_name(cli)}; the model is mounted at {inside}"
    return dataclasses.replace(
        plan, runtime=_cli_name(cli), argv=guarded_argv(run, ppid=ppid), notes=(*plan.notes, note)
    )


def reap(cli: str, *, home: Path, timeout_s: float = 20) -> list[str]:
    """Remove this data dir's containers whose server is gone; the names removed."""
    fmt = '{{.Names}} {{.Label "' + LABEL_PID + '"}}'
    try:
        done = subprocess.run(
            [cli, "ps", "--all", "--filter", f"label={LABEL_HOME}={home_label(home)}", "--format", fmt],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    gone = []
    for line in done.stdout.splitlines():
        name, _, pid = line.strip().partition(" ")
        if name and not (pid.isdigit() and pid_alive(int(pid))):
            gone.append(name)
    if gone:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([cli, "rm", "--force", *gone], capture_output=True, timeout=timeout_s, check=False)
    return gone


def _remove(cli: str, name: str) -> None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run([cli, "stop", "--time", str(STOP_GRACE_S), name], capture_output=True, timeout=30)
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run([cli, "rm", "--force", name], capture_output=True, timeout=30)


def main(argv: Sequence[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m app.lanes.install.containers CLI NAME -- RUN ARGV...", file=sys.stderr)
        return 2
    cli, name, program = argv[0], argv[1], list(argv[3:])
    stopping: list[int] = []

    def on_stop(signum: int, _frame: object) -> None:
        stopping.append(signum)

    on_stop_signals_plain(on_stop)
    try:
        child = subprocess.Popen(program)
    except OSError as exc:
        print(f"switchyard: cannot run {cli}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    try:
        while True:
            try:
                code = child.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if stopping:
                    _remove(cli, name)  # the client may not pass the signal on; the container must go
                    stopping.clear()
    finally:
        _remove(cli, name)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
