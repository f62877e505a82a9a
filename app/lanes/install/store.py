"""Engines in environments of their own: the checked-in manifest of versions, and what is installed.

Layout under the data dir (`SWITCHYARD_HOME/engines`):

    engines/<lane>/<version>/          a virtual environment holding that version of the engine
    engines/<lane>/<version>-<build>/  the same, for an engine with several builds (mistral.rs, MLX)
    engines/<lane>/state.json          {"current", "previous", "pinned"}, written atomically
    engines/<lane>/.lock               held while one process changes that lane's engine

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import EngineStateError, UnknownEngineError
from app.core.names import check_named
from app.core.paths import Paths
from app.core.public import Public
from app.hardware.build_choice import BUILDS

MANIFEST = Path(__file__).with_name("engines.toml")
# PEP 440 public and local versions, as a folder name: no separators, nothing that climbs out of a folder
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.!+_-]{0,63}$")


@dataclass(frozen=True)
class BuildSpec:
    """One build of an engine (a `builds` entry): the distribution that carries it, or the companions."""

    build: str  # one of app.hardware.build_choice.BUILDS
    dist: str  # the distribution whose version is the engine's version in this build
    version: str | None = None  # its pinned version where it differs from the engine's (a lagging wheel)
    also: tuple[str, ...] | None = None  # None: the engine's own `also`


@dataclass(frozen=True)
class EngineSpec:
    """One manifest entry (app/lanes/install/engines.toml)."""

    lane: str
    dist: str
    module: str
    version: str
    also: tuple[str, ...] = ()
    worker: tuple[str, ...] = ()
    verify_import: bool = True
    builds: dict[str, BuildSpec] = field(default_factory=dict)  # empty: one package for every machine

    def requirements(self, version: str, build: str | None = None) -> list[str]:
        """What pip installs for `version` of `build` (None: the engine's one build): companions keep
        their pins only at the manifest's version of that build."""
        b = self.builds.get(build) if build else None
        also = self.also if b is None or b.also is None else b.also
        if version != self.default_version(build):
            also = tuple(_unpinned(r) for r in also)
        return [f"{self.dist_for(build)}=={version}", *also, *self.worker]

    def dist_for(self, build: str | None) -> str:
        b = self.builds.get(build) if build else None
        return b.dist if b is not None else self.dist

    def default_version(self, build: str | None) -> str:
        """The manifest's version for `build`: the build's own pin where its wheel lags, else the engine's."""
        b = self.builds.get(build) if build else None
        return b.version if b is not None and b.version else self.version

    def check_build(self, build: str) -> str:
        """`build` when this engine has a package for it; else EngineStateError listing the valid ones."""
        if not self.builds:
            several = ", ".join(lane for lane, s in load_manifest().items() if s.builds)
            raise EngineStateError(
                f"{self.lane} has one build ({self.dist}, the same for every machine); leave out --build "
                f"(it applies to {several})",
                param="build",
            )
        if build not in self.builds:
            what = "no package for that build" if build in BUILDS else "no such build"
            raise EngineStateError(
                f"{build!r} is not a build of {self.lane} ({what}); its builds are {', '.join(self.builds)}",
                param="build",
            )
        return build


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
            builds=_builds(lane, str(e["dist"]), e.get("builds", {})),
        )
    return out


def _builds(lane: str, dist: str, raw: dict[str, Any]) -> dict[str, BuildSpec]:
    """A `builds` table: build -> "dist", or {dist?, version?, also?} (dist defaults to the engine's)."""
    out: dict[str, BuildSpec] = {}
    for build, entry in raw.items():
        if build not in BUILDS:
            raise ValueError(f"engines.toml: {lane} names build {build!r}; builds are {', '.join(BUILDS)}")
        e = {"dist": entry} if isinstance(entry, str) else dict(entry)
        also = e.get("also")
        out[build] = BuildSpec(
            build=build,
            dist=str(e.get("dist") or dist),
            version=check_version(str(e["version"])) if e.get("version") else None,
            also=tuple(also) if also is not None else None,
        )
    if out and "cpu" not in out:  # the build a machine without a usable GPU falls back to
        raise ValueError(f"engines.toml: {lane} has builds but no cpu build")
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
    return check_named(
        version,
        fits=_VERSION.match(version) is not None and ".." not in version,
        refusal=f"{version!r} is not a version number; give one as PyPI lists it, e.g. 1.8.0",
        error=EngineStateError,
        param="version",
    )


@dataclass(frozen=True)
class InstalledVersion:
    version: str
    dir: str  # the folder's name under engines/<lane>/
    installed_at: float
    requirements: tuple[str, ...] = ()
    python: str = ""  # the interpreter's version inside the environment, e.g. "3.11.7"
    # the build installed (a key of the engine's `builds`); None: the engine has one build, or it was
    # installed before Switchyard recorded builds
    build: str | None = None

    @classmethod
    def from_json(cls, raw: Any) -> InstalledVersion | None:
        if raw is None:
            return None
        if not isinstance(raw, dict) or not isinstance(raw.get("version"), str):
            raise ValueError("an installed version must be an object with 'version'")
        folder = str(raw.get("dir") or raw["version"])
        if Path(folder).name != folder or folder in (".", ".."):
            raise ValueError(f"'dir' must be a plain folder name, got {folder!r}")
        build = raw.get("build")
        if build is not None and build not in BUILDS:
            raise ValueError(f"'build' must be one of {', '.join(BUILDS)} or null, got {build!r}")
        return cls(
            version=raw["version"],
            dir=folder,
            installed_at=float(raw.get("installed_at", 0)),
            requirements=tuple(raw.get("requirements", ())),
            python=str(raw.get("python", "")),
            build=build,
        )


@dataclass(frozen=True)
class EngineState(Public):
    current: InstalledVersion | None = None
    previous: InstalledVersion | None = None
    pinned: str | None = None  # the user's pin; None: the manifest's version


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
