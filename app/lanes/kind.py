"""The engine-kind interface: what the Lane and the Supervisor need to know to run any engine.

One object per kind (llama.cpp, piper, whisper.cpp, vLLM, ...) says how its engine is found and at which
version, whether it can start on this machine, what a model on it can do, and how to build the command
that starts it. Kinds hold no state; the Lane owns the process, the Supervisor the policy.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from app.core.frozen import module_argv
from app.core.settings import Settings
from app.hardware.model import Hardware
from app.lanes.engine_store import EngineStore
from app.lanes.engine_venv import venv_env, worker_source
from app.lanes.plan import LaunchPlan
from app.library.model import ModelEntry
from app.routing.model import LaneInstall


class EngineKind(Protocol):
    @property
    def lane(self) -> str:
        """The routing lane id (app/routing/engines.py)."""
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
        """How its memory is known: app.lanes.plan.MEMORY_KINDS."""
        ...

    def install(self, settings: Settings) -> LaneInstall:
        """Is the engine here, at which version, found where."""
        ...

    def start_refusal(self, settings: Settings, hardware: Hardware | None) -> str | None:
        """Why it cannot start on this machine (installed or not), or None."""
        ...

    def capabilities(self, entry: ModelEntry, settings: Settings | None = None) -> frozenset[str]:
        """What this model on this lane can be asked to do (app.lanes.plan.CAPABILITIES); with `settings`,
        what its per-model overrides change (a llama.cpp model's `mmproj`: vision on or off)."""
        ...

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
        """The command for this model; raises a SwitchyardError saying what to do when it cannot start."""
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
