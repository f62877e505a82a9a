"""Engines in containers (docker or podman): the `run` command line, labels, and reaping leftovers.

A lane's container publishes its port on loopback only, mounts the model read-only, gets the GPU flags of
its build, and receives the engine's own variables by name (`-e NAME`: values stay off the command line);
the server's secrets are never among them. Every container carries our labels, so one left behind by a
server that was killed is found and removed at the next container start (`reap`).

`python -m app.lanes.containers CLI NAME -- RUN ARGS...` runs under the lane's guard: it starts the
container in the foreground and, when the lane stops it, stops and removes it by name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LABEL_HOME = "io.switchyard.home"  # which data dir's server owns it
LABEL_PID = "io.switchyard.pid"  # that server's pid: a container whose pid is gone is a leftover
LABEL_LANE = "io.switchyard.lane"
CONTAINER_PORT = 8080
STOP_GRACE_S = 5
# the engine's own switches, forwarded by name; anything that looks like a credential never is
_FORWARD_PREFIXES = (
    "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "ROCM_", "HSA_", "GGML_", "LLAMA_", "VK_", "OMP_", "VLLM_",
    "SGLANG_", "NCCL_", "TORCH_", "PYTORCH_",
)  # fmt: skip
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
    owner_pid: int = field(default_factory=os.getpid)


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
    names = {n for n in env if n.upper().startswith(_FORWARD_PREFIXES)} | set(extra or {})
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
    ]
    for m in run.mounts:
        argv += ["--volume", f"{m.host}:{m.container}{':ro' if m.read_only else ''}"]
    for name in run.env_names:
        argv += ["--env", name]
    return (*argv, run.image, *run.args)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        if name and not (pid.isdigit() and _pid_alive(int(pid))):
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
        print("usage: python -m app.lanes.containers CLI NAME -- RUN ARGV...", file=sys.stderr)
        return 2
    cli, name, program = argv[0], argv[1], list(argv[3:])
    stopping: list[int] = []

    def on_stop(signum: int, _frame: object) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_stop)
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
