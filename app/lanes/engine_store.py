"""Engines in environments of their own: the checked-in manifest of versions, and what is installed.

Layout under the data dir (`SWITCHYARD_HOME/engines`):

    engines/<lane>/<version>/   a virtual environment holding that version of the engine
    engines/<lane>/state.json   {"current", "previous", "pinned"}, written atomically
    engines/<lane>/.lock        held while one process changes that lane's engine

A version folder counts only once `state.json` records it: an install that failed or was cut off leaves a
folder nobody runs, and the next install or removal deletes it. Reading never changes anything.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
import tempfile
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import EngineStateError, UnknownEngineError
from app.core.paths import Paths

MANIFEST = Path(__file__).with_name("engines.toml")
# PEP 440 public and local versions, as a folder name: no separators, nothing that climbs out of a folder
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.!+_-]{0,63}$")


@dataclass(frozen=True)
class EngineSpec:
    """One manifest entry (app/lanes/engines.toml)."""

    lane: str
    dist: str
    module: str
    version: str
    also: tuple[str, ...] = ()
    worker: tuple[str, ...] = ()
    verify_import: bool = True

    def requirements(self, version: str) -> list[str]:
        """What pip installs for `version`: companions keep their pins only at the manifest's version."""
        also = self.also if version == self.version else tuple(_unpinned(r) for r in self.also)
        return [f"{self.dist}=={version}", *also, *self.worker]


def _unpinned(requirement: str) -> str:
    name, sep, marker = requirement.partition(";")
    bare = re.split(r"[=<>!~ ]", name.strip(), maxsplit=1)[0]
    return f"{bare}; {marker.strip()}" if sep else bare


@functools.lru_cache(maxsize=4)
def load_manifest(path: Path = MANIFEST) -> dict[str, EngineSpec]:
    """The manifest, by lane id. It ships with the code, so a broken one is a bug: it raises."""
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    out: dict[str, EngineSpec] = {}
    for lane, e in raw["engines"].items():
        out[lane] = EngineSpec(
            lane=lane,
            dist=str(e["dist"]),
            module=str(e["module"]),
            version=check_version(str(e["version"])),
            also=tuple(e.get("also", ())),
            worker=tuple(e.get("worker", ())),
            verify_import=bool(e.get("verify_import", True)),
        )
    return out


def spec_for(lane: str) -> EngineSpec:
    spec = load_manifest().get(lane)
    if spec is None:
        known = ", ".join(load_manifest())
        raise UnknownEngineError(
            f"{lane!r} is not an engine Switchyard installs; the engines are {known} "
            "(binaries such as llama-server or sd-server are used from PATH as they are)",
            param="kind",
        )
    return spec


def check_version(version: str) -> str:
    if not _VERSION.match(version) or ".." in version:
        raise EngineStateError(
            f"{version!r} is not a version number; give one as PyPI lists it, e.g. 1.8.0", param="version"
        )
    return version


@dataclass(frozen=True)
class InstalledVersion:
    version: str
    dir: str  # the folder's name under engines/<lane>/
    installed_at: float
    requirements: tuple[str, ...] = ()
    python: str = ""  # the interpreter's version inside the environment, e.g. "3.11.7"

    @classmethod
    def from_json(cls, raw: Any) -> InstalledVersion | None:
        if raw is None:
            return None
        if not isinstance(raw, dict) or not isinstance(raw.get("version"), str):
            raise ValueError("an installed version must be an object with 'version'")
        folder = str(raw.get("dir") or raw["version"])
        if Path(folder).name != folder or folder in (".", ".."):
            raise ValueError(f"'dir' must be a plain folder name, got {folder!r}")
        return cls(
            version=raw["version"],
            dir=folder,
            installed_at=float(raw.get("installed_at", 0)),
            requirements=tuple(raw.get("requirements", ())),
            python=str(raw.get("python", "")),
        )


@dataclass(frozen=True)
class EngineState:
    current: InstalledVersion | None = None
    previous: InstalledVersion | None = None
    pinned: str | None = None  # the user's pin; None: the manifest's version

    def public(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ManagedEngine:
    """An installed version, ready to run: its environment and interpreter."""

    lane: str
    version: str
    venv: Path
    python: Path


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


@dataclass(frozen=True)
class EngineStore:
    root: Path  # SWITCHYARD_HOME/engines
    _lanes: frozenset[str] = field(default_factory=lambda: frozenset(load_manifest()))

    @classmethod
    def default(cls) -> EngineStore:
        """The data dir of this process (SWITCHYARD_HOME or the platform's), as every command uses."""
        return cls(Paths.from_env().engines)

    def lane_dir(self, lane: str) -> Path:
        spec_for(lane)  # only manifest lanes name a folder: an id from a request never builds a path
        return self.root / lane

    def state_file(self, lane: str) -> Path:
        return self.lane_dir(lane) / "state.json"

    def read(self, lane: str) -> EngineState:
        """The lane's state; EngineStateError (saying to fix or remove it) when the file is malformed."""
        path = self.state_file(lane)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return EngineState()
        except (OSError, ValueError) as exc:
            raise _bad_state(path, exc) from exc
        try:
            if not isinstance(raw, dict):
                raise ValueError("it must hold a JSON object")
            pinned = raw.get("pinned")
            return EngineState(
                current=InstalledVersion.from_json(raw.get("current")),
                previous=InstalledVersion.from_json(raw.get("previous")),
                pinned=check_version(pinned) if isinstance(pinned, str) else None,
            )
        except (TypeError, ValueError, EngineStateError) as exc:
            raise _bad_state(path, exc) from exc

    def write(self, lane: str, state: EngineState) -> None:
        """Atomically: a reader sees the old state or the new one, never half of either."""
        path = self.state_file(lane)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".state-", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(state.public(), fh, indent=2)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def venv(self, lane: str, installed: InstalledVersion) -> Path:
        return self.lane_dir(lane) / installed.dir

    def current(self, lane: str) -> ManagedEngine | None:
        """The version lanes start, if one is installed and its interpreter is still there."""
        if lane not in self._lanes:
            return None
        try:
            cur = self.read(lane).current
        except EngineStateError:
            return None  # reported by `engine ls`; a lane falls back to the app's own interpreter
        if cur is None:
            return None
        venv = self.venv(lane, cur)
        python = venv_python(venv)
        return ManagedEngine(lane, cur.version, venv, python) if python.exists() else None


def _bad_state(path: Path, exc: Exception) -> EngineStateError:
    return EngineStateError(
        f"{path} cannot be read ({exc}); fix it, or remove that engine with `switchyard engine remove "
        f"{path.parent.name}` and install it again"
    )
