"""The whisper.cpp lane: a ggml whisper model behind `POST /v1/audio/transcriptions` and `/translations`.

pywhispercpp has no server; our worker (app/lanes/workers/whisper.py) hosts its `Model` and speaks OpenAI's
multipart shape. Only local ggml `.bin` files are loaded (given a name, pywhispercpp would try to
download one).
"""

from __future__ import annotations

from app.core.settings import Settings
from app.hardware.cpu import usable_cores
from app.lanes.engines.python_kind import PythonEngineKind, Worker
from app.lanes.workers.params import WhisperParams
from app.library.model import ModelEntry

INSTALL_HINT = "switchyard engine install whisper.cpp (or pip install pywhispercpp)"


def whisper_params(entry: ModelEntry, settings: Settings) -> WhisperParams:
    threads = settings.models.threads or usable_cores()
    return WhisperParams(model_path=str(entry.path), alias=entry.id, threads=threads)


WHISPER = PythonEngineKind(
    lane="whisper.cpp",
    title="whisper.cpp",
    runtime="pywhispercpp",
    module="pywhispercpp",
    hint=INSTALL_HINT,
    formats=frozenset({"whisper-ggml"}),
    offers=frozenset({"transcription", "translation"}),
    memory="fixed",  # the ggml file plus a compute buffer of tens of MB (whisper.cpp logs both)
    worker=Worker("app.lanes.workers.whisper", whisper_params),
    install_estimate_s=60,
)
