"""llama.cpp on the runtime that matches this machine: a container, a pinned release, PATH, or the wheel.

The same engine kind as `LlamaCppKind` (same lane id, formats and memory plan); only the runtime choice
differs: `lanes.install.runtimes` picks one in order, and the command line is built for it. `bin` and `path`
run `llama-server` under the guard; `docker` and `podman` run the upstream image through
`app.lanes.install.containers` under the guard; `xllamacpp` is our worker, as before.
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
from app.lanes.engines.kind import OwnBuild
from app.lanes.engines.llamacpp import across
from app.lanes.engines.llamacpp.kind import LlamaCppKind, binary_plan, build_plan, llama_server_argv
from app.lanes.engines.llamacpp.runtime import runtime_choice
from app.lanes.engines.plan import LaunchPlan, StartContext
from app.lanes.install import containers
from app.lanes.install.runtimes import RuntimeChoice, choose_runtime
from app.lanes.residency import Footprint
from app.lanes.workers.params import LlamaParams
from app.library.model import ModelEntry
from app.routing.engines import build_title
from app.routing.model import LaneInstall

log = logging.getLogger("switchyard.llamaserver")
MODELS_MOUNT = "/models"
PROJECTOR_MOUNT = "/mmproj"


def _mounted_file(path: Path) -> tuple[Path, PurePosixPath]:
    """The host folder a container needs for the model file at `path`, and the file's path inside it.
    A file in a Hugging Face snapshot (from a subfolder too) links into the repository's blobs/, and a
    link elsewhere may point out of its folder: `containers.model_mount` finds the folder that holds the
    links and their targets, or refuses links that reach too far. A plain file needs only its own folder,
    which is not walked (it may be a large shared one)."""
    snapshot = next(
        (
            f
            for f in path.parents
            if f.parent.name == "snapshots" and f.parent.parent.name.startswith("models--")
        ),
        None,
    )
    folder = snapshot or (path.parent if path.is_symlink() else None)
    if folder is None:
        return path.parent, PurePosixPath(path.name)
    mount, inside = containers.model_mount(folder)
    where = PurePosixPath(inside).relative_to(mount.container)
    return Path(mount.host), where.joinpath(*path.relative_to(folder).parts)


def _in_container(params: LlamaParams) -> tuple[LlamaParams, tuple[containers.Mount, ...]]:
    """The params as the container sees them: the model's folder (`_mounted_file`) read-only under
    /models; the projector's under /mmproj, a draft model's and LoRA adapters' under /extra-N, each under a
    mount already made when it is the same folder."""
    host, where = _mounted_file(Path(params.model_path))
    mounts = [containers.Mount(str(host), MODELS_MOUNT)]

    def place(path: str, root: str) -> str:
        file_host, file_where = _mounted_file(Path(path))
        mount = next((m for m in mounts if m.host == str(file_host)), None)
        if mount is None:
            mount = containers.Mount(str(file_host), root)
            mounts.append(mount)
        return str(PurePosixPath(mount.container, file_where))

    inside = dataclasses.replace(
        params,
        model_path=str(PurePosixPath(MODELS_MOUNT, where)),
        slot_save_path="",  # the bank's folder stays on the host: no slot files from a container
    )
    if params.mmproj_path:
        inside = dataclasses.replace(inside, mmproj_path=place(params.mmproj_path, PROJECTOR_MOUNT))
    if params.draft_path:
        inside = dataclasses.replace(inside, draft_path=place(params.draft_path, "/extra-draft"))
    if params.lora_paths:
        loras = tuple(place(p, f"/extra-lora-{i}") for i, p in enumerate(params.lora_paths))
        inside = dataclasses.replace(inside, lora_paths=loras)
    return inside, tuple(mounts)


def _engine_args(params: LlamaParams) -> tuple[str, ...]:
    """llama-server's own arguments for the container: listening on all of the container's interfaces
    (the host publishes the port on loopback only)."""
    argv = list(llama_server_argv("llama-server", params, port=containers.CONTAINER_PORT, ppid=0))
    args = argv[argv.index("--") + 2 :]
    args[args.index("--host") + 1] = "0.0.0.0"
    return tuple(args)


def _container_plan(
    entry: ModelEntry, settings: Settings, choice: RuntimeChoice, at: StartContext
) -> LaunchPlan:
    if choice.runtime is None or choice.image is None or choice.build is None:
        raise EngineUnavailableError(f"runtime {choice.runtime}: no container image chosen ({choice.why})")
    # the plan of a binary start (memory, params), then the same params run in the image
    base = binary_plan(entry, settings, sys.executable, at)
    ppid, free_port = at.ppid, at.port
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
        env_names=containers.forwarded_env(base.env, extra=settings.engines.engine_env.get("llama.cpp")),
        args=_engine_args(inside),
        owner_pid=ppid,
    )
    wrapper = (*module_argv("app.lanes.install.containers"), choice.runtime, run.name, "--")
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


def plan_for(choice: RuntimeChoice, entry: ModelEntry, settings: Settings, at: StartContext) -> LaunchPlan:
    """The launch plan for `entry` on the runtime `choice` names."""
    if choice.runtime is None:
        raise EngineUnavailableError(choice.refusal())
    if choice.runtime == "xllamacpp":
        plan = build_plan(entry, settings.replace(runtime="xllamacpp"), at)
    elif choice.runtime in ("bin", "path"):
        if choice.binary is None:
            raise EngineUnavailableError(f"runtime {choice.runtime}: no llama-server binary ({choice.why})")
        plan = binary_plan(entry, settings, choice.binary, at)
    else:
        plan = _container_plan(entry, settings, choice, at)
    note = f"runtime {choice.runtime}, {build_title(choice.build)}: {choice.why}"
    skipped = tuple(f"runtime {s.runtime} skipped: {s.skipped}" for s in choice.steps if s.skipped)
    # a binary from PATH keeps the runtime's older name, which logs and the admin API have shown
    runtime = "llama-server" if choice.runtime == "path" else choice.runtime
    return dataclasses.replace(plan, runtime=runtime, notes=(*plan.notes, *skipped, note))


def _refused_here(settings: Settings, hardware: Hardware | None) -> frozenset[str]:
    """The architectures this build was asked about and refused (only while a capability build is
    registered: otherwise nothing is asked)."""
    from app.lanes.engines.llamacpp import compat

    if compat.registered() is None:
        return frozenset()
    base = compat.default_build(settings, hardware)
    answers = compat.cache().answers(base) if base is not None else {}
    return frozenset(n for n, ok in answers.items() if not ok)


class LlamaRuntimesKind(LlamaCppKind):
    """LlamaCppKind whose runtime is chosen by `lanes.install.runtimes` (docker, podman, bin, path, wheel)."""

    def install(self, settings: Settings) -> LaneInstall:
        return self.install_on(settings, None)

    def install_on(self, settings: Settings, hardware: Hardware | None) -> LaneInstall:
        choice = runtime_choice(settings, hardware)
        if choice.runtime is None:
            return LaneInstall(self.lane, False, None, note=choice.refusal())
        build = f"runtime {choice.runtime}, {build_title(choice.build)}: {choice.why}"
        refused = _refused_here(settings, hardware)
        if choice.runtime == "xllamacpp":
            wheel = super().install(settings.replace(runtime="xllamacpp"))
            note = "; ".join(x for x in (wheel.note, build) if x)
            return dataclasses.replace(wheel, note=note, rejected_architectures=refused)
        where = choice.image if choice.image else choice.binary
        return LaneInstall(
            self.lane, True, f"llama-server at {where}", note=build, rejected_architectures=refused
        )

    def architecture_refusal(
        self, entry: ModelEntry, settings: Settings, hardware: Hardware | None
    ) -> str | None:
        """Why this build will not load `entry`'s architecture; asked only while a capability build is
        registered (app/lanes/engines/llamacpp/compat.py), else the engine is left to try."""
        from app.lanes.engines.llamacpp.compat import default_refuses

        return default_refuses(entry, settings, hardware)

    def own_build(self, settings: Settings, hardware: Hardware | None) -> OwnBuild:
        """The build the runtime chosen for this machine runs (kind.KnowsOwnBuild), asked afresh."""
        choice = choose_runtime(settings, hardware)
        return OwnBuild(build=choice.build, why=choice.why, runtime=choice.runtime)

    def start_refusal(self, settings: Settings, hardware: Hardware | None) -> str | None:
        install = self.install_on(settings, hardware)
        return None if install.installed else install.note

    def predict(
        self, entry: ModelEntry, settings: Settings, *, hardware: Hardware, used: Mapping[str, int] | None
    ) -> Footprint | None:
        """A split model needs only its head's share here (its last plan's), else the local plan's."""
        if across.split_of(settings, entry.id):
            launcher = across.registered()
            need = launcher.head_need(entry.id) if launcher is not None else None
            return Footprint({"CPU": need}, "predicted") if need is not None else None
        return super().predict(entry, settings, hardware=hardware, used=used)

    def build(self, entry: ModelEntry, settings: Settings, start: StartContext) -> LaunchPlan:
        names = across.split_of(settings, entry.id)
        if names:  # split across peers: started by the running server's split broker
            launcher = across.registered()
            if launcher is None:
                raise EngineUnavailableError(
                    f"model {entry.id!r} is split across peers {', '.join(names)}, which only a running "
                    "server with peers (`switchyard serve --tls`) can start"
                )
            return launcher.launch_plan(entry, settings, start, names)
        return plan_for(runtime_choice(settings, start.hardware), entry, settings, start)
