"""Voice activity detection for live audio: Silero VAD's ONNX model run with onnxruntime, in the gateway.

The `silero-vad` package ships the model file; its own loader imports torch, so we read the file from the
package's data and feed the network ourselves (a 512-sample frame at 16 kHz with the previous frame's last
64 samples in front, and the recurrent state carried from frame to frame). Running it here rather than in
the whisper worker means silence never reaches an engine.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.core.errors import EngineUnavailableError

RATE = 16000
FRAME = 512  # samples per decision at 16 kHz (32 ms): the size the model was trained on
CONTEXT = 64  # samples of the previous frame the model sees before each new one
FRAME_MS = FRAME * 1000 // RATE
INSTALL_HINT = "pip install onnxruntime && pip install --no-deps silero-vad"


def _model_file() -> Path:
    # found, not imported: the package's __init__ imports torch
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("silero_vad")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"


class VadModel:
    """One loaded Silero network; safe to share between streams (each keeps its own state)."""

    def __init__(self, session: Any) -> None:
        self._session = session

    @classmethod
    def load(cls) -> VadModel:
        """Load the ONNX file from the installed `silero-vad` package; a clear error when it is missing."""
        try:
            import onnxruntime  # type: ignore[import-untyped]
        except ImportError as exc:
            raise EngineUnavailableError(
                f"live transcription needs voice activity detection, and onnxruntime is not installed: "
                f"{INSTALL_HINT}"
            ) from exc
        try:
            model = _model_file().read_bytes()
        except (ImportError, OSError) as exc:
            raise EngineUnavailableError(
                f"live transcription needs the Silero VAD model, and the silero-vad package is not "
                f"installed: {INSTALL_HINT} (--no-deps: its torch dependency is not needed)"
            ) from exc
        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1  # one 32 ms frame is a few hundred microseconds of work
        opts.intra_op_num_threads = 1
        return cls(onnxruntime.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"]))

    def stream(self) -> VadStream:
        return VadStream(self)

    def run(self, x: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        feeds = {"input": x[None, :], "state": state, "sr": np.array(RATE, dtype=np.int64)}
        out, new_state = self._session.run(None, feeds)
        return float(out[0][0]), new_state


class VadStream:
    """Speech probabilities for consecutive frames of one audio stream."""

    def __init__(self, model: VadModel) -> None:
        self._model = model
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)

    def prob(self, frame: np.ndarray) -> float:
        x = np.concatenate([self._context, frame.astype(np.float32)])
        p, self._state = self._model.run(x, self._state)
        self._context = x[-CONTEXT:]
        return p


@dataclass(frozen=True, kw_only=True)
class VadConfig:
    """OpenAI's `server_vad` knobs: start above `threshold`, stop after `silence_ms` below it."""

    threshold: float = 0.5
    silence_ms: int = 500
    prefix_ms: int = 300


@dataclass(frozen=True)
class SpeechStarted:
    start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    end_ms: int
    audio: np.ndarray = field(repr=False)  # what whisper gets: prefix padding, the speech, a little silence


class Segmenter:
    """Cuts a 16 kHz stream into speech segments. `feed` returns the starts and stops it saw; the times
    are the speech's own bounds in ms from the stream's beginning (the padding is only in the audio)."""

    def __init__(self, model: VadModel, config: VadConfig) -> None:
        self.config = config
        self._vad = model.stream()
        self._pending = np.zeros(0, dtype=np.float32)
        self._frames = 0  # frames decided so far
        self._prefix: list[np.ndarray] = []
        self._speech: list[np.ndarray] | None = None  # the segment's audio while in speech
        self._silence_from: int | None = None  # frame index where the current silence began

    @property
    def in_speech(self) -> bool:
        return self._speech is not None

    @property
    def buffered_samples(self) -> int:
        return sum(f.size for f in self._speech) if self._speech is not None else 0

    def feed(self, samples: np.ndarray) -> list[SpeechStarted | SpeechStopped]:
        data = np.concatenate([self._pending, samples])
        events: list[SpeechStarted | SpeechStopped] = []
        whole = data.size // FRAME * FRAME
        for i in range(0, whole, FRAME):
            event = self._step(data[i : i + FRAME])
            if event is not None:
                events.append(event)
        self._pending = data[whole:]
        return events

    def cut(self) -> SpeechStopped | None:
        """End the segment now (a commit, or the buffer cap); None when not in speech."""
        if self._speech is None:
            return None
        end = self._silence_from if self._silence_from is not None else self._frames
        return self._stop(end_frame=end)

    def _step(self, frame: np.ndarray) -> SpeechStarted | SpeechStopped | None:
        cfg = self.config
        p = self._vad.prob(frame)
        index = self._frames
        self._frames += 1
        if self._speech is None:
            keep = max(0, cfg.prefix_ms // FRAME_MS)
            if p >= cfg.threshold:
                lead = self._prefix[len(self._prefix) - keep :] if keep else []
                if len(lead) < keep:
                    # the speech began in the stream's first frames: the rest of the lead-in is silence, as
                    # before any other segment (given none, whisper can mishear the first word)
                    lead = [np.zeros(FRAME * (keep - len(lead)), dtype=frame.dtype), *lead]
                self._speech = [*lead, frame]
                self._prefix = []
                self._silence_from = None
                return SpeechStarted(start_ms=index * FRAME_MS)
            self._prefix.append(frame)
            del self._prefix[: max(0, len(self._prefix) - keep)]
            return None
        self._speech.append(frame)
        if p >= cfg.threshold - 0.15:  # a lower bar to stay in speech, as Silero's own segmenter does
            self._silence_from = None
            return None
        if self._silence_from is None:
            self._silence_from = index
        if (self._frames - self._silence_from) * FRAME_MS >= cfg.silence_ms:
            return self._stop(end_frame=self._silence_from)
        return None

    def _stop(self, *, end_frame: int) -> SpeechStopped:
        frames = self._speech or []
        tail = max(0, self._frames - end_frame - 300 // FRAME_MS)  # keep 300 ms of the silence at most
        audio = np.concatenate(frames[: len(frames) - tail] if tail else frames)
        self._speech = None
        self._silence_from = None
        return SpeechStopped(end_ms=end_frame * FRAME_MS, audio=audio)
