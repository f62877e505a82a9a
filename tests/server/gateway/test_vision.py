"""Images on every surface, against a real engine: a tiny llama model with a generated CLIP projector
(tests/support/visiongen.py) loaded by llama.cpp, asked through the official openai, anthropic and ollama
clients;
and every bad image refused with its 400/413 in each surface's own error shape."""

from __future__ import annotations

import base64
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.conftest import ServerProcess, running_server
from tests.support.tinymodels import write_tiny_gguf
from tests.support.visiongen import BMP_B64, GIF_B64, JPEG_B64, VisionSpec, png_bytes, write_tiny_mmproj

VL = "vision/tiny-vl"
PNG = png_bytes()
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
IMAGE_TOKENS = VisionSpec().n_patches  # one token per patch for llava's mlp projector


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("vision")
    models = base / "models"
    write_tiny_gguf(models / "vision" / "tiny-vl.gguf")
    write_tiny_mmproj(models / "vision" / "mmproj-tiny-vl-f32.gguf")
    write_tiny_gguf(models / "tiny.gguf")  # text only: no projector in its folder
    # projectors named by overrides: one for a text model of another width, one whose header lacks the width
    write_tiny_gguf(models / "bad" / "tiny-bad.gguf")
    write_tiny_mmproj(models / "bad" / "wrong-width.gguf", VisionSpec(projection_dim=32))
    write_tiny_gguf(models / "bad" / "tiny-nokey.gguf")
    write_tiny_mmproj(models / "bad" / "no-width.gguf", VisionSpec(write_dim_key=False))
    home = base / "home"
    home.mkdir()
    settings = {
        "max_image_mib": 1,
        "model_overrides": {
            VL: {"ctx_size": 1024, "parallel": 4},  # 256 tokens per request: 16 images fill it
            "bad/tiny-bad": {"mmproj": "wrong-width.gguf"},
            "bad/tiny-nokey": {"mmproj": "no-width.gguf"},
        },
    }
    (home / "settings.json").write_text(json.dumps(settings))
    with running_server(home, models) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)


def _parts(*urls: str, text: str = "hi") -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}, *({"type": "image_url", "image_url": {"url": u}} for u in urls)]


def _prompt_tokens(oai: openai.OpenAI, content: Any, model: str = VL) -> int:
    r = oai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=1
    )
    assert r.usage is not None
    return r.usage.prompt_tokens


# ---- the model side --------------------------------------------------------------------------------
def test_capabilities_say_vision(server: ServerProcess) -> None:
    models = {m["id"]: m for m in httpx.get(server.api + "/models").json()["data"]}
    assert "vision" in models[VL]["capabilities"]
    assert "vision" not in models["tiny"]["capabilities"]
    assert not any("mmproj" in mid for mid in models)  # a projector is never a model of its own
    show = ollama.Client(host=server.url).show(VL)
    assert "vision" in (show.capabilities or [])
    lib = {m["id"]: m for m in httpx.get(server.url + "/api/library").json()["models"]}
    assert lib[VL]["mmproj"].endswith("mmproj-tiny-vl-f32.gguf") and lib["tiny"]["mmproj"] is None


def test_explain_counts_the_projector(server: ServerProcess) -> None:
    doc = httpx.get(server.url + f"/api/models/{VL}/explain", timeout=60).json()
    cpu = doc["fit"]["chosen"]["devices"][0]
    assert cpu["projector"] > 100_000  # the projector file's tensors (about 120 KB)
    assert cpu["projector_compute"] > 0


# ---- the API side: a real answer on each surface -----------------------------------------------------
def test_openai_image_tokens_in_usage(oai: openai.OpenAI) -> None:
    text_only = _prompt_tokens(oai, _parts())
    one = _prompt_tokens(oai, _parts(PNG_URL))
    two = _prompt_tokens(oai, _parts(PNG_URL, "data:image/jpeg;base64," + JPEG_B64))
    assert one - text_only >= IMAGE_TOKENS
    assert two - one == IMAGE_TOKENS  # the engine's own count of the second image
    gif = _prompt_tokens(oai, _parts("data:image/gif;base64," + GIF_B64))
    assert gif == one


def test_anthropic_image_block(server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    block: Any = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG_URL[22:]},
    }
    msg = client.messages.create(
        model=VL,
        max_tokens=1,
        messages=[{"role": "user", "content": [block, {"type": "text", "text": "hi"}]}],
    )
    assert msg.usage.input_tokens > IMAGE_TOKENS
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=1, messages=[{"role": "user", "content": [block]}])
    assert "cannot read images" in str(e.value)


def test_ollama_images_field(server: ServerProcess) -> None:
    client = ollama.Client(host=server.url, timeout=120)
    r = client.chat(
        model=VL, messages=[{"role": "user", "content": "hi", "images": [PNG]}], options={"num_predict": 1}
    )
    assert (r.prompt_eval_count or 0) > IMAGE_TOKENS
    g = client.generate(model=VL, prompt="hi", images=[PNG], options={"num_predict": 1})
    assert (g.prompt_eval_count or 0) > IMAGE_TOKENS
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=VL, messages=[{"role": "user", "content": "hi", "images": [PNG[:-30]]}])
    assert e.value.status_code == 400 and "not a readable image" in str(e.value)


def test_responses_input_image(oai: openai.OpenAI) -> None:
    content: Any = [{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": PNG_URL}]
    r = oai.responses.create(model=VL, input=[{"role": "user", "content": content}], max_output_tokens=1)
    assert r.usage is not None and r.usage.input_tokens > IMAGE_TOKENS


# ---- bad input: a clear 400/413, never a 500 ---------------------------------------------------------
BAD = [
    ("tiny", [PNG_URL], 400, "model_has_no_vision"),
    (VL, ["data:image/png;base64," + base64.b64encode(PNG[:-30]).decode()], 400, "invalid_image"),
    (VL, ["data:image/png;base64,@@not-base64@@"], 400, "invalid_image"),
    (VL, ["data:image/bmp;base64," + BMP_B64], 400, "unsupported_image_type"),
    (
        VL,
        ["data:image/png;base64," + base64.b64encode(b"\0" * (1 << 20) + PNG).decode()],
        413,
        "image_too_large",
    ),
    (VL, [PNG_URL] * 16, 400, "too_many_images"),
    (VL, ["https://example.com/cat.png"], 400, "image_url_not_allowed"),
]


@pytest.mark.parametrize(("model", "urls", "status", "code"), BAD, ids=[b[3] for b in BAD])
def test_openai_refusals(server: ServerProcess, model: str, urls: list[str], status: int, code: str) -> None:
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": _parts(*urls)}]}
    r = httpx.post(server.api + "/chat/completions", json=body, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"]
    if code == "too_many_images":
        assert "16 image(s) take 256 tokens (16 each)" in err["message"]
    if code == "image_url_not_allowed":
        assert "fetch_image_urls is off" in err["message"]


@pytest.mark.parametrize(
    ("model", "status", "words"),
    [
        ("bad/tiny-bad", 422, "is for a text model of width 32, but 'bad/tiny-bad' has width 64"),
        ("bad/tiny-nokey", 503, "Key not found: clip.vision.projection_dim"),
    ],
)
def test_wrong_projector_fails_in_words(server: ServerProcess, model: str, status: int, words: str) -> None:
    """A projector for another model: refused before the start when its header says so, else the engine's
    own load error comes back with the projector named."""
    r = httpx.post(
        server.api + "/chat/completions",
        json={"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    assert "vision projector" in message and words in message
    # the lane keeps the same words as its error, where the window and /api/lanes show them
    lanes = {lane["id"]: lane for lane in httpx.get(server.url + "/api/lanes", timeout=30).json()["lanes"]}
    assert lanes[model]["state"] == "failed" and words in lanes[model]["error"]
    # and another surface's official client gets them too, in its own shape
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=server.url, timeout=120).chat(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
    assert e.value.status_code == status and words in e.value.error


def test_ls_marks_the_paired_model(server: ServerProcess) -> None:
    env = dict(os.environ, SWITCHYARD_HOME=str(server.home))
    r = subprocess.run(
        [sys.executable, "-m", "app", "ls", "--models-dir", str(server.models_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split()[2] for line in r.stdout.splitlines()[1:] if line.strip()}
    assert rows[VL] == "chat+vision" and rows["tiny"] == "chat"
    assert not any("mmproj" in model for model in rows)


# ---- bad input on the other surfaces: each in its own error shape --------------------------------------
TOO_LARGE = b"\0" * (1 << 20) + PNG
SURFACE_BAD = [
    # (name, image bytes, how many, status, code, words the message must hold)
    ("unsupported_image_type", base64.b64decode(BMP_B64), 1, 400, "convert it to png or jpeg"),
    ("image_too_large", TOO_LARGE, 1, 413, "over the 1 MiB image cap (max_image_mib); send a smaller image"),
    ("too_many_images", PNG, 16, 400, "16 image(s) take 256 tokens (16 each)"),
]
SURFACE_IDS = [b[0] for b in SURFACE_BAD]
MEDIA = {"unsupported_image_type": "image/bmp"}
FIX = {  # what the message tells the client to do, beyond the numbers
    "unsupported_image_type": "convert it to png or jpeg",
    "image_too_large": "send a smaller image",
    "too_many_images": "send at most 15 image(s)",
}


@pytest.fixture(scope="module")
def claude(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def _anthropic_block(data: bytes, media: str = "image/png") -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media, "data": base64.b64encode(data).decode()},
    }


@pytest.mark.parametrize(("code", "data", "count", "status", "words"), SURFACE_BAD, ids=SURFACE_IDS)
def test_anthropic_refusals(
    claude: anthropic.Anthropic, code: str, data: bytes, count: int, status: int, words: str
) -> None:
    blocks: list[Any] = [_anthropic_block(data, MEDIA.get(code, "image/png"))] * count
    with pytest.raises(anthropic.APIStatusError) as e:
        claude.messages.create(
            model=VL,
            max_tokens=1,
            messages=[{"role": "user", "content": [*blocks, {"type": "text", "text": "hi"}]}],
        )
    assert e.value.status_code == status
    doc = e.value.response.json()
    assert doc["type"] == "error" and set(doc["error"]) >= {"type", "message"}
    # Anthropic's own labels: request_too_large for a 413 (as test_limits has it for a body)
    assert doc["error"]["type"] == ("request_too_large" if status == 413 else "invalid_request_error")
    assert words in doc["error"]["message"] and FIX[code] in doc["error"]["message"]


@pytest.mark.parametrize("route", ["chat", "generate"])
@pytest.mark.parametrize(("code", "data", "count", "status", "words"), SURFACE_BAD, ids=SURFACE_IDS)
def test_ollama_refusals(
    server: ServerProcess, route: str, code: str, data: bytes, count: int, status: int, words: str
) -> None:
    client = ollama.Client(host=server.url, timeout=120)
    with pytest.raises(ollama.ResponseError) as e:
        if route == "chat":
            client.chat(model=VL, messages=[{"role": "user", "content": "hi", "images": [data] * count}])
        else:
            client.generate(model=VL, prompt="hi", images=[data] * count)
    assert e.value.status_code == status
    assert words in e.value.error and FIX[code] in e.value.error
    if code != "too_many_images":  # one image's fault: named by Ollama's own field, not the part it became
        assert "images" in e.value.error and "content[" not in e.value.error, e.value.error
    # the raw answer is Ollama's shape: one "error" string
    body = {"model": VL, "stream": False, "images": [base64.b64encode(data).decode()] * count}
    body |= (
        {"messages": [{"role": "user", "content": "hi", "images": body.pop("images")}]}
        if route == "chat"
        else {"prompt": "hi"}
    )
    r = httpx.post(f"{server.url}/api/{route}", json=body, timeout=60)
    assert r.status_code == status and list(r.json()) == ["error"] and words in r.json()["error"]


@pytest.mark.parametrize(("code", "data", "count", "status", "words"), SURFACE_BAD, ids=SURFACE_IDS)
def test_responses_refusals(
    oai: openai.OpenAI, code: str, data: bytes, count: int, status: int, words: str
) -> None:
    url = f"data:{MEDIA.get(code, 'image/png')};base64," + base64.b64encode(data).decode()
    content: Any = [
        {"type": "input_text", "text": "hi"},
        *[{"type": "input_image", "image_url": url}] * count,
    ]
    with pytest.raises(openai.APIStatusError) as e:
        oai.responses.create(model=VL, input=[{"role": "user", "content": content}], max_output_tokens=1)
    assert e.value.status_code == status
    err = e.value.response.json()["error"]
    assert err["code"] == code and err["type"] == "invalid_request_error"
    assert words in err["message"] and FIX[code] in err["message"]


# ---- Anthropic's url image source ------------------------------------------------------------------
class _PngHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def image_url_server() -> Iterator[str]:
    """A real local HTTP server with one PNG (a loopback address: fetching it needs fetch_image_private)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PngHandler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/cat.png"
    finally:
        srv.shutdown()
        srv.server_close()


def _settings(server: ServerProcess, **values: Any) -> None:
    r = httpx.put(server.url + "/api/settings", json=values, timeout=30)
    assert r.status_code == 200, r.text


def test_anthropic_url_source(
    server: ServerProcess, claude: anthropic.Anthropic, image_url_server: str
) -> None:
    block = {"type": "image", "source": {"type": "url", "url": image_url_server}}
    messages: Any = [{"role": "user", "content": [block, {"type": "text", "text": "hi"}]}]
    with pytest.raises(anthropic.BadRequestError) as e:  # off by default: the server fetches nothing
        claude.messages.create(model=VL, max_tokens=1, messages=messages)
    err = e.value.response.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert "fetch_image_urls is off" in err["message"] and "data:image/" in err["message"]
    try:
        _settings(server, fetch_image_urls=True)
        with pytest.raises(anthropic.BadRequestError) as e:  # on, but a loopback address is refused
            claude.messages.create(model=VL, max_tokens=1, messages=messages)
        assert "fetch_image_private" in e.value.response.json()["error"]["message"]
        _settings(server, fetch_image_private=True)
        msg = claude.messages.create(model=VL, max_tokens=1, messages=messages)
        assert msg.type == "message" and msg.usage.input_tokens > IMAGE_TOKENS  # the fetched image was read
    finally:
        _settings(server, fetch_image_urls=False, fetch_image_private=False)
