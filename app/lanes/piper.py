"""The piper lane: a Piper voice (`.onnx` + `.onnx.json`) behind `POST /v1/audio/speech`.

piper-tts ships a Flask server with its own request shape; our worker (piper_worker.py) hosts
`PiperVoice` instead and speaks the OpenAI shape, so the gateway passes requests through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.hardware.model import Hardware
from app.lanes.kind import engine_process_env, engine_python, module_install, worker_argv
from app.lanes.plan import LaunchPlan
from app.lanes.proc import settings_env
from app.lanes.worker_params import PiperParams
from app.library.model import ModelEntry
from app.routing.model import LaneInstall

INSTALL_HINT = "switchyard engine install piper (or pip install piper-tts)"


class PiperKind:
    lane = "piper"
    formats = frozenset({"piper"})
    offers = frozenset({"speech"})
    memory = "fixed"  # an ONNX voice of tens of MB; what it holds is its file plus onnxruntime

    def install(self, settings: Settings) -> LaneInstall:
        return module_install(self.lane, "piper", "piper-tts", hint=INSTALL_HINT)

    def start_refusal(self, settings: Settings, hardware: Hardware | None) -> str | None:
        install = self.install(settings)
        return None if install.installed else install.note

    def capabilities(self, entry: ModelEntry) -> frozenset[str]:
        return frozenset({"speech"})

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
            raise EngineUnavailableError(f"cannot start {entry.id!r} on Piper: {refusal}")
        onnx = entry.path
        config = onnx.with_name(onnx.name + ".json")
        params = PiperParams(model_path=str(onnx), config_path=str(config), alias=entry.id)
        engine = engine_python(self.lane, "piper", "piper-tts")  # its own environment, if installed
        env = engine_process_env(settings_env(settings, kind=self.lane), engine, worker=True)
        env["PYTHONUNBUFFERED"] = "1"
        argv = worker_argv("app.lanes.piper_worker", params.to_json(), ppid=ppid, engine=engine)
        return LaunchPlan(
            "piper-tts", argv, env, "/health", None, params, engine=self.lane, memory=self.memory
        )
