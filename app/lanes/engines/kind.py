"""The engine-kind interface: what the Lane and the Supervisor need to know to run any engine.

One object per kind (llama.cpp, piper, whisper.cpp, vLLM, ...) says what it is (the API it speaks, the
settings it reads, what it drafts with, how its memory is known and predicted), how its engine is found
and at which version, whether it can start on this machine, what a model on it can do, and how to build
the command that starts it. Kinds hold no state; the Lane owns the process, the Supervisor the policy.
Every kind is registered in app/lanes/engines/registry.py (its docstring is the contract).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from app.core.frozen import module_argv
from app.core.settings import Settings
from app.hardware.build_choice import BuildRule
from app.hardware.model import Hardware
from app.lanes.engines.plan import ApiStyle, DraftKind, LaunchPlan, StartContext
from app.lanes.install.store import EngineStore
from app.lanes.install.venv import venv_env, worker_source
from app.lanes.residency import Footprint
from app.library.model import ModelEntry
from app.routing.model import LaneInstall


class EngineKind(Protocol):
    @property
    def lane(self) -> str:
        """The lane id: its row in app/lanes/engines/facts.py (title, routes, what machine it needs)."""
        ...

    @property
    def formats(self) -> frozenset[str]:
        """The ModelKind values of the models it runs."""
        ...

    @property
    def offers(self) -> frozenset[str]:
        """Everything it can do for some model (what a model can do: `capabilities`)."""
        ...

    @property
    def memory(self) -> str:
        """How its memory is known: app.lanes.engines.plan.MEMORY_KINDS."""
        ...

    @property
    def api_style(self) -> ApiStyle:
        """The HTTP API its engine speaks (llama-server's, or OpenAI's routes only)."""
        ...

    @property
    def setting_keys(self) -> tuple[str, ...]:
        """The settings keys only this kind reads at a start, all from its own area of Settings
        (app/core/settings/kinds.py): a change restarts its lanes (core/settings_live.py `lane_inputs`)."""
        ...

    @property
    def draft(self) -> DraftKind:
        """What it drafts speculative tokens with: what a start pairs with the model (registry.paired)."""
        ...

    @property
    def build_rule(self) -> BuildRule:
        """Which builds its package comes in (app/hardware/build_choice.py chooses one for the machine)."""
        ...

    @property
    def install_estimate_s(self) -> int:
        """About how long an automatic install takes (download and unpack), for the first use's 503."""
        ...

    def predict(
        self, entry: ModelEntry, settings: Settings, *, hardware: Hardware, used: Mapping[str, int] | None
    ) -> Footprint | None:
        """What a start of `entry` will take per device before it is measured, or None where only the
        measured footprint is real (engines that size their caches as they go)."""
        ...

    def window(self, plan: LaunchPlan | None, entry: Callable[[], ModelEntry | None]) -> int | None:
        """The context a lane of this kind reports: its plan's (llama.cpp), else what the model says
        (MLX: the trained window, `entry` read only then); None where it is not known."""
        ...

    def install(self, settings: Settings) -> LaneInstall:
        """Is the engine here, at which version, found where."""
        ...

    def start_refusal(self, settings: Settings, hardware: Hardware | None) -> str | None:
        """Why it cannot start on this machine (installed or not), or None."""
        ...

    def capabilities(self, entry: ModelEntry, settings: Settings | None = None) -> frozenset[str]:
        """What this model on this lane can be asked to do (lanes.engines.plan.CAPABILITIES); with `settings`,
        what its per-model overrides change (a llama.cpp model's `mmproj`: vision on or off)."""
        ...

    def build(self, entry: ModelEntry, settings: Settings, start: StartContext) -> LaunchPlan:
        """The command for this model; raises a SwitchyardError saying what to do when it cannot start."""
        ...


@dataclass(frozen=True, kw_only=True)
class OwnBuild:
    """The build a kind's engine runs as the kind itself knows it (llama.cpp: its runtime choice; a build
    the user registered: unknown), for the engine list: `build` (cpu, cuda12, ...; None: unknown), why,
    and the runtime that runs it (None: the engine list's own finding)."""

    build: str | None
    why: str
    runtime: str | None = None


@runtime_checkable
class KnowsOwnBuild(Protocol):
    """A kind whose build is its own choice or the user's, never the manifest's build for this machine's
    probe (app/lanes/install/listing.py asks it instead of choosing one)."""

    def own_build(self, settings: Settings, hardware: Hardware | None) -> OwnBuild: ...


@runtime_checkable
class FoundByRegistration(Protocol):
    """A kind found only as a build the user registered or in its own environment, never on the app's
    interpreter (llama.cpp's capability lane): where the engine list looks for it."""

    def registered_engine(self) -> tuple[str | None, str] | None:
        """The registered build's (version, path), or None while none is registered."""
        ...


# Versions found in this interpreter: reading one parses the package's whole METADATA (milliseconds), and
# every lane start asks several times. Only found versions are kept, so a package installed later is seen.
_VERSIONS: dict[str, str] = {}


def dist_version(dist: str) -> str | None:
    if dist in _VERSIONS:
        return _VERSIONS[dist]
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    _VERSIONS[dist] = version
    return version


@dataclass(frozen=True)
class EnginePython:
    """The interpreter a Python-packaged engine runs under, the engine's version there, and where it is."""

    python: str
    version: str | None
    where: str  # "managed": its own environment (`switchyard engine install`); "app": Switchyard's own
    venv: Path | None = None

    @property
    def managed(self) -> bool:
        return self.where == "managed"


def engine_python(lane: str, module: str, dist: str) -> EnginePython | None:
    """The engine's own environment when one is installed, else this interpreter if it imports the engine."""
    found = EngineStore.default().current(lane)
    if found is not None:
        return EnginePython(str(found.python), found.version, "managed", found.venv)
    if importlib.util.find_spec(module) is None:
        return None
    return EnginePython(sys.executable, dist_version(dist), "app")


def module_install(lane: str, module: str, dist: str, *, hint: str) -> LaneInstall:
    """A Python-packaged engine, in its own environment or importable by the server's interpreter."""
    found = engine_python(lane, module, dist)
    if found is None:
        return LaneInstall(lane, False, None, note=f"{dist} is not installed: {hint}")
    note = f"in its own environment, {found.venv}" if found.managed else ""
    return LaneInstall(lane, True, f"{dist} {found.version or '(version unknown)'}", note=note)


def find_binary(name: str, configured: str | None) -> str | None:
    """A configured path (must be an executable file) or `name` on PATH."""
    if configured:
        p = Path(configured).expanduser()
        return str(p) if p.is_file() and os.access(p, os.X_OK) else None
    return shutil.which(name)


def worker_argv(
    module: str, params_json: str, *, ppid: int, engine: EnginePython | None = None
) -> tuple[str, ...]:
    """Our own worker process for an engine that is a Python library (no HTTP server of its own): under the
    engine's own environment when it has one, else this interpreter (or the frozen bundle's program)."""
    head = (engine.python, "-m", module) if engine and engine.managed else module_argv(module)
    return (*head, "--ppid", str(ppid), "--params", params_json)


def engine_process_env(env: dict[str, str], engine: EnginePython | None, *, worker: bool) -> dict[str, str]:
    """`env` for a process of the engine's own environment: our worker code on the path if it is ours."""
    if engine is None or not engine.managed:
        return env
    return venv_env(env, pythonpath=worker_source(EngineStore.default().root) if worker else None)


def path_size(path: Path) -> int:
    """Bytes of a model file, or of every file in a model folder; 0 when it cannot be read."""
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    except OSError:
        return 0


def files_footprint(entry: ModelEntry) -> Footprint | None:
    """A model its engine maps whole (a voice, a speech model): its files' size, until one is measured."""
    size = sum(f.size for f in entry.files) or path_size(entry.path)
    return Footprint({"CPU": size}, "predicted") if size else None


def plan_window(plan: LaunchPlan | None) -> int | None:
    """The context a plan was made for (`ctx_size` of its params), None where it has none."""
    return getattr(plan.params, "ctx_size", None) if plan is not None else None
