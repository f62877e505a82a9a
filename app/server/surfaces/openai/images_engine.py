"""OpenAI's images API onto stable-diffusion.cpp's sd-server, and its answers back.

sd-server serves `POST /v1/images/generations` in OpenAI's shape but reads only prompt, n, size,
output_format and output_compression; sampling controls go in a `<sd_cpp_extra_args>{json}
</sd_cpp_extra_args>` block inside the prompt, and its errors are `{"error": "text"}`. The gateway takes the
extras as plain fields (`steps`, `cfg_scale`, `seed`, `negative_prompt`, `sampler`), checks everything
once, embeds the block, and re-wraps the answer and the errors in OpenAI's shapes. A remote lane gets the
client's body untouched (it speaks the API itself).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from app.core.errors import BadRequestError

EXTRA_TAG = "<sd_cpp_extra_args>"
MAX_SIDE = 4096
MAX_N = 10
OUTPUT_FORMATS = ("png", "jpeg", "webp")
_SIZE_RE = re.compile(r"(\d{1,5})x(\d{1,5})")


@dataclass(frozen=True)
class ImageRequest:
    model: str
    prompt: str
    n: int = 1
    size: tuple[int, int] | None = None  # None: the engine's default (512x512 unless set at start)
    output_format: str = "png"
    output_compression: int | None = None
    steps: int | None = None
    cfg_scale: float | None = None
    seed: int | None = None
    negative_prompt: str | None = None
    sampler: str | None = None

    @property
    def has_extras(self) -> bool:
        return any(
            v is not None for v in (self.steps, self.cfg_scale, self.seed, self.negative_prompt, self.sampler)
        )


def _int(body: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequestError(f"'{key}' must be an integer from {lo} to {hi}", param=key)
    return value


def _size(value: Any) -> tuple[int, int] | None:
    if value is None or value == "auto":
        return None
    m = _SIZE_RE.fullmatch(value) if isinstance(value, str) else None
    if m is None or not all(64 <= int(v) <= MAX_SIDE for v in m.groups()):
        raise BadRequestError(
            f"'size' must be WIDTHxHEIGHT with each side from 64 to {MAX_SIDE} (e.g. 512x512), or 'auto'",
            param="size",
        )
    return int(m[1]), int(m[2])


def parse_image_request(body: dict[str, Any], *, model: str) -> ImageRequest:
    """The checked request; raises BadRequestError naming the field and what it must be."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadRequestError("missing required field 'prompt' (what to draw)", param="prompt")
    fmt = body.get("response_format", "b64_json")
    if fmt not in ("b64_json", None):
        raise BadRequestError(
            "response_format 'url' is not offered: images come back inline; send response_format "
            "'b64_json' (or leave it out)",
            param="response_format",
        )
    out = body.get("output_format", "png")
    if out not in OUTPUT_FORMATS:
        raise BadRequestError(
            f"'output_format' must be one of {', '.join(OUTPUT_FORMATS)}", param="output_format"
        )
    cfg = body.get("cfg_scale")
    if cfg is not None and (not isinstance(cfg, int | float) or isinstance(cfg, bool) or not 0 <= cfg <= 50):
        raise BadRequestError("'cfg_scale' must be a number from 0 to 50", param="cfg_scale")
    for key in ("negative_prompt", "sampler"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise BadRequestError(f"'{key}' must be a string", param=key)
    req = ImageRequest(
        model=model,
        prompt=prompt,
        n=_int(body, "n", 1, MAX_N) or 1,
        size=_size(body.get("size")),
        output_format=out,
        output_compression=_int(body, "output_compression", 0, 100),
        steps=_int(body, "steps", 1, 150),
        cfg_scale=float(cfg) if cfg is not None else None,
        seed=_int(body, "seed", -1, 2**63 - 1),
        negative_prompt=body.get("negative_prompt"),
        sampler=body.get("sampler"),
    )
    if EXTRA_TAG in prompt and req.has_extras:
        raise BadRequestError(
            f"the prompt carries its own {EXTRA_TAG} block and the request sets steps/cfg_scale/seed/"
            "negative_prompt/sampler too; use one or the other",
            param="prompt",
        )
    return req


def extra_args(req: ImageRequest) -> dict[str, Any]:
    """The sd.cpp native fields for the request's extras (the sdcpp API's request schema)."""
    out: dict[str, Any] = {}
    sample: dict[str, Any] = {}
    if req.seed is not None:
        out["seed"] = req.seed
    if req.negative_prompt is not None:
        out["negative_prompt"] = req.negative_prompt
    if req.steps is not None:
        sample["sample_steps"] = req.steps
    if req.sampler is not None:
        sample["sample_method"] = req.sampler
    if req.cfg_scale is not None:
        sample["guidance"] = {"txt_cfg": req.cfg_scale}
    if sample:
        out["sample_params"] = sample
    return out


def to_sdcpp(req: ImageRequest) -> bytes:
    """The body sd-server's /v1/images/generations reads."""
    prompt = req.prompt
    if extras := extra_args(req):
        prompt = f"{prompt} {EXTRA_TAG}{json.dumps(extras)}</sd_cpp_extra_args>"
    body: dict[str, Any] = {"prompt": prompt, "n": req.n, "output_format": req.output_format}
    if req.size is not None:
        body["size"] = f"{req.size[0]}x{req.size[1]}"
    if req.output_compression is not None:
        body["output_compression"] = req.output_compression
    return json.dumps(body).encode()


def _error(status: int, message: str, *, code: str) -> web.Response:
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error" if status < 500 else "engine_error",
            "param": None,
            "code": code,
            "source": "engine",
        }
    }
    return web.json_response(body, status=status)


def from_sdcpp(status: int, data: bytes, *, model: str) -> web.Response:
    """sd-server's answer as OpenAI's: `{"created", "data": [{"b64_json"}]}`; its errors in our envelope."""
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    if status >= 400:
        detail = data.decode("utf-8", "replace").strip()[:500] or f"HTTP {status}"
        if isinstance(doc, dict):
            detail = str(doc.get("message") or doc.get("error") or detail)
        return _error(
            status,
            f"stable-diffusion.cpp refused the request for {model!r}: {detail}",
            code=f"engine_http_{status}",
        )
    items = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) and "b64_json" in i for i in items):
        return _error(
            502, f"stable-diffusion.cpp answered for {model!r} without images", code="engine_bad_answer"
        )
    out: dict[str, Any] = {
        "created": int(doc.get("created") or 0),
        "data": [{"b64_json": i["b64_json"]} for i in items],
    }
    if isinstance(doc.get("output_format"), str):
        out["output_format"] = doc["output_format"]
    return web.json_response(out)
