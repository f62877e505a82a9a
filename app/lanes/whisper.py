"""The whisper.cpp lane: a ggml whisper model behind `POST /v1/audio/transcriptions` and `/translations`.

pywhispercpp has no server; our worker (whisper_worker.py) hosts its `Model` and speaks OpenAI's
multipart shape. Only local ggml `.bin` files are loaded (given a name, pywhispercpp would try to
download one).
"""

from __future__ import annotations

from collections.abc import Mapping

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.hardware.cpu import usable_cores
from app.hardware.model import Hardware
from app.lanes.kind import engine_process_env, engine_python, module_install, worker_argv
from app.lanes.plan import LaunchPlan
from app.lanes.proc import settings_env
from app.lanes.worker_params import WhisperParams
from app.library.model import ModelEntry
from app.routing.model import LaneInstall

INSTALL_HINT = "switchyard engine install whisper.cpp (or pip install pywhispercpp)"


class WhisperKind:
    lane = "whisper.cpp"
    formats = frozenset({"whisper-ggml"})
    offers = frozenset({"transcription", "translation"})
    memory = "fixed"  # the ggml file plus a compute buffer of tens of MB (whisper.cpp logs both)

    def install(self, settings: Settings) -> LaneInstall:
        return module_install(self.lane, "pywhispercpp", "pywhispercpp", hint=INSTALL_HINT)

    def start_refusal(self, settings: Settings, hardware: Hardware | None) -> str | None:
        install = self.install(settings)
        return None if install.installed else install.note

    def capabilities(self, entry: ModelEntry) -> frozenset[str]:
        return frozenset({"transcription", "translation"})

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
        refusal = self.start_refusal(settings, hardware)
        if refusal:
            raise EngineUnavailableError(f"cannot start {entry.id!r} on whisper.cpp: {refusal}")
        params = WhisperParams(
            model_path=str(entry.path), alias=entry.id, threads=settings.threads or usable_cores()
        )
        engine = engine_python(self.lane, "pywhispercpp", "pywhispercpp")  # its own environment, if installed
        env = engine_process_env(settings_env(settings, kind=self.lane), engine, worker=True)
        env["PYTHONUNBUFFERED"] = "1"
        argv = worker_argv("app.lanes.whisper_worker", params.to_json(), ppid=ppid, engine=engine)
        return LaunchPlan(
            "pywhispercpp", argv, env, "/health", None, params, engine=self.lane, memory=self.memory
        )
