"""Work the gateway's request path does once, not per request or per event (issue 35).

The request path must not build what it only looks at (a Lane to ask whether it is loaded), must not parse
the safety policy for every request, and the translated stream must pass an ordinary text piece on as the
delta it is, without a new object per event."""

from __future__ import annotations

import json
from pathlib import Path

from app.chat.deltas import Finish, Text
from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.server.gateway.core import Gateway
from app.server.gateway.tool_recovery import ToolCallRecovery
from tests.conftest import link_models

JUDGED = {"enabled": True, "judges": [{"model": "guard", "format": "qwen3guard"}]}


async def test_asking_whether_a_model_needs_a_start_builds_no_lane(tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "m", model_store / "tiny.gguf")
    paths = Paths.from_env()
    paths.ensure()
    async with Runtime(
        settings=Settings.flat(models_dirs=(models,), monitor_interval_s=0), paths=paths
    ) as rt:
        gw = Gateway(rt)
        route = await gw.resolve("tiny", "chat")
        assert gw.needs_start(route) is True
        assert rt.supervisor.lanes == {}, "a lane was built only to answer a yes-or-no question"
        async with gw.hold(route) as lane:  # the request that does start it
            assert rt.supervisor.lanes == {"tiny": lane}
            assert gw.needs_start(route) is False


def test_the_policy_is_parsed_once_per_settings_and_again_when_they_change(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "home")
    rt = Runtime(settings=Settings.flat(plan_memory=False, monitor_interval_s=0), paths=paths)
    gw = Gateway(rt)
    off = gw.policy()
    assert off.enabled is False
    assert gw.policy() is off  # the same object: nothing parsed for the second request
    rt.settings = rt.settings.replace(policy=JUDGED)  # what apply_settings does: a new object
    on = gw.policy()
    assert on.enabled is True and [j.model for j in on.judges] == ["guard"]
    assert gw.policy() is on


def test_a_plain_text_piece_passes_tool_call_recovery_as_it_came() -> None:
    rec = ToolCallRecovery("m")
    piece = Text("the answer is 42")
    assert rec.feed(piece)[0] is piece  # no new delta per event on the common path
    # a marker's first character still holds the text back until it is known not to be a call
    assert rec.feed(Text(" <tool")) == [Text(" ")]
    assert rec.feed(Text("s> are fine")) == [Text("<tools> are fine")]
    assert rec.feed(Finish("stop")) == [Finish("stop")]


def test_a_bare_call_object_spread_over_pieces_is_still_recovered() -> None:
    rec = ToolCallRecovery("m")
    out = []
    for piece in ('{"name": "get_weather", ', '"arguments": {"city": "Paris"}}'):
        out += rec.feed(Text(piece))
    out += rec.feed(Finish("tool_calls"))
    calls = [d for d in out if not isinstance(d, (Text, Finish))]
    assert len(calls) == 1 and calls[0].name == "get_weather"  # type: ignore[attr-defined]
    assert out[-1] == Finish("tool_calls")


# llama.cpp's chunks as its server writes them (captured from the engine), and variations of them
_HEAD = b'{"choices":[{"finish_reason":null,"index":0,"delta":'
_TAIL = b'"created":1796491802,"id":"chatcmpl-x","model":"tiny","object":"chat.completion.chunk"}'
CHUNKS = [
    _HEAD + b'{"content":"p"}}],' + _TAIL,
    _HEAD + '{"content":"é 漢字"}}],'.encode() + _TAIL,
    _HEAD + b'{"content":"say \\"hi\\"\\n"}}],' + _TAIL,  # escapes: read as JSON
    _HEAD + b'{"content":"\\u00e9"}}],' + _TAIL,
    _HEAD + b'{"content":""}}],' + _TAIL,
    _HEAD + b'{"role":"assistant","content":null}}],' + _TAIL,
    _HEAD + b'{"content":"a","reasoning_content":"b"}}],' + _TAIL,
    _HEAD + b'{"content":"a"}}],"usage":{"completion_tokens":4,"prompt_tokens":5},' + _TAIL,
    _HEAD + b'{"content":"a"}}],"timings":{"predicted_n":4},' + _TAIL,
    b'{"choices":[{"finish_reason":"length","index":0,"delta":{}}],' + _TAIL,
    b'{"choices":[],"usage":{"completion_tokens":4,"prompt_tokens":54},' + _TAIL,
    _HEAD + b'{"content":"a"}}]}',
]


def _sse(*payloads: bytes) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"


def test_text_chunks_read_from_their_bytes_give_what_json_gives() -> None:
    from app.chat.deltas import StreamReader, chunk_deltas, plain_text

    fast = [p for p in CHUNKS if plain_text(p) is not None]
    assert fast == CHUNKS[:2]  # plain text, ascii or not; every other chunk is read as JSON
    stream = _sse(*CHUNKS)
    by_json = [d for p in CHUNKS for d in chunk_deltas(json.loads(p))]
    for step in (1, 7, len(stream)):  # however the stream is cut into reads
        reader = StreamReader()
        got = [d for i in range(0, len(stream), step) for d in reader.deltas(stream[i : i + step])]
        assert got == by_json and reader.done


def test_one_whole_frame_per_read_takes_the_short_way_with_the_same_bytes() -> None:
    from app.server.gateway.raw_http import ChunkFrames, ChunkPayload

    events = [b"data: " + p + b"\n\n" for p in CHUNKS]
    frames = [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
    passed, payload = ChunkFrames(), ChunkPayload()
    assert [passed.forward(f) for f in frames] == frames
    assert [payload.feed(f) for f in frames] == events
    # a read holding the terminal frame, and a read cut inside a frame, still take the framed walk
    assert passed.forward(b"0\r\n\r\n") == b"" and passed.ended
    cut = ChunkPayload()
    assert cut.feed(frames[0][:5]) + cut.feed(frames[0][5:]) + cut.feed(b"0\r\n\r\n") == events[0]
    assert cut.ended


def test_a_stopped_process_anywhere_in_an_engine_tree_is_seen_from_its_own_tree() -> None:
    import os
    import signal
    import subprocess
    import time

    import psutil

    from app.core.platform.stopped import tree_stopped

    parent = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 5
        while not (kids := psutil.Process(parent.pid).children()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert kids, "the shell did not start its child"
        assert tree_stopped(parent.pid) is False
        os.kill(kids[0].pid, signal.SIGSTOP)  # the grandchild of this test, the child of the "engine"
        deadline = time.monotonic() + 5
        while not tree_stopped(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tree_stopped(parent.pid) is True
        os.kill(kids[0].pid, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while tree_stopped(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tree_stopped(parent.pid) is False
        kids[0].kill()
    finally:
        parent.kill()
        parent.wait()
    assert tree_stopped(parent.pid) is False  # gone: not stopped


HOSTILE_BODIES = [
    '{"model": "m\\u0000x"}',  # a NUL outside the conversation
    '{"messages": [{"role": "user", "content": "\\ud800"}]}',  # a lone surrogate
    '{"messages": [{"role": "user", "content": "a\\u0000b"}], "user": "\\uDC00"}',
    '{"max_tokens": 99999999999999999999}',
    '{"temperature": NaN}',
    '{"temperature": -Infinity}',
    '{"top_p": 1e999}',
    '{"a": ' + "[" * 70 + "]" * 70 + "}",
]
CLEAN_BODIES = [
    '{"messages": [{"role": "user", "content": "caf\\u00e9 \\ud83d\\ude00 \\\\u0000"}], "max_tokens": 9}',
    '{"messages": [{"role": "user", "content": "a\\u0000b"}]}',  # a NUL in what was said is text
    '{"seed": -9223372036854775808, "temperature": 0.5, "a": ' + "[" * 60 + "]" * 60 + "}",
]


def test_the_body_check_refuses_and_passes_what_the_full_walk_does() -> None:
    import pytest

    from app.core.errors import SwitchyardError
    from app.server.gateway.request_input import check_values, parse_json_object

    for text in HOSTILE_BODIES:
        with pytest.raises(SwitchyardError) as walked:
            check_values(json.loads(text))
        with pytest.raises(SwitchyardError) as parsed:
            parse_json_object(text.encode())
        assert (parsed.value.message, parsed.value.param) == (walked.value.message, walked.value.param)
    for text in CLEAN_BODIES:
        check_values(json.loads(text))
        assert parse_json_object(text.encode()) == json.loads(text)


def test_message_start_reports_the_prompt_counted_beside_the_engine_start(
    tmp_path: Path, model_store: Path
) -> None:
    """The Anthropic opening's prompt count overlaps the engine's start: it still reaches message_start."""
    import httpx

    from tests.conftest import running_server

    models = link_models(tmp_path / "m", model_store / "tiny.gguf")
    hi = [{"role": "user", "content": "hi"}]
    body = {"model": "tiny", "max_tokens": 8, "stream": True, "messages": hi, "grammar": 'root ::= "ab"'}
    with running_server(tmp_path / "home", models) as server:
        counted = httpx.post(
            server.url + "/v1/messages/count_tokens", json={"model": "tiny", "messages": hi}, timeout=60
        ).json()["input_tokens"]
        for _ in range(2):  # the first request starts the lane; the second finds it ready
            with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=60) as r:
                data = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
            start = json.loads(data[0])
            assert start["type"] == "message_start"
            assert start["message"]["usage"]["input_tokens"] == counted > 0
            assert json.loads(data[-1])["type"] == "message_stop"
