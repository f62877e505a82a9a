"""One engine kind for every engine that is a Python package run from its own engine environment.

piper, whisper.cpp, MLX and mistral.rs differ only in data (the lane, the module that must import and the
distributions that provide it, the install hint, formats, capabilities, environment additions) and in the
params their worker gets. So each is a module-level instance of PythonEngineKind that holds the data, its
`Worker` naming the worker module and the function that builds its params (a subclass only where a kind
also refuses or offers differently: mistral.rs). Behaviour per state:

- not installed (no engine environment, and the module does not import here): `install` says what to run,
  `start_refusal` repeats it, `build` raises EngineUnavailableError with it;
- installed but the model cannot run on this lane (`model_refusal`): `build` raises with that reason;
- otherwise `build` returns the LaunchPlan of our worker (or, where `launch` is overridden, the engine's own
  server) under the engine's environment when it has one, else this interpreter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.hardware.build_choice import ONE_BUILD, BuildRule
from app.hardware.cpu import usable_cores
from app.hardware.model import Hardware
from app.lanes.engines.kind import (
    EnginePython,
    dist_version,
    engine_process_env,
    engine_python,
    files_footprint,
    module_install,
    plan_window,
    worker_argv,
)
from app.lanes.engines.plan import ApiStyle, DraftKind, LaunchPlan, StartContext
from app.lanes.proc import settings_env
from app.lanes.residency import Footprint
from app.lanes.workers.params import JsonParams
from app.library.model import ModelEntry
from app.routing.model import LaneInstall


@dataclass(frozen=True)
class Worker:
    """Our worker for a kind (app.lanes.workers.*) and how its params come from a model and the settings."""

    module: str
    params: Callable[[ModelEntry, Settings], JsonParams]


@dataclass(frozen=True, kw_only=True)
class PythonEngineKind:
    """An EngineKind (lanes/engines/kind.py) for an engine that is a Python module; its fields are data."""

    lane: str  # the lane id (its row in app/lanes/engines/facts.py)
    title: str  # how refusals name it: "cannot start 'x' on <title>"
    runtime: str  # LaunchPlan.runtime; the distribution that provides `module`, unless `dists` says others
    module: str  # what must import for the engine to count as installed
    # the distributions that provide `module` (the first one installed gives the version); empty: `runtime`
    dists: tuple[str, ...] = ()
    hint: str  # what to run when it is not installed
    formats: frozenset[str]
    offers: frozenset[str]
    memory: str  # app.lanes.engines.plan.MEMORY_KINDS
    worker: Worker | None = None  # our worker and its params; None where `launch` is overridden
    requires: tuple[tuple[str, str], ...] = ()  # (module, dist) that must import too
    env: tuple[tuple[str, str], ...] = ()  # added to the engine's environment
    threads_env: str | None = None  # a variable that gets the thread count (`threads`, else usable cores)
    api_style: ApiStyle = ApiStyle.OPENAI  # our workers and these engines' servers speak OpenAI's routes
    setting_keys: tuple[str, ...] = ()  # the Settings fields only this kind reads at a start
    draft: DraftKind = DraftKind.NONE
    install_estimate_s: int = 120  # about how long `switchyard engine install <lane>` takes
    build_rule: BuildRule = ONE_BUILD  # which builds its package comes in

    def dist(self) -> str:
        """The distribution that provides the module here (its version is the engine's)."""
        dists = self.dists or (self.runtime,)
        return next((d for d in dists if dist_version(d) is not None), dists[0])

    def install(self, settings: Settings) -> LaneInstall:
        found = module_install(self.lane, self.module, self.dist(), hint=self.hint)
        for module, dist in self.requires if found.installed else ():
            if not module_install(self.lane, module, dist, hint=self.hint).installed:
                note = f"{self.dist()} is here but {dist} is not: {self.hint}"
                return LaneInstall(self.lane, False, found.version, note=note)
        return found

    def start_refusal(self, settings: Settings, hardware: Hardware | None) -> str | None:
        install = self.install(settings)
        return None if install.installed else install.note

    def capabilities(self, entry: ModelEntry, settings: Settings | None = None) -> frozenset[str]:
        return self.offers

    def predict(
        self, entry: ModelEntry, settings: Settings, *, hardware: Hardware, used: Mapping[str, int] | None
    ) -> Footprint | None:
        """ "fixed" kinds map their model's files whole: their size; the others are known once measured."""
        return files_footprint(entry) if self.memory == "fixed" else None

    def window(self, plan: LaunchPlan | None, entry: Callable[[], ModelEntry | None]) -> int | None:
        return plan_window(plan)

    def model_refusal(self, entry: ModelEntry) -> str | None:
        """Why this installed lane cannot run `entry`, or None (the format check is routing's)."""
        return None

    def settings_refusal(
        self, entry: ModelEntry, settings: Settings, hardware: Hardware | None
    ) -> str | None:
        """Why the model's own settings cannot start on this kind, checked before anything loads; None."""
        return None

    def build(self, entry: ModelEntry, settings: Settings, start: StartContext) -> LaunchPlan:
        refusal = self.start_refusal(settings, start.hardware) or self.model_refusal(entry)
        refusal = refusal or self.settings_refusal(entry, settings, start.hardware)
        if refusal:
            raise EngineUnavailableError(f"cannot start {entry.id!r} on {self.title}: {refusal}")
        engine = engine_python(self.lane, self.module, self.dist())  # its own environment, if installed
        return self.launch(entry, settings, start, engine=engine)

    def launch(
        self, entry: ModelEntry, settings: Settings, start: StartContext, *, engine: EnginePython | None
    ) -> LaunchPlan:
        """Our worker for `entry`; it reports its own port on stdout, so `start.port` is not used."""
        assert self.worker is not None, f"{type(self).__name__} has no worker and does not override launch"
        params = self.worker.params(entry, settings)
        env = engine_process_env(settings_env(settings, kind=self.lane), engine, worker=True)
        env.update({"PYTHONUNBUFFERED": "1", **dict(self.env)})
        if self.threads_env:
            env[self.threads_env] = str(settings.models.threads or usable_cores())
        return LaunchPlan(
            runtime=self.runtime,
            argv=worker_argv(self.worker.module, params.to_json(), ppid=start.ppid, engine=engine),
            env=env,
            health_path="/health",
            port=None,
            params=params,
            engine=self.lane,
            api=self.api_style,
            memory=self.memory,
        )
