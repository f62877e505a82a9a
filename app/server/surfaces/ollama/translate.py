"""Ollama's API <-> OpenAI chat/completions/embeddings: requests, streamed answers, model listings.

Ollama names models `name:tag`; a catalog id `tiny` is listed as `tiny:latest`, and both are
accepted. Load-time options (num_ctx, num_gpu, ...) belong to the lane's settings, not a request:
they are ignored and named in the `X-Switchyard-Ignored-Options` header.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from app.chat.deltas import Delta, Finish, Reasoning, Text, ToolCallPart, Usage
from app.core.errors import SwitchyardError
from app.core.settings import Settings
from app.lanes.remote.lane import RemoteLane
from app.library.catalog import ModelEntry
from app.server.surfaces.openai.validate import bad as _bad
from app.server.surfaces.shapes import parse_arguments
from app.server.surfaces.translation import TranslatorDefaults

LATEST = ":latest"
FOREVER = "9999-12-31T23:59:59Z"
_NUM = (int, float)
# Ollama option -> the name llama.cpp's OpenAI endpoint reads it under
_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
    "num_keep": "n_keep",
}
_INT_OPTIONS = {"top_k", "seed", "repeat_last_n", "mirostat", "num_keep", "num_predict"}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class OllamaCall:
    """A validated Ollama chat/generate request and the OpenAI body that carries it."""

    model: str  # the name as the client sent it (echoed back)
    path: str  # the engine route: /v1/chat/completions, or /v1/completions for raw generate
    stream: bool
    keep_alive: float | None  # seconds; 0 unloads after the answer, < 0 keeps forever
    ignored: tuple[str, ...]
    has_images: bool
    openai: dict[str, Any] = field(default_factory=dict)


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


# ---- names ---------------------------------------------------------------------------------------
def ollama_name(model_id: str) -> str:
    """`tiny` -> `tiny:latest`; an id whose last segment already has a tag is kept."""
    return model_id if ":" in model_id.rsplit("/", 1)[-1] else model_id + LATEST


def candidate_ids(name: str) -> list[str]:
    """Catalog ids to try for an Ollama name, exact first."""
    return [name, name[: -len(LATEST)]] if name.endswith(LATEST) and len(name) > len(LATEST) else [name]


# ---- request fields ------------------------------------------------------------------------------
def require_model(body: dict[str, Any]) -> str:
    model = body.get("model", body.get("name"))  # older clients send "name"
    if not isinstance(model, str) or not model.strip():
        raise _bad("missing required field 'model' (a model name from GET /api/tags)", "model")
    return model


def stream_flag(body: dict[str, Any]) -> bool:
    """Ollama streams unless told `"stream": false`."""
    v = body.get("stream")
    if v is None:
        return True
    if not isinstance(v, bool):
        raise _bad(f"field 'stream' must be true or false, got {type(v).__name__}", "stream")
    return v


def parse_keep_alive(value: Any) -> float | None:
    """Seconds from a number (seconds) or a Go duration ("5m", "1h30m", "-1"); negative: forever."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise _bad("'keep_alive' must be a number of seconds or a duration like \"5m\"", "keep_alive")
    if isinstance(value, _NUM):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        if body and _DURATION.sub("", body) == "":
            return sign * sum(float(n) * _UNIT_S[u] for n, u in _DURATION.findall(body))
    raise _bad(
        f'\'keep_alive\' {value!r} is not a duration; use seconds or e.g. "5m", "1h", "-1"', "keep_alive"
    )


def map_options(options: Any) -> tuple[dict[str, Any], list[str]]:
    """(fields for the OpenAI body, option names that were ignored)."""
    if options is None:
        return {}, []
    if not isinstance(options, dict):
        raise _bad("field 'options' must be an object", "options")
    out: dict[str, Any] = {}
    ignored: list[str] = []
    for name, value in options.items():
        if value is None:
            continue
        w = f"options.{name}"
        if name in _SAMPLING or name == "num_predict":
            ok = isinstance(value, int if name in _INT_OPTIONS else _NUM) and not isinstance(value, bool)
            if not ok:
                kind = "an integer" if name in _INT_OPTIONS else "a number"
                raise _bad(f"{w} must be {kind}, got {type(value).__name__}", w)
            if name == "num_predict":
                if value > 0:  # -1 (no limit) and -2 (fill the context) leave the engine's limit
                    out["max_tokens"] = value
            else:
                out[_SAMPLING[name]] = value
        elif name == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise _bad(f"{w} must be a list of strings", w)
            if stops:
                out["stop"] = stops
        elif name == "grammar":  # llama.cpp's GBNF extension (not an Ollama option)
            if not isinstance(value, str):
                raise _bad(f"{w} must be a string (a llama.cpp GBNF grammar)", w)
            out["grammar"] = value
        else:
            ignored.append(name)  # num_ctx, num_gpu, num_thread, ...: set per lane, not per request
    return out, ignored


def map_format(fmt: Any) -> dict[str, Any] | None:
    """Ollama `format` as an OpenAI response_format: "json" or a JSON schema."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt, "strict": True}}
    raise _bad("field 'format' must be \"json\" or a JSON schema object", "format")


def _think(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return {"enable_thinking": value}
    if isinstance(value, str) and value in ("low", "medium", "high"):
        return {"enable_thinking": True, "reasoning_effort": value}
    raise _bad('field \'think\' must be true, false, "low", "medium" or "high"', "think")


def _images(value: Any, where: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(f"{where}.images must be a list of base64 strings", f"{where}.images")
    return [{"type": "image_url", "image_url": {"url": _data_url(v)}} for v in value]


def _data_url(b64: str) -> str:
    if b64.startswith("data:"):
        return b64
    kind = (
        "png"
        if b64.startswith("iVBOR")
        else "jpeg"
        if b64.startswith("/9j/")
        else "webp"
        if b64.startswith("UklG")
        else "png"
    )
    return f"data:image/{kind};base64,{b64}"


def _user_content(text: str, images: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    return [*([{"type": "text", "text": text}] if text else []), *images] if images else text


def chat_messages(messages: Any) -> tuple[list[dict[str, Any]], bool]:
    """(OpenAI messages, whether any carries an image). Tool calls get ids; tool answers find them."""
    if not isinstance(messages, list):
        raise _bad("field 'messages' must be a list of message objects", "messages")
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (id, function name) of calls not answered yet
    images = False
    for i, m in enumerate(messages):
        w = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"{w} must be an object with a string 'role'", w)
        role, content = m["role"], m.get("content") or ""
        if not isinstance(content, str):
            raise _bad(f"{w}.content must be a string", f"{w}.content")
        parts = _images(m.get("images"), w)
        images = images or bool(parts)
        if role == "assistant" and m.get("tool_calls"):
            calls = _tool_calls(m["tool_calls"], i, w)
            pending = [(c["id"], c["function"]["name"]) for c in calls]
            out.append({"role": "assistant", "content": content or None, "tool_calls": calls})
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": _answer_id(m, pending, i), "content": content})
        else:
            out.append({"role": role, "content": _user_content(content, parts)})
    return out, images


def _tool_calls(calls: Any, i: int, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise _bad(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"{where}.tool_calls[{j}] needs a function with a 'name'", f"{where}.tool_calls[{j}]")
        args = fn.get("arguments", {})
        text = args if isinstance(args, str) else json.dumps(args)
        cid = call.get("id") if isinstance(call.get("id"), str) else f"call_{i}_{j}"
        out.append({"id": cid, "type": "function", "function": {"name": fn["name"], "arguments": text}})
    return out


def _answer_id(m: dict[str, Any], pending: list[tuple[str, str]], i: int) -> str:
    """The id of the call a tool message answers: its own, else by tool_name, else the oldest open one."""
    if isinstance(m.get("tool_call_id"), str):
        return str(m["tool_call_id"])
    name = m.get("tool_name") or m.get("name")
    for k, (cid, fname) in enumerate(pending):
        if name is None or fname == name:
            del pending[k]
            return cid
    return f"call_{i}"


def _common(body: dict[str, Any], out: dict[str, Any]) -> tuple[list[str], float | None]:
    opts, ignored = map_options(body.get("options"))
    out.update(opts)
    fmt = map_format(body.get("format"))
    if fmt is not None:
        out["response_format"] = fmt
    think = _think(body.get("think"))
    if think is not None:
        out["chat_template_kwargs"] = think
    if isinstance(body.get("grammar"), str):  # top-level too, like the OpenAI and Anthropic routes
        out["grammar"] = body["grammar"]
    out["stream"] = True
    out["stream_options"] = {"include_usage": True}
    return ignored, parse_keep_alive(body.get("keep_alive"))


def chat_request(body: dict[str, Any]) -> OllamaCall:
    model = require_model(body)
    stream = stream_flag(body)
    messages, images = chat_messages(body.get("messages") or [])
    out: dict[str, Any] = {"model": model, "messages": messages}
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise _bad("field 'tools' must be a list of tool objects", "tools")
        out["tools"] = [t if "type" in t else {"type": "function", **t} for t in tools]
        for i, tool in enumerate(out["tools"]):
            fn = tool.get("function")
            if (
                tool.get("type") != "function"
                or not isinstance(fn, dict)
                or not isinstance(fn.get("name"), str)
            ):
                # llama.cpp answers 500 to a tool it cannot parse: say what the shape is instead
                raise _bad(
                    f'tools[{i}] must be {{"type": "function", "function": {{"name": "...", "parameters": '
                    "{...}}}",
                    f"tools[{i}]",
                )
    ignored, keep = _common(body, out)
    return OllamaCall(model, "/v1/chat/completions", stream, keep, tuple(ignored), images, out)


def generate_request(body: dict[str, Any]) -> OllamaCall:
    model = require_model(body)
    stream = stream_flag(body)
    prompt = body.get("prompt") or ""
    system = body.get("system")
    if not isinstance(prompt, str):
        raise _bad("field 'prompt' must be a string", "prompt")
    if system is not None and not isinstance(system, str):
        raise _bad("field 'system' must be a string", "system")
    for name in ("suffix", "template"):
        if body.get(name):
            raise _bad(f"field {name!r} is not supported here; the model's own chat template is used", name)
    parts = _images(body.get("images"), "request")
    if body.get("raw") is True:
        if parts:
            raise _bad("images cannot be sent with raw: true", "images")
        out: dict[str, Any] = {"model": model, "prompt": prompt}
        path = "/v1/completions"
    else:
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": _user_content(prompt, parts)})
        out = {"model": model, "messages": messages}
        path = "/v1/chat/completions"
    ignored, keep = _common(body, out)
    return OllamaCall(model, path, stream, keep, tuple(ignored), bool(parts), out)


def embed_inputs(body: dict[str, Any]) -> list[str]:
    value = body.get("input")
    inputs = [value] if isinstance(value, str) else value
    if not isinstance(inputs, list) or not inputs or not all(isinstance(s, str) for s in inputs):
        raise _bad("field 'input' must be a string or a non-empty list of strings", "input")
    return inputs


def shorten(vector: Sequence[float], dimensions: int | None) -> list[float]:
    """The first `dimensions` values, scaled back to unit length (as Ollama does)."""
    if dimensions is None or dimensions >= len(vector):
        return list(vector)
    if dimensions < 1:
        raise _bad("'dimensions' must be a positive integer", "dimensions")
    head = list(vector[:dimensions])
    norm = sum(x * x for x in head) ** 0.5
    return [x / norm for x in head] if norm else head


# ---- answers -------------------------------------------------------------------------------------
class OllamaTranslator(TranslatorDefaults):
    """OpenAI chunks in, Ollama NDJSON objects out (`chat` or `generate` shape); `whole()` aggregates."""

    def __init__(self, *, model: str, kind: str, started: float) -> None:
        self.model = model
        self.kind = kind
        self.started = started  # time.perf_counter() at the request's arrival
        self.load_s = 0.0
        self.text: list[str] = []
        self.thinking: list[str] = []
        self._calls: dict[int, dict[str, str]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.timings: dict[str, Any] = {}

    def _piece(self, text: str, thinking: str) -> dict[str, Any]:
        if self.kind == "chat":
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                msg["thinking"] = thinking
            return {"model": self.model, "created_at": now_iso(), "message": msg, "done": False}
        out: dict[str, Any] = {"model": self.model, "created_at": now_iso(), "response": text, "done": False}
        if thinking:
            out["thinking"] = thinking
        return out

    def waiting(self) -> list[dict[str, Any]]:
        """An empty piece: NDJSON has no comments, so this is what a stream hears while its model loads
        (Ollama clients append the empty text and read on)."""
        return [self._piece("", "")]

    def feed(self, delta: Delta) -> list[dict[str, Any]]:
        match delta:
            case Text(text):
                self.text.append(text)
                return [self._piece(text, "")]
            case Reasoning(text):
                self.thinking.append(text)
                return [self._piece("", text)]
            case ToolCallPart():
                slot = self._calls.setdefault(delta.index, {"name": "", "arguments": ""})
                slot["name"] += delta.name
                slot["arguments"] += delta.arguments
            case Finish(reason):
                self.finish_reason = reason
            case Usage():
                if delta.prompt_tokens is not None:
                    self.usage["prompt_tokens"] = delta.prompt_tokens
                if delta.completion_tokens is not None:
                    self.usage["completion_tokens"] = delta.completion_tokens
                if delta.timings is not None:
                    self.timings = delta.timings
        return []

    def tool_calls(self) -> list[dict[str, Any]]:
        return [
            {"function": {"name": c["name"], "arguments": parse_arguments(c["arguments"])}}
            for _, c in sorted(self._calls.items())
        ]

    def stats(self) -> dict[str, Any]:
        ns = 1_000_000
        out: dict[str, Any] = {
            "done": True,
            # content_filter: the safety policy cut the answer (app/server/gateway/safety_gate.py)
            "done_reason": r if (r := self.finish_reason) in ("length", "content_filter") else "stop",
            "total_duration": int((time.perf_counter() - self.started) * 1e9),
            "load_duration": int(self.load_s * 1e9),
        }
        if isinstance(self.usage.get("prompt_tokens"), int):
            out["prompt_eval_count"] = self.usage["prompt_tokens"]
        if isinstance(self.timings.get("prompt_ms"), _NUM):
            out["prompt_eval_duration"] = int(self.timings["prompt_ms"] * ns)
        if isinstance(self.usage.get("completion_tokens"), int):
            out["eval_count"] = self.usage["completion_tokens"]
        if isinstance(self.timings.get("predicted_ms"), _NUM):
            out["eval_duration"] = int(self.timings["predicted_ms"] * ns)
        return out

    def final(self) -> list[dict[str, Any]]:
        """The closing objects of a stream: the tool calls (if any), then `done: true` with the stats."""
        out = []
        if self._calls and self.kind == "chat":
            msg = {"role": "assistant", "content": "", "tool_calls": self.tool_calls()}
            out.append({"model": self.model, "created_at": now_iso(), "message": msg, "done": False})
        last = self._piece("", "")
        last.update(self.stats())
        return [*out, last]

    def whole(self) -> dict[str, Any]:
        """The non-streaming answer: everything at once."""
        text, think = "".join(self.text), "".join(self.thinking)
        out = self._piece(text, think)
        if self._calls and self.kind == "chat":
            out["message"]["tool_calls"] = self.tool_calls()
        out.update(self.stats())
        return out

    # ---- as the runner drives it (app/server/surfaces/translation.py Translator) ---------------------
    def finish(self) -> list[dict[str, Any]]:
        return self.final()

    def fail(self, exc: SwitchyardError) -> list[dict[str, Any]]:
        return [{"error": exc.message}]

    def counts(self) -> tuple[int, int] | None:
        prompt, completion = self.usage.get("prompt_tokens"), self.usage.get("completion_tokens")
        return (prompt, completion) if isinstance(prompt, int) and isinstance(completion, int) else None

    def prompt_counted(self, tokens: int) -> None:
        self.usage["prompt_tokens"] = tokens

    def loaded(self, seconds: float) -> None:
        self.load_s = seconds


# ---- listings ------------------------------------------------------------------------------------
def digest(entry: ModelEntry) -> str:
    """An identity digest of (path, size, mtime), not the file's sha256 (too slow to hash per listing)."""
    try:
        st = entry.path.stat()
        key = f"{entry.path}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        key = str(entry.path)
    return hashlib.sha256(key.encode()).hexdigest()


def details(entry: ModelEntry) -> dict[str, Any]:
    facts = entry.facts
    arch = facts.architecture if facts else ""
    return {
        "parent_model": "",
        "format": entry.format,
        "family": arch,
        "families": [arch] if arch else None,
        "parameter_size": "",
        "quantization_level": (facts.file_type or "").upper() if facts else "",
    }


def _mtime(entry: ModelEntry) -> str:
    try:
        return iso(entry.path.stat().st_mtime)
    except OSError:
        return now_iso()


def tag(entry: ModelEntry) -> dict[str, Any]:
    name = ollama_name(entry.id)
    size = entry.facts.file_bytes if entry.facts else sum(f.size for f in entry.files)
    return {
        "name": name,
        "model": name,
        "modified_at": _mtime(entry),
        "size": size,
        "digest": digest(entry),
        "details": details(entry),
    }


def remote_tag(m: dict[str, str]) -> dict[str, Any]:
    """An /api/tags row for a remote model (`NAME/MODEL`): no file here, so no size and no mtime."""
    name = ollama_name(m["id"])
    return {
        "name": name,
        "model": name,
        "modified_at": "1970-01-01T00:00:00Z",
        "size": 0,
        "digest": hashlib.sha256(f"remote:{m['id']}".encode()).hexdigest(),
        "details": {
            "parent_model": "",
            "format": "remote",
            "family": "",
            "families": None,
            "parameter_size": "",
            "quantization_level": "",
        },
    }


# size_vram is this machine's GPU memory: a split's workers ("RPC0[127.0.0.1:PORT]") hold theirs elsewhere
_THIS_GPU = re.compile(r"GPU\d+$")


def running(entry: ModelEntry, snapshot: dict[str, Any], *, ttl_s: float) -> dict[str, Any]:
    """An /api/ps row from a ready lane's snapshot: measured memory where the engine reported it."""
    measured, predicted = snapshot.get("measured"), snapshot.get("predicted")
    size = vram = 0
    if measured and measured.get("devices"):
        for dev, parts in measured["devices"].items():
            total = sum(int(v) for v in parts.values())
            size += total
            vram += total if _THIS_GPU.match(dev) else 0
    elif predicted:
        for d in predicted.get("devices", ()):
            size += int(d["total"])
            vram += int(d["total"]) if _THIS_GPU.match(d["device"]) else 0
    params = snapshot.get("params") or {}
    last = snapshot.get("last_used") or time.time()
    row = tag(entry)
    row.pop("modified_at")
    row.update(
        size=size,
        size_vram=vram,
        expires_at=iso(last + ttl_s) if ttl_s > 0 else FOREVER,
        context_length=int(params["ctx_size"]) // max(1, int(params.get("parallel") or 1))
        if params
        else None,
    )
    return row


def show(entry: ModelEntry, settings: Settings | None = None) -> dict[str, Any]:
    """/api/show for a local GGUF; with `settings`, "vision" follows the model's `mmproj` override."""
    facts = entry.facts
    assert facts is not None
    arch = facts.architecture
    info: dict[str, Any] = {
        "general.architecture": arch,
        "general.name": facts.name,
        "general.file_type": facts.file_type,
    }
    for key, value in (
        ("context_length", facts.context_length),
        ("embedding_length", facts.embedding_length),
        ("block_count", facts.block_count),
        ("attention.head_count", facts.head_count),
        ("attention.head_count_kv", facts.head_count_kv),
        ("pooling_type", facts.pooling_type),
    ):
        if value is not None:
            info[f"{arch}.{key}"] = value
    template = facts.chat_template or ""
    caps = ["embedding"] if entry.kind == "embedding" else ["completion"]
    if entry.kind == "chat" and "tools" in template:
        caps.append("tools")
    if entry.projector(settings) is not None:  # a vision projector loads with it (its override followed)
        caps.append("vision")
    return {
        "modelfile": f"# served by Switchyard from {entry.path}\nFROM {entry.path}\n",
        "parameters": "",
        "template": template,
        "details": details(entry),
        "model_info": info,
        "capabilities": caps,
        "modified_at": _mtime(entry),
    }


def remote_show(lane: RemoteLane) -> dict[str, Any]:
    """/api/show for a remote model: what is known here (its remote, the remote's name for it, its kind
    when the remote said). There is no file here, so the template, parameters, family and size are left
    out rather than guessed; "tools" is not claimed either, since the remote's template is unknown."""
    kind = lane.kind
    info: dict[str, Any] = {"general.name": lane.served_name, "switchyard.remote": lane.remote.name}
    if kind is not None:
        info["switchyard.kind"] = kind
    caps = {"chat": ["completion"], None: ["completion"], "embedding": ["embedding"]}.get(kind, [])
    return {
        "modelfile": f"# served by Switchyard from remote {lane.remote.name}, as {lane.served_name}\n",
        "details": {"format": "remote"},
        "model_info": info,
        "capabilities": caps,
    }
