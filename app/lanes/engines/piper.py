"""The piper lane: a Piper voice (`.onnx` + `.onnx.json`) behind `POST /v1/audio/speech`.

piper-tts ships a Flask server with its own request shape; our worker (app/lanes/workers/piper.py) hosts
`PiperVoice` instead and speaks the OpenAI shape, so the gateway passes requests through unchanged.
"""

from __future__ import annotations

from app.core.settings import Settings
from app.lanes.engines.python_kind import PythonEngineKind, Worker
from app.lanes.workers.params import PiperParams
from app.library.model import ModelEntry

INSTALL_HINT = "switchyard engine install piper (or pip install piper-tts)"


def piper_params(entry: ModelEntry, settings: Settings) -> PiperParams:
    onnx = entry.path
    config = onnx.with_name(onnx.name + ".json")
    return PiperParams(model_path=str(onnx), config_path=str(config), alias=entry.id)


PIPER = PythonEngineKind(
    lane="piper",
    title="Piper",
    runtime="piper-tts",
    module="piper",
    hint=INSTALL_HINT,
    formats=frozenset({"piper"}),
    offers=frozenset({"speech"}),
    memory="fixed",  # an ONNX voice of tens of MB; what it holds is its file plus onnxruntime
    worker=Worker("app.lanes.workers.piper", piper_params),
    install_estimate_s=45,
)
