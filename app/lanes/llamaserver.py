"""llama.cpp on the runtime that matches this machine: a container, a pinned release, PATH, or the wheel.

The same engine kind as `LlamaCppKind` (same lane id, formats and memory plan); only the runtime choice
differs: `app.lanes.runtimes` picks one in order, and the command line is built for it. `bin` and `path`
run `llama-server` under the guard; `docker` and `podman` run the upstream image through
`app.lanes.containers` under the guard; `xllamacpp` is our worker, as before.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from app.core.errors import EngineUnavailableError
from app.core.frozen import module_argv
from app.core.paths import Paths
from app.core.settings import Settings
from app.hardware.model import Hardware
from app.lanes import containers
from app.lanes.llamacpp import LlamaCppKind, build_plan, llama_server_argv
from app.lanes.plan import LaunchPlan
from app.lanes.runtimes import RuntimeChoice, choose_runtime
from app.lanes.worker_params import LlamaParams
from app.library.model import ModelEntry
from app.routing.engines import build_title
from app.routing.model import LaneInstall

log = logging.getLogger("switchyard.llamaserver")
MODELS_MOUNT = "/models"
PROJECTOR_MOUNT = "/mmproj"


@dataclasses.dataclass(frozen=True)
class _Start:
    """What every runtime's plan is built from besides the model and the settings."""

    ppid: int
    free_port: int
    hardware: Hardware | None
    used: Mapping[str, int] | None

    def plan(self, entry: ModelEntry, settings: Settings) -> LaunchPlan:
        return build_plan(
            entry, settings, ppid=self.ppid, free_port=self.free_port, hardware=self.hardware, used=self.used
        )


def _binary_plan(entry: ModelEntry, settings: Settings, binary: str, at: _Start) -> LaunchPlan:
    """llama-server at `binary` (a release asset or PATH), its shared libraries beside it."""
    pinned = dataclasses.replace(settings, runtime="llama-server", llama_server_path=binary)
    plan = at.plan(entry, pinned)
    env = dict(plan.env)
    libdir = str(Path(binary).parent)
    var = "DYLD_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"
    env[var] = f"{libdir}:{env[var]}" if env.get(var) else libdir
    return dataclasses.replace(plan, env=env)


def _in_container(params: LlamaParams) -> tuple[LlamaParams, tuple[containers.Mount, ...]]:
    """The params as the container sees them (model and projector under read-only mounts)."""
    model = Path(params.model_path)
    mounts = [containers.Mount(str(model.parent), MODELS_MOUNT)]
    inside = dataclasses.replace(
        params,
        model_path=str(PurePosixPath(MODELS_MOUNT) / model.name),
        slot_save_path="",  # the bank's folder stays on the host: no slot files from a container
    )
    if params.mmproj_path:
        proj = Path(params.mmproj_path)
        mounts.append(containers.Mount(str(proj.parent), PROJECTOR_MOUNT))
        inside = dataclasses.replace(inside, mmproj_path=str(PurePosixPath(PROJECTOR_MOUNT) / proj.name))
    return inside, tuple(mounts)


def _engine_args(params: LlamaParams) -> tuple[str, ...]:
    """llama-server's own arguments for the container: listening on all of the container's interfaces
    (the host publishes the port on loopback only)."""
    argv = list(llama_server_argv("llama-server", params, port=containers.CONTAINER_PORT, ppid=0))
    args = argv[argv.index("--") + 2 :]
    args[args.index("--host") + 1] = "0.0.0.0"
    return tuple(args)


def _container_plan(entry: ModelEntry, settings: Settings, choice: RuntimeChoice, at: _Start) -> LaunchPlan:
    if choice.runtime is None or choice.image is None or choice.build is None:
        raise EngineUnavailableError(f"runtime {choice.runtime}: no container image chosen ({choice.why})")
    # the plan of a binary start (memory, params), then the same params run in the image
    base = _binary_plan(entry, settings, sys.executable, at)
    ppid, free_port = at.ppid, at.free_port
    inside, mounts = _in_container(base.params)
    home = Paths.from_env().home
    containers.reap(choice.runtime, home=home)  # leftovers of a server that was killed
    run = containers.ContainerRun(
        cli=choice.runtime,
        image=choice.image,
        name=containers.container_name(entry.id, home=home),
        build=choice.build,
        host_port=free_port,
        home=home,
        lane=entry.id,
        mounts=mounts,
        env_names=containers.forwarded_env(base.env, extra=settings.engine_env.get("llama.cpp")),
        args=_engine_args(inside),
        owner_pid=ppid,
    )
    wrapper = (*module_argv("app.lanes.containers"), choice.runtime, run.name, "--")
    argv = (*module_argv("app.lanes.guard"), str(ppid), "--", *wrapper, *containers.run_argv(run))
    params, notes = base.params, base.notes
    if params.slot_save_path:  # banking was on for this model: say why it is off, once per start
        why = (
            f"session bank off for {entry.id}: llama-server runs in a {choice.runtime} container, which "
            "cannot write the bank's folder on this machine (the bin or xllamacpp runtime banks)"
        )
        log.info(why)
        params, notes = dataclasses.replace(params, slot_save_path=""), (*notes, why)
    return dataclasses.replace(base, argv=argv, port=free_port, params=params, notes=notes)


def plan_for(
    choice: RuntimeChoice,
    entry: ModelEntry,
    settings: Settings,
    *,
    ppid: int,
    free_port: int,
    hardware: Hardware | None,
    used: Mapping[str, int] | None,
) -> LaunchPlan:
    """The launch plan for `entry` on the runtime `choice` names."""
    at = _Start(ppid, free_port, hardware, used)
    if choice.runtime is None:
        raise EngineUnavailableError(choice.refusal())
    if choice.runtime == "xllamacpp":
        plan = at.plan(entry, dataclasses.replace(settings, runtime="xllamacpp"))
    elif choice.runtime in ("bin", "path"):
        if choice.binary is None:
            raise EngineUnavailableError(f"runtime {choice.runtime}: no llama-server binary ({choice.why})")
        plan = _binary_plan(entry, settings, choice.binary, at)
    else:
        plan = _container_plan(entry, settings, choice, at)
    note = f"runtime {choice.runtime}, {build_title(choice.build)}: {choice.why}"
    skipped = tuple(f"runtime {s.runtime} skipped: {s.skipped}" for s in choice.steps if s.skipped)
    # a binary from PATH keeps the runtime's older name, which logs and the admin API have shown
    runtime = "llama-server" if choice.runtime == "path" else choice.runtime
    return dataclasses.replace(plan, runtime=runtime, notes=(*plan.notes, *skipped, note))


class LlamaRuntimesKind(LlamaCppKind):
    """LlamaCppKind whose runtime is chosen by `app.lanes.runtimes` (docker, podman, bin, path, wheel)."""

    def install(self, settings: Settings) -> LaneInstall:
        return self.install_on(settings, None)

    def install_on(self, settings: Settings, hardware: Hardware | None) -> LaneInstall:
        choice = choose_runtime(settings, hardware)
        if choice.runtime is None:
            return LaneInstall(self.lane, False, None, note=choice.refusal())
        build = f"runtime {choice.runtime}, {build_title(choice.build)}: {choice.why}"
        if choice.runtime == "xllamacpp":
            wheel = super().install(dataclasses.replace(settings, runtime="xllamacpp"))
            return dataclasses.replace(wheel, note="; ".join(x for x in (wheel.note, build) if x))
        where = choice.image if choice.image else choice.binary
        return LaneInstall(self.lane, True, f"llama-server at {where}", note=build)

    def start_refusal(self, settings: Settings, hardware: Hardware | None) -> str | None:
        install = self.install_on(settings, hardware)
        return None if install.installed else install.note

    def build(
        self,
        entry: ModelEntry,
        settings: Settings,
        *,
        ppid: int,
        free_port: int,
        hardware: Hardware | None,
        used: Mapping[str, int] | None,
    ) -> LaunchPlan:
        choice = choose_runtime(settings, hardware)
        return plan_for(choice, entry, settings, ppid=ppid, free_port=free_port, hardware=hardware, used=used)
