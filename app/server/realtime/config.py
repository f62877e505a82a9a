"""The settings of one live transcription session, read from OpenAI's `transcription_session.update` (the
beta shape) or `session.update` with `type: "transcription"` (the GA shape), and the session object we
answer with. Only 24 kHz PCM16 mono is read; anything else is refused with the reason."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from app.core.errors import BadRequestError
from app.server.realtime.vad import VadConfig

IN_RATE = 24000  # the Realtime API's pcm16 rate


@dataclass(frozen=True, kw_only=True)
class SessionConfig:
    model: str | None = None
    language: str = ""
    prompt: str = ""
    vad: VadConfig | None = dataclasses.field(default_factory=VadConfig)  # None: the client commits


def _obj(value: Any, *, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequestError(f"`{param}` must be an object", param=param)
    return value


def _format(value: Any, *, param: str) -> None:
    if isinstance(value, dict):  # GA: {"type": "audio/pcm", "rate": 24000}
        kind, rate = value.get("type", "audio/pcm"), value.get("rate", IN_RATE)
        if kind != "audio/pcm" or rate != IN_RATE:
            raise BadRequestError(
                f"audio format {kind} at {rate} Hz is not supported: send audio/pcm at 24000 Hz "
                "(16-bit little-endian mono)",
                param=param,
            )
    elif value != "pcm16":
        raise BadRequestError(
            f"input_audio_format {value!r} is not supported: send pcm16 (16-bit little-endian mono at "
            "24 kHz); G.711 is not decoded here",
            param=param,
        )


def _number(d: dict[str, Any], key: str, *, param: str, low: float, high: float) -> float | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise BadRequestError(f"`{key}` must be a number from {low:g} to {high:g}", param=f"{param}.{key}")
    return float(value)


def _turns(value: Any, *, param: str, current: VadConfig | None) -> VadConfig | None:
    if value is None:
        return None
    d = _obj(value, param=param)
    kind = d.get("type", "server_vad")
    if kind != "server_vad":
        raise BadRequestError(
            f"turn_detection type {kind!r} is not supported: use server_vad, or null to commit yourself",
            param=f"{param}.type",
        )
    base = current or VadConfig()
    threshold = _number(d, "threshold", param=param, low=0, high=1)
    silence = _number(d, "silence_duration_ms", param=param, low=0, high=10_000)
    prefix = _number(d, "prefix_padding_ms", param=param, low=0, high=10_000)
    return VadConfig(
        threshold=base.threshold if threshold is None else threshold,
        silence_ms=base.silence_ms if silence is None else int(silence),
        prefix_ms=base.prefix_ms if prefix is None else int(prefix),
    )


def _text(d: dict[str, Any], key: str, *, param: str, default: str) -> str:
    value = d.get(key, default)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequestError(f"`{key}` must be a string", param=f"{param}.{key}")
    return value


def apply_update(event: dict[str, Any], current: SessionConfig) -> SessionConfig:
    """`current` with the event's session settings applied; a BadRequestError names the bad field."""
    session = _obj(event.get("session", {}), param="session")
    changes: dict[str, Any] = {}
    if event.get("type") == "session.update":  # GA: session.audio.input holds the audio settings
        if session.get("type", "transcription") != "transcription":
            raise BadRequestError(
                "only transcription sessions are served here (session.type: transcription); connect "
                "with ?intent=transcription",
                param="session.type",
            )
        audio = _obj(_obj(session.get("audio", {}), param="session.audio").get("input", {}), param="input")
        where = "session.audio.input"
        fmt, tx, turns = audio.get("format"), audio.get("transcription"), "turn_detection" in audio
        turn_value = audio.get("turn_detection")
    else:
        where = "session"
        fmt, tx = session.get("input_audio_format"), session.get("input_audio_transcription")
        turns, turn_value = "turn_detection" in session, session.get("turn_detection")
    if fmt is not None:
        _format(fmt, param=f"{where}.format" if where != "session" else "session.input_audio_format")
    if tx is not None:
        t = _obj(tx, param=f"{where}.transcription")
        model = t.get("model", current.model)
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise BadRequestError(
                "`model` must name a transcription model from GET /v1/models", param="model"
            )
        changes["model"] = model
        changes["language"] = _text(t, "language", param=where, default=current.language)
        changes["prompt"] = _text(t, "prompt", param=where, default=current.prompt)
    if turns:
        changes["vad"] = _turns(turn_value, param=f"{where}.turn_detection", current=current.vad)
    return dataclasses.replace(current, **changes)


def session_object(session_id: str, config: SessionConfig) -> dict[str, Any]:
    """The session as both API shapes describe it (the beta's flat fields and the GA's audio.input)."""
    turns = (
        None
        if config.vad is None
        else {
            "type": "server_vad",
            "threshold": config.vad.threshold,
            "silence_duration_ms": config.vad.silence_ms,
            "prefix_padding_ms": config.vad.prefix_ms,
        }
    )
    tx = {"model": config.model, "language": config.language or None, "prompt": config.prompt}
    return {
        "id": session_id,
        "object": "realtime.transcription_session",
        "type": "transcription",
        "input_audio_format": "pcm16",
        "input_audio_transcription": tx,
        "turn_detection": turns,
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": IN_RATE},
                "transcription": tx,
                "turn_detection": turns,
            }
        },
    }
