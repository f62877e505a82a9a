"""The piper lane: a Piper voice (`.onnx` + `.onnx.json`) behind `POST /v1/audio/speech`.

piper-tts ships a Flask server with its own request shape; our worker (app/lanes/workers/piper.py) hosts
`PiperVoice` instead and speaks the OpenAI shape, so the gateway passes requests through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.settings import Settings
from app.lanes.engines.python_kind import PythonEngineKind
from app.lanes.workers.params import PiperParams
from app.library.model import ModelEntry

INSTALL_HINT = "switchyard engine install piper (or pip install piper-tts)"


@dataclass(frozen=True, kw_only=True)
class PiperKind(PythonEngineKind):
    def worker_params(self, entry: ModelEntry, settings: Settings) -> PiperParams:
        onnx = entry.path
        config = onnx.with_name(onnx.name + ".json")
        return PiperParams(model_path=str(onnx), config_path=str(config), alias=entry.id)


PIPER = PiperKind(
    lane="piper",
    title="Piper",
    runtime="piper-tts",
    module="piper",
    hint=INSTALL_HINT,
    formats=frozenset({"piper"}),
    offers=frozenset({"speech"}),
    memory="fixed",  # an ONNX voice of tens of MB; what it holds is its file plus onnxruntime
    worker="app.lanes.workers.piper",
    install_estimate_s=45,
)
