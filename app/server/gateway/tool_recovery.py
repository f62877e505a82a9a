"""Tool calls an engine reported but did not send: recovered from the text, or a clear error.

mlx-lm can end an answer with `finish_reason: "tool_calls"` while the message has no `tool_calls` and the
call's text is lost or left in `content` (ml-explore/mlx-lm#1957). A client would then get an empty
reply. Here the call is read back from the text when the model's call markers are in it (Hermes/Qwen
`<tool_call>{json}</tool_call>`, Mistral `[TOOL_CALLS][...]`, Llama 3 `<|python_tag|>{json}`, or a bare
`{"name", "arguments"}` object), else the answer is an error naming the upstream issue.

`ToolCallRecovery` works on a stream of deltas (the translated surfaces, through `RecoveringRun`, which
the request runner wraps around every translation); `StreamRecovery` on the OpenAI pass-through's event
stream (app/server/gateway/relay.py), for a request with tools to an engine other than llama.cpp;
`recover_answer` on a whole OpenAI chat answer.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from app.chat.deltas import Delta, Finish, Text, ToolCallPart
from app.core import tracing
from app.core.errors import SwitchyardError, UpstreamRefusedError
from app.lanes.lane_requests import speaks_llama_server
from app.server.gateway.forced_call import unreadable_call_error
from app.server.surfaces.translation import Translation

MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")
# the first characters of the markers: a text without any of them can neither hold nor begin one
_MARKER_START = frozenset(m[0] for m in MARKERS)
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def lost_call_error(model: str) -> UpstreamRefusedError:
    return UpstreamRefusedError(
        f'the engine for {model!r} ended its answer with finish_reason "tool_calls" but sent no tool call, '
        "and its text holds none to recover (a known mlx-lm defect: ml-explore/mlx-lm#1957); retry the "
        "request, or serve this model from a GGUF build on llama.cpp for tool use",
        status=502,
        source="engine",
        code="tool_calls_lost",
    )


def parse_calls(text: str) -> tuple[list[dict[str, Any]], str]:
    """The calls written in `text` as OpenAI tool calls, and the text left around them."""
    start = min((i for m in MARKERS if (i := text.find(m)) >= 0), default=-1)
    head, tail = (text[:start], text[start:]) if start >= 0 else ("", text.strip())
    if tail.startswith("<tool_call>"):
        objs = [_json(m) for m in _HERMES.findall(tail)]
    elif tail.startswith("[TOOL_CALLS]"):
        found = _json(tail.removeprefix("[TOOL_CALLS]").strip())
        objs = found if isinstance(found, list) else [found]
    else:  # Llama 3's python tag, or a bare call object as the whole text
        found = _json(tail.removeprefix("<|python_tag|>").strip())
        objs = found if isinstance(found, list) else [found]
    calls = [c for o in objs if (c := _call(o)) is not None]
    return calls, (head.strip() if calls else text)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args)},
    }


class ToolCallRecovery:
    """Deltas in, deltas out: text from a call marker on is held back until the finish says whether the
    engine sent the call itself; a "tool_calls" finish without any call gets the calls parsed from it."""

    def __init__(self, model: str, *, forced: bool = False) -> None:
        self.model = model
        self.held = ""  # text from a call marker (or a marker's possible start) on
        self._texts: list[str] = []  # all text, for a bare call object (joined only at a tool_calls finish)
        self.sent_call = False
        # the whole answer is a call's JSON (forced_call.py): held entirely, read at any finish
        self.forced = forced

    def feed(self, delta: Delta) -> list[Delta]:
        """Raises the lost-call error (UpstreamRefusedError) for a call that cannot be recovered."""
        if self.forced and not self.sent_call:
            return self._forced(delta)
        match delta:
            case Text(text=text) if not self.sent_call:
                self._texts.append(text)
                if text and not self.held and _MARKER_START.isdisjoint(text):
                    return [delta]  # the common piece: no marker can begin in it, passed on as it came
                return self._text(text)
            case ToolCallPart():
                self.sent_call = True
                return [*self.release(), delta]
            case Finish(reason="tool_calls") if not self.sent_call:
                calls, rest = parse_calls(self.held or "".join(self._texts))
                if not calls:
                    raise lost_call_error(self.model)
                parts: list[Delta] = [Text(rest)] if rest and self.held else []
                parts += [_part(i, c) for i, c in enumerate(calls)]
                self.held, self.sent_call = "", True
                return [*parts, delta]
            case Finish():
                return [*self.release(), delta]
        return [delta]

    def _forced(self, delta: Delta) -> list[Delta]:
        match delta:
            case Text(text=text):
                self.held += text
                return []
            case ToolCallPart():
                self.sent_call = True
                return [delta]
            case Finish(reason=reason):
                calls, _ = parse_calls(self.held)
                if not calls:
                    raise unreadable_call_error(self.model, finish=reason)
                self.held, self.sent_call = "", True
                return [*(_part(i, c) for i, c in enumerate(calls)), Finish("tool_calls")]
        return [delta]

    def release(self) -> list[Delta]:
        """What is held, as the text it was (the stream ended, or the engine sent its calls itself)."""
        held, self.held = self.held, ""
        return [Text(held)] if held else []

    def _text(self, text: str) -> list[Delta]:
        buf = self.held + text
        if any(m in buf for m in MARKERS) and not self.held.startswith(MARKERS):
            i = min(buf.find(m) for m in MARKERS if m in buf)
            self.held = buf[i:]
            return [Text(buf[:i])] if i else []
        if self.held.startswith(MARKERS):
            self.held = buf
            return []
        # a marker may be split across chunks: hold a tail that could begin one
        keep = max((n for m in MARKERS for n in range(1, len(m)) if buf.endswith(m[:n])), default=0)
        self.held = buf[len(buf) - keep :] if keep else ""
        out = buf[: len(buf) - keep]
        return [Text(out)] if out else []


def _part(index: int, call: dict[str, Any]) -> ToolCallPart:
    fn = call["function"]
    return ToolCallPart(index=index, id=call["id"], name=fn["name"], arguments=fn["arguments"])


class RecoveringRun:
    """A Translation with ToolCallRecovery in front of its deltas. A lost call fails the answer once: in
    the stream as the surface's error event, or (a whole answer) raised from `whole()`."""

    def __init__(self, inner: Translation, *, model: str) -> None:
        self.inner = inner
        self.recovery = ToolCallRecovery(model)
        self.error: SwitchyardError | None = None

    @property
    def stopped(self) -> bool:
        return self.error is not None or self.inner.stopped

    def waiting(self, phase: str, seconds: float) -> bytes:
        return self.inner.waiting(phase, seconds)

    def opening(self) -> bytes:
        return self.inner.opening()

    def pending_opening(self) -> bytes:
        return self.inner.pending_opening()

    def feed(self, delta: Delta) -> bytes:
        if self.error is not None:
            return b""
        try:
            deltas = self.recovery.feed(delta)
        except SwitchyardError as exc:  # never raised here: a protocol callback may be feeding us
            self.error = exc
            return self.inner.failed(exc)
        if len(deltas) == 1:  # the common case, without a generator per event
            return self.inner.feed(deltas[0])
        return b"".join(self.inner.feed(d) for d in deltas)

    def closing(self) -> bytes:
        if self.error is not None:
            return b""
        held = b"".join(self.inner.feed(d) for d in self.recovery.release())
        return held + self.inner.closing()

    def failed(self, exc: SwitchyardError) -> bytes:
        return self.inner.failed(exc)

    def whole(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        for d in self.recovery.release():
            self.inner.feed(d)
        return self.inner.whole()

    def usage(self) -> tuple[int, int] | None:
        return self.inner.usage()

    def wants_prompt_count(self) -> bool:
        return self.inner.wants_prompt_count()

    def prompt_counted(self, tokens: int) -> None:
        self.inner.prompt_counted(tokens)

    def loaded(self, seconds: float) -> None:
        self.inner.loaded(seconds)


def stream_needs_recovery(body: dict[str, Any], *, engine: str) -> bool:
    """Whether an OpenAI chat stream is read for lost calls (`StreamRecovery`): it offers tools, and its
    engine is not llama.cpp, whose own parser sends the calls it reports (its streams stay byte-relayed)."""
    tools = body.get("tools")
    return isinstance(tools, list) and bool(tools) and not speaks_llama_server(engine)


class StreamRecovery:
    """The OpenAI pass-through's event stream with ToolCallRecovery in it: bytes in, bytes out.

    Events pass as they came, except where the recovery acts: content from a call marker on is held back
    (the event goes on without it), and a "tool_calls" finish without any call gets a tool_calls delta built
    from the held text before it, or the lost-call error event in its place (nothing more follows)."""

    def __init__(self, model: str, *, forced: bool = False) -> None:
        self.recovery = ToolCallRecovery(model, forced=forced)
        self.buf = b""
        # the stream's id, model and created, for the events added to it
        self.envelope: dict[str, Any] = {"object": "chat.completion.chunk"}
        self.failed = False

    def feed(self, data: bytes) -> bytes:
        self.buf += data.replace(b"\r\n", b"\n")
        out: list[bytes] = []
        while (end := self.buf.find(b"\n\n")) >= 0:
            event, self.buf = self.buf[: end + 2], self.buf[end + 2 :]
            out.append(self._event(event))
        return b"".join(out)

    def close(self) -> bytes:
        """The end of the upstream's stream: a last event without its blank line, and any held text."""
        rest, self.buf = self.buf, b""
        out = self._event(rest + b"\n\n") if rest.strip() else b""
        return out + (b"" if self.failed else self._emit(self.recovery.release()))

    def _event(self, event: bytes) -> bytes:
        if self.failed:
            return b""
        chunk = _chunk_of(event)
        choices = chunk.get("choices") if chunk is not None else None
        if (
            chunk is None
            or not isinstance(choices, list)
            or len(choices) != 1
            or not isinstance(choices[0], dict)
        ):
            return event  # a comment, [DONE], a usage or error event, several choices: as they came
        self.envelope = {k: v for k, v in chunk.items() if k in ("id", "object", "created", "model")}
        choice = choices[0]
        found = choice.get("delta")
        delta: dict[str, Any] = found if isinstance(found, dict) else {}
        try:
            before, kept = self._content(delta)
            finish = choice.get("finish_reason")
            if isinstance(finish, str):
                ended = self.recovery.feed(Finish(finish))
                before += [d for d in ended if not isinstance(d, Finish)]
                # a forced call's answer ends as the call it is ("tool_calls"), whatever the engine said
                reason = next((d.reason for d in ended if isinstance(d, Finish)), finish)
                if reason != finish:
                    choice["finish_reason"] = reason
        except SwitchyardError as exc:
            self.failed = True
            tracing.fail_current(exc.message)
            return f"data: {json.dumps(exc.envelope())}\n\n".encode()
        renamed = choice.get("finish_reason") != finish
        if not before and kept == delta.get("content") and not renamed:
            return event  # untouched: passed on as it came
        others = set(delta) - {"content"}  # the role too: a stream's first event must keep it
        if kept is None and not others and choice.get("finish_reason") is None and not chunk.get("usage"):
            return self._emit(before)  # only held text was in it
        if kept is not None or "content" in delta or renamed:
            choice["delta"] = {**delta, "content": kept} if kept is not None else _without(delta, "content")
            event = f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()
        return self._emit(before) + event

    def _content(self, delta: dict[str, Any]) -> tuple[list[Delta], str | None]:
        """(what goes out before this event, this event's content now: None when all of it is held)."""
        if delta.get("tool_calls"):  # the engine sent a call itself: nothing more is held
            return self.recovery.feed(ToolCallPart(index=0, id=None, name="", arguments=""))[:-1], None
        text = delta.get("content")
        if not isinstance(text, str) or not text:
            return [], text if isinstance(text, str) else None
        out = self.recovery.feed(Text(text))
        return [], "".join(d.text for d in out if isinstance(d, Text)) or None

    def _emit(self, deltas: list[Delta]) -> bytes:
        out = b""
        text = "".join(d.text for d in deltas if isinstance(d, Text))
        if text:
            out += self._added({"content": text})
        calls = [d for d in deltas if isinstance(d, ToolCallPart)]
        if calls:
            out += self._added({"tool_calls": [_call_delta(c) for c in calls]})
        return out

    def _added(self, delta: dict[str, Any]) -> bytes:
        chunk = {**self.envelope, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()


def _chunk_of(event: bytes) -> dict[str, Any] | None:
    """The JSON object of an event that is one `data:` line, else None."""
    line = event.strip()
    if not line.startswith(b"data:") or b"\n" in line:
        return None
    found = _json(line[5:].decode("utf-8", "replace").strip())
    return found if isinstance(found, dict) else None


def _without(delta: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in delta.items() if k != key}


def _call_delta(part: ToolCallPart) -> dict[str, Any]:
    fn = {"name": part.name, "arguments": part.arguments}
    return {"index": part.index, "id": part.id, "type": "function", "function": fn}


def recover_answer(data: bytes, *, model: str, forced: bool = False) -> bytes:
    """A whole OpenAI chat answer with its lost tool calls put back (or the lost-call error raised);
    any other answer is returned as it came. `forced`: the answer is a call's JSON (forced_call.py),
    read whatever the finish reason, and finished as "tool_calls"."""
    answer = _json(data.decode("utf-8", "replace")) if data.lstrip().startswith(b"{") else None
    choices = answer.get("choices") if isinstance(answer, dict) else None
    changed = False
    for choice in choices if isinstance(choices, list) else ():
        msg = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(msg, dict) or msg.get("tool_calls"):
            continue
        finish = choice.get("finish_reason")
        if finish != "tool_calls" and not forced:
            continue
        text = msg.get("content")
        calls, rest = parse_calls(text) if isinstance(text, str) else ([], "")
        if not calls:
            raise unreadable_call_error(model, finish=str(finish)) if forced else lost_call_error(model)
        msg["tool_calls"], msg["content"] = calls, (None if forced else rest or None)
        choice["finish_reason"] = "tool_calls"
        changed = True
    return json.dumps(answer).encode() if changed else data
