"""The one gateway: every surface through the same resolve → wait → hold → check → post, the one delta
reader, and the seams it keeps (a lane kind needs no change in app/server/).

Real `switchyard serve` with real llama.cpp lanes, driven by the official openai, anthropic and ollama
clients where a surface is involved; the delta reader is tested byte by byte, as engines split streams.
"""

from __future__ import annotations

import ast
import base64
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import ollama
import openai
import pytest

from app.chat.deltas import (
    Finish,
    Reasoning,
    StreamReader,
    StreamRefusal,
    Text,
    ToolCallPart,
    Usage,
    answer_deltas,
    chunk_deltas,
)
from tests.conftest import ServerProcess, link_models, running_server

REPO = Path(__file__).resolve().parents[3]
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()


# ---- the delta reader ------------------------------------------------------------------------------
def _sse(*objs: object) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + b"data: [DONE]\n\n"


STREAM = _sse(
    {"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "hm"}}]},
    {"choices": [{"index": 0, "delta": {"content": "héllo"}}]},
    {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": '{"a"'}}
                    ]
                },
            }
        ]
    },
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}, "timings": {"predicted_ms": 4.0}},
)
EXPECTED = [
    Reasoning("hm"),
    Text("héllo"),
    ToolCallPart(0, "call_1", "f", '{"a"'),
    ToolCallPart(0, None, "", ": 1}"),
    Finish("tool_calls"),
    Usage(7, 5, None, {"predicted_ms": 4.0}),
]


@pytest.mark.parametrize("step", [1, 3, 17, len(STREAM)])
def test_delta_reader_is_the_same_however_the_stream_is_split(step: int) -> None:
    reader = StreamReader()
    got = []
    for i in range(0, len(STREAM), step):
        got += reader.deltas(STREAM[i : i + step])
    assert got == EXPECTED and reader.done


def test_delta_reader_stops_at_done_and_raises_refusals() -> None:
    reader = StreamReader()
    assert reader.deltas(
        _sse({"choices": [{"index": 0, "delta": {"content": "a"}}]}) + b"data: junk\n\n"
    ) == [Text("a")]
    assert reader.done
    with pytest.raises(StreamRefusal) as exc:
        StreamReader().deltas(b': comment\n\nerror: {"message": "slot gone"}\n\n')
    assert b"slot gone" in exc.value.payload
    with pytest.raises(StreamRefusal):
        StreamReader().deltas(b'data: {"error": {"message": "context full"}}\n\n')
    # a line that is not JSON is skipped, the stream goes on
    assert StreamReader().deltas(b'data: {not json\n\ndata: {"choices": [{"text": "x"}]}\n\n') == [Text("x")]


def test_whole_answers_and_completions_read_as_the_same_deltas() -> None:
    answer = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {
                    "role": "assistant",
                    "content": "hi",
                    "tool_calls": [{"function": {"name": "g"}}],
                },
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 2}},
    }
    assert answer_deltas(answer) == [
        Text("hi"),
        ToolCallPart(0, None, "g", ""),
        Finish("stop"),
        Usage(3, 1, 2, None),
    ]
    assert chunk_deltas({"choices": [{"index": 1, "delta": {"content": "other choice"}}]}) == []
    assert chunk_deltas({"choices": [{"index": 0, "text": "t", "finish_reason": "length"}]}) == [
        Text("t"),
        Finish("length"),
    ]


# ---- the seams ---------------------------------------------------------------------------------------
def _app_imports(f: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def test_server_imports_no_lane_kind() -> None:
    """A new lane kind touches no file in app/server/: the server knows targets (app/lanes/target.py).

    A folder rule, not a hand list: nothing under app/server/ imports app/lanes/engines/ or workers/."""
    bad = [
        f"{f.relative_to(REPO)}: {name}"
        for f in sorted((REPO / "app" / "server").rglob("*.py"))
        for name in _app_imports(f)
        if name.startswith(("app.lanes.engines", "app.lanes.workers"))
    ]
    assert not bad, bad


def test_one_post_to_engines() -> None:
    """Only the gateway posts to an engine: no route module or translator opens its own request."""
    offenders = []
    for f in sorted((REPO / "app" / "server").rglob("*.py")):
        if f.relative_to(REPO).as_posix() == "app/server/gateway/core.py":
            continue
        text = f.read_text()
        if ".http.post(" in text or "supervisor.http" in text or "remotes.http" in text:
            offenders.append(f.name)
    assert not offenders, offenders


# ---- every surface through one path ------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("gateway")
    models = link_models(base / "models", model_store / "tiny.gguf", model_store / "embed.gguf")
    with running_server(base / "home", models) as s:
        yield s


def _image_chat() -> list[dict[str, object]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is it?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            ],
        }
    ]


def test_an_image_for_a_model_without_a_projector_is_400_on_every_surface(server: ServerProcess) -> None:
    oa = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as exc:
            r = oa.chat.completions.create(model="tiny", messages=_image_chat(), stream=stream)  # type: ignore[call-overload]
            list(r) if stream else None
        assert exc.value.code == "model_has_no_vision" and "'tiny'" in str(exc.value)
    with pytest.raises(openai.BadRequestError) as exc:
        oa.responses.create(
            model="tiny",
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "what is it?"},
                        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
                    ],
                }
            ],
        )
    assert exc.value.code == "model_has_no_vision"
    an = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="no vision projector") as aexc:
        an.messages.create(
            model="tiny",
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                        },
                        {"type": "text", "text": "what is it?"},
                    ],
                }
            ],
        )
    assert aexc.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    ol = ollama.Client(host=server.url)
    with pytest.raises(ollama.ResponseError, match="no vision projector") as oexc:
        ol.chat(model="tiny", messages=[{"role": "user", "content": "what?", "images": [PNG]}])
    assert oexc.value.status_code == 400
    # the 400 is the gateway's, before any engine call: one access-log line each, no retries
    assert sum("status=400" in ln and "/v1/chat/completions" in ln for ln in server.stderr) == 2


def test_each_surface_words_its_own_errors(server: ServerProcess) -> None:
    an = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as aexc:
        an.messages.create(model="nope", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert aexc.value.body["type"] == "error" and aexc.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(ollama.ResponseError) as oexc:
        ollama.Client(host=server.url).chat(model="nope", messages=[{"role": "user", "content": "x"}])
    assert oexc.value.status_code == 404 and "not found" in oexc.value.error
    with pytest.raises(anthropic.BadRequestError, match="embedding model"):
        an.messages.create(model="embed", max_tokens=8, messages=[{"role": "user", "content": "x"}])


def _log_line(server: ServerProcess, needle: str, timeout: float = 10) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ln in list(server.stderr):
            if needle in ln:
                return ln
        time.sleep(0.05)
    return None


def test_a_client_that_hangs_up_is_499_in_the_access_log_as_in_metrics(server: ServerProcess) -> None:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "go on"}],
            "stream": True,
            "max_tokens": 4000,
            "ignore_eos": True,
            "user": "hangs-up",
        }
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        got = b""
        while b"data: {" not in got:
            got += sock.recv(4096)
    line = _log_line(server, "POST /v1/chat/completions model=tiny status=499")
    assert line is not None, [ln for ln in server.stderr if "/v1/chat/completions" in ln][-3:]
    assert not any("/v1/chat/completions model=tiny status=500" in ln for ln in server.stderr)


# ---- the byte relay's framing ------------------------------------------------------------------------
def _frames(*payloads: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"


@pytest.mark.parametrize("step", [1, 2, 5, 64])
def test_chunk_frames_pass_every_frame_but_the_terminal_one(step: int) -> None:
    from app.server.gateway.raw_http import ChunkFrames, dechunk

    events = [b'data: {"a": 1}\n\n', b"data: " + b"x" * 300 + b"\n\n", b"data: [DONE]\n\n"]
    wire = _frames(*events)
    frames = ChunkFrames()
    out = b""
    for i in range(0, len(wire), step):
        out += frames.forward(wire[i : i + step])
    assert frames.ended
    assert out == wire[: -len(b"0\r\n\r\n")]  # byte for byte, only the terminator held back
    assert dechunk(out + b"0\r\n\r\n") == b"".join(events)
    assert frames.forward(b"5\r\nlate!\r\n") == b""  # nothing after the end reaches the client


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_chunk_payload_decodes_however_the_frames_are_split(step: int) -> None:
    from app.server.gateway.raw_http import ChunkPayload

    events = [b'data: {"a": 1}\n\n', b"data: " + b"y" * 40 + b"\r\n\r\n", b"data: [DONE]\n\n"]
    wire = _frames(*events)
    dec = ChunkPayload()
    got = b"".join(dec.feed(wire[i : i + step]) for i in range(0, len(wire), step))
    assert got == b"".join(events) and dec.ended
    assert dec.feed(b"3\r\nabc\r\n") == b""
