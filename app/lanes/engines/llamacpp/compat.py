"""The capability lane: a second llama.cpp build for the GGUF architectures the default build does not load.

llama.cpp learns new architectures every few weeks, and the build the llama.cpp lane runs (the pinned
xllamacpp, a pinned release, or a binary on PATH) lags: a GGUF of a newer architecture fails there with
"unknown model architecture". A second build can be registered as the lane `llama.cpp-compat`:

- `switchyard engine register llama.cpp-compat --python PY`: an interpreter whose xllamacpp is another
  version (a newer wheel, or one built from a fork), run with our worker as the default lane runs it;
- `switchyard engine register llama.cpp-compat --llama-server PATH`: a `llama-server` binary of any
  revision or fork, run as the `path` runtime runs one;
- `switchyard engine install llama.cpp-compat --version V`: xllamacpp V from PyPI in an environment of its
  own, used when nothing is registered (without `--version`, the manifest's, which is the llama.cpp lane's
  own: useful only while that lane runs an older pin or a binary).

At registration both builds are asked which architectures they load (engines/llamacpp/arch_probe.py). Routing
then sends a GGUF whose architecture the default build refuses to the capability lane when it loads it
(`decide` names both: the default turned down for `architecture`, the capability build chosen), and leaves
every other GGUF where it was. When no second build is registered nothing is probed and nothing changes.
The lane speaks llama-server's API, so it plans memory, banks sessions and reports timings as the llama.cpp
lane does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from app.core import statefile
from app.core.errors import EngineUnavailableError, SettingsError
from app.core.paths import Paths
from app.core.settings import Settings
from app.hardware.build_choice import ONE_BUILD
from app.hardware.model import Hardware
from app.lanes.engines.kind import EnginePython, OwnBuild
from app.lanes.engines.llamacpp.arch_probe import ArchCache, Build, known_names
from app.lanes.engines.llamacpp.kind import LlamaCppKind, binary_plan, build_plan
from app.lanes.engines.plan import LaunchPlan, StartContext
from app.lanes.install.store import EngineStore
from app.library.model import ModelEntry
from app.routing.engines import title
from app.routing.model import LaneInstall

log = logging.getLogger("switchyard.compat")
LLAMA_CPP_COMPAT = "llama.cpp-compat"  # its row in app/lanes/engines/facts.py
REGISTERED = "registered.json"
ARCHS = "archs.json"
NOT_REGISTERED = (
    "no second llama.cpp build is registered: `switchyard engine register llama.cpp-compat --python PY` "
    "(an interpreter with another xllamacpp) or `--llama-server PATH` (a llama-server of another "
    "revision or a fork), or `switchyard engine install llama.cpp-compat --version V` (another xllamacpp)"
)


def _folder(paths: Paths | None = None) -> Path:
    return (paths or Paths.from_env()).engines / LLAMA_CPP_COMPAT


def cache(paths: Paths | None = None) -> ArchCache:
    return ArchCache(_folder(paths) / ARCHS)


# ---- which build -------------------------------------------------------------------------------------
def registered(paths: Paths | None = None) -> Build | None:
    """The registered build (a binary or an interpreter), else the managed environment, else None."""
    text = statefile.read_text(_folder(paths) / REGISTERED)
    data: Any = None
    if text:
        try:
            data = json.loads(text)
        except ValueError:
            log.warning("%s is not valid JSON: no build counts as registered; register it again", REGISTERED)
    if isinstance(data, dict) and data.get("kind") in ("python", "llama-server") and data.get("path"):
        return Build(str(data["kind"]), str(data["path"]), data.get("version") or None)
    found = EngineStore.default().current(LLAMA_CPP_COMPAT)
    if found is not None:
        return Build("python", str(found.python), found.version)
    return None


def _xllamacpp_version(python: str) -> str:
    """xllamacpp's version in that interpreter, or SettingsError saying what is wrong with it."""
    code = "import importlib.metadata as m, xllamacpp; print(m.version('xllamacpp'))"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SettingsError(f"cannot run {python}: {exc}", param="python") from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SettingsError(
            f"{python} cannot import xllamacpp ({last}); give an interpreter of an environment where "
            "`pip install xllamacpp==VERSION` was run",
            param="python",
        )
    return done.stdout.strip()


def _check_binary(path: str) -> str:
    """The first line `llama-server --version` prints, or SettingsError."""
    p = Path(path).expanduser()
    if not p.is_file() or not os.access(p, os.X_OK):
        raise SettingsError(f"{path} is not an executable file; give the path of a llama-server binary")
    try:
        done = subprocess.run([str(p), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SettingsError(f"cannot run {path} --version: {exc}") from exc
    lines = (done.stdout + done.stderr).strip().splitlines()
    version = next((ln for ln in lines if "version" in ln.lower()), lines[0] if lines else "")
    return version.strip()


def register(
    *, python: str | None = None, llama_server: str | None = None, paths: Paths | None = None
) -> Build:
    """Record the second build (exactly one of an interpreter or a binary), checked first."""
    if (python is None) == (llama_server is None):
        raise SettingsError(
            "give one of --python (an interpreter with xllamacpp) or --llama-server (a binary)"
        )
    if python is not None:
        exe = str(Path(python).expanduser().absolute())
        build = Build("python", exe, _xllamacpp_version(exe))
    else:
        exe = str(Path(llama_server or "").expanduser().absolute())
        build = Build("llama-server", exe, _check_binary(exe) or None)
    doc = {"kind": build.kind, "path": build.path, "version": build.version}
    statefile.update(_folder(paths) / REGISTERED, lambda _old: doc)
    return build


def unregister(paths: Paths | None = None) -> bool:
    """Forget the registered build; True when there was one (a managed install stays)."""
    path = _folder(paths) / REGISTERED
    if statefile.read_text(path) is None:
        return False
    statefile.update(path, lambda _old: statefile.DELETE)
    return True


def default_build(settings: Settings, hardware: Hardware | None = None) -> Build | None:
    """The build the llama.cpp lane would run, as a probe can ask it; None for a container (not probed)."""
    from app.lanes.engines.llamacpp.kind import xllamacpp
    from app.lanes.engines.llamacpp.runtime import runtime_choice

    choice = runtime_choice(settings, hardware)
    if choice.runtime == "xllamacpp":
        engine = xllamacpp()
        return Build("python", engine.python, engine.version) if engine else None
    if choice.runtime in ("bin", "path") and choice.binary:
        return Build("llama-server", choice.binary)
    return None


# ---- what each loads ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Survey:
    """Both builds' answers for some names: {name: loads}, empty where a build was not asked."""

    default: Mapping[str, bool]
    compat: Mapping[str, bool]

    def only_compat(self) -> list[str]:
        return sorted(n for n, ok in self.compat.items() if ok and self.default.get(n) is False)


def survey(settings: Settings, names: Iterable[str], *, hardware: Hardware | None = None) -> Survey:
    """Ask both builds about `names` (each name once per build; answers kept in archs.json)."""
    compat = registered()
    if compat is None:
        return Survey({}, {})
    names = list(names)
    store = cache()
    base = default_build(settings, hardware)
    return Survey(store.ensure(base, names) if base else {}, store.ensure(compat, names))


def survey_all(settings: Settings, library_archs: Iterable[str] = ()) -> Survey:
    """Registration's survey: every known name and the library's own."""
    return survey(settings, [*known_names(), *library_archs])


def gguf_architecture(entry: ModelEntry) -> str | None:
    """`general.architecture` of a GGUF entry, as the catalog read it."""
    if entry.format != "gguf":
        return None
    from app.routing.traits import traits_of

    arch = traits_of(entry.model_format()).architecture
    return str(arch) if arch else None


def default_refuses(entry: ModelEntry, settings: Settings, hardware: Hardware | None) -> str | None:
    """Why the default build will not load `entry` (asked only while a second build is registered)."""
    arch = gguf_architecture(entry)
    if arch is None or registered() is None:
        return None
    base = default_build(settings, hardware)
    if base is None:
        return None
    if cache().ensure(base, [arch]).get(arch) is False:
        return f"{base.describe()} does not load the {arch} architecture"
    return None


# ---- the lane kind -----------------------------------------------------------------------------------
class LlamaCompatKind(LlamaCppKind):
    """llama.cpp on the registered second build: GGUF models whose architecture the default refuses."""

    lane = LLAMA_CPP_COMPAT
    setting_keys: tuple[str, ...] = ()  # its build is the registered one: `runtime` does not choose it
    build_rule = ONE_BUILD  # the build the user brought is the only one

    def install(self, settings: Settings) -> LaneInstall:
        build = registered()
        if build is None:
            return LaneInstall(self.lane, False, None, note=NOT_REGISTERED)
        answers = cache().answers(build)
        refused = frozenset(n for n, ok in answers.items() if not ok)
        loads = sum(1 for ok in answers.values() if ok)
        note = (
            f"a capability build; loads {loads} architecture(s) probed" if answers else "a capability build"
        )
        return LaneInstall(self.lane, True, build.describe(), rejected_architectures=refused, note=note)

    def start_refusal(self, settings: Settings, hardware: Hardware | None) -> str | None:
        return None if registered() is not None else NOT_REGISTERED

    def own_build(self, settings: Settings, hardware: Hardware | None) -> OwnBuild:
        """A build the user brought: what it was built for is its own (kind.KnowsOwnBuild)."""
        return OwnBuild(build=None, why="the registered build's own (Switchyard cannot tell)")

    def registered_engine(self) -> tuple[str | None, str] | None:
        """Never the app's interpreter: only a registration, else its own env (kind.FoundByRegistration)."""
        build = registered()
        return (build.version, build.path) if build is not None else None

    def architecture_refusal(
        self, entry: ModelEntry, settings: Settings, hardware: Hardware | None
    ) -> str | None:
        build = registered()
        arch = gguf_architecture(entry)
        if build is None or arch is None:
            return None
        if cache().ensure(build, [arch]).get(arch) is False:
            return f"{title(self.lane)} ({build.describe()}) does not load the {arch} architecture either"
        return None

    def build(self, entry: ModelEntry, settings: Settings, start: StartContext) -> LaunchPlan:
        build = registered()
        if build is None:
            raise EngineUnavailableError(NOT_REGISTERED)
        note = f"{title(self.lane)}: {build.describe()}"
        if build.kind == "python":
            venv = Path(build.path).parent.parent
            engine = EnginePython(build.path, build.version, "managed", venv)
            own = settings.replace(runtime="xllamacpp")
            plan = build_plan(entry, own, start, engine=engine)
            return dataclasses.replace(plan, engine=self.lane, notes=(*plan.notes, note))
        plan = binary_plan(entry, settings, build.path, start)
        return dataclasses.replace(plan, engine=self.lane, runtime="llama-server", notes=(*plan.notes, note))
