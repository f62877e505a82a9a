"""The one request path: resolve → wait → hold → check → post, for every surface and every target.

`resolve` turns a request's `model` into where it goes (a remote model, or a local catalog entry, asked
once) and refuses what that model cannot do; `wait_ready` starts a local lane just in time, telling a
waiting stream how the start goes; `hold` counts the request as in flight on its `Target` (a local `Lane`
or a `RemoteLane`, app/lanes/target.py); `check` makes the checks an engine will not make for itself
(prompt length against a llama.cpp slot, images for an engine without a projector); `post` is the one
POST: the model renamed for the target, its auth headers, one retry on a stale pooled socket, one mapping
of refusals and broken connections to errors. Routes and translators never talk to engines otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from app.chat.deltas import Delta, StreamReader, StreamRefusal
from app.core import tracing
from app.core.errors import (
    BadRequestError,
    ContextLengthExceededError,
    ModelHasNoVisionError,
    ModelNotFoundError,
    RemoteFailedError,
    SwitchyardError,
    UpstreamRefusedError,
)
from app.core.policy import Policy, parse_policy
from app.core.settings import Settings
from app.lanes.bank.sessions import MIB
from app.lanes.bank.slots import SessionBank
from app.lanes.lane import Lane, LaneState
from app.lanes.lane_requests import adapter_base
from app.lanes.remote.lane import RemoteLane
from app.lanes.target import Target
from app.library.catalog import ModelEntry
from app.runtime import Runtime
from app.server.gateway.context_advice import more_context
from app.server.gateway.first_use import FirstUse
from app.server.gateway.images import check_image_tokens, image_parts, image_token_counts, tokens_per_image
from app.server.gateway.model_limits import PlannedSlots
from app.server.gateway.placing import Placing
from app.server.gateway.prompt_window import check_window
from app.server.gateway.raw_http import RawUpstream, open_post, read_all
from app.server.gateway.raw_tools import raw_tool_answer, takes_raw_path
from app.server.gateway.response_notes import mark_partial_logprobs
from app.server.gateway.whole import WholeAnswer, stream_body

log = logging.getLogger("switchyard.gateway")
LOADING_TICK_S = 1.0  # how often a waiting stream hears that its model is still loading
_NO_TOTAL = aiohttp.ClientTimeout(total=None, sock_connect=10)
# a token covers at least one byte of the request body; the chat template adds at most this much
TEMPLATE_ALLOWANCE = 512
PER_MESSAGE_ALLOWANCE = 32
# no token of any vocabulary we serve is longer: a text of B bytes is at least B / this many tokens, so a
# prompt far over the context is refused without a tokenize call (a megabyte would take the engine minutes)
MAX_BYTES_PER_TOKEN = 256
TOKENIZE_DEADLINE_S = 10.0  # a count that takes longer is left to the engine, which counts it anyway
# counts (render, tokenize: two calls per Anthropic stream) reuse their connections: a connect and close
# cost about 250 µs of CPU per call over a kept-alive one here. Few, and idle briefly: llama.cpp gives each
# open connection one of its HTTP threads (parallel + 2 of them), and a client's connections to the engine
# are all gone within a second of it leaving (tests/server/gateway/test_client_leaves.py)
COUNT_CONNECTIONS = 2
COUNT_IDLE_S = 0.25
Tick = Callable[[str, float], Awaitable[None]]  # (phase, seconds waited)


@dataclass(frozen=True)
class Route:
    """Where a request's model goes: a remote model, or a local catalog entry."""

    model: str  # the id requests and logs use (a remote's NAME/MODEL, or the catalog id)
    entry: ModelEntry | None
    remote: RemoteLane | None


class Gateway:
    """The request path over one Runtime; one per server, kept on the app (app/server/keys.py)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        budget = rt.settings.models.session_bank_budget_mib * MIB
        self.bank = SessionBank(rt.paths.home, budget_bytes=budget, known_sha256=self._model_sha256)
        self.planned = PlannedSlots(rt)  # per-slot contexts for /v1/models and /api/show (kept plans)
        self.first_use = FirstUse(rt)  # engines installed when a request first needs them
        self.placing = Placing(rt)  # a bare model id that cannot run here, sent to a paired peer
        self._policy: tuple[Settings, Policy] | None = None
        self._count_http: aiohttp.ClientSession | None = None

    def counts_http(self) -> aiohttp.ClientSession:
        """The session of the counts to local engines (made on first use, in the loop; closed by `close`)."""
        if self._count_http is None or self._count_http.closed:
            connector = aiohttp.TCPConnector(limit_per_host=COUNT_CONNECTIONS, keepalive_timeout=COUNT_IDLE_S)
            self._count_http = aiohttp.ClientSession(connector=connector)
        return self._count_http

    async def close(self) -> None:
        """Close what the gateway holds open itself (the counts' connections)."""
        if self._count_http is not None:
            await self._count_http.close()

    def policy(self) -> Policy:
        """The safety policy of the settings in force, parsed once per settings object: settings are frozen
        and replaced whole when they change (Runtime.apply_settings), so the object is the version."""
        settings = self.rt.settings
        if self._policy is None or self._policy[0] is not settings:
            self._policy = (settings, parse_policy(settings.safety.policy))
        return self._policy[1]

    def _model_sha256(self, model: str) -> str | None:
        """The catalog's sha256 of a one-file model (an HF cache blob is named by it), else None."""
        entry = self.rt.catalog.find(model)
        return entry.files[0].sha256 if entry is not None and len(entry.files) == 1 else None

    # ---- resolve -------------------------------------------------------------------------------------
    async def resolve(self, model: str, capability: str) -> Route:
        """`_resolve` in a span (docs/tracing.md)."""
        with tracing.span("switchyard.resolve", model=model, capability=capability) as sp:
            to = await self._resolve(model, capability)
            sp.set_attribute("switchyard.remote", to.remote is not None)
            return to

    async def _resolve(self, model: str, capability: str) -> Route:
        """Where `model` goes, refused (400/404) when it cannot do `capability` there. A local model of the
        same id always wins over a remote's NAME/MODEL. An unknown name's rescan runs off the event loop."""
        rt = self.rt
        if (remote := self.remote_for(model)) is not None:
            if (missing := remote.capability_error(capability)) is not None:
                raise missing
            return Route(remote.model_id, None, remote)
        if (base := self._adapter_base(model)) is not None:
            model = base  # BASE+ADAPTER: the base's lane, the adapter applied per request (pin_slot)
        try:
            entry = await rt.catalog.aget(model)
        except ModelNotFoundError:
            if (placed := await self._placed(model, None, capability)) is not None:
                return placed  # not here, but a paired peer has it and it fits there
            raise
        if (placed := await self._placed(model, entry, capability)) is not None:
            return placed  # here, but it does not fit this machine; it fits a paired peer
        if entry.format == "gguf" and entry.kind in ("chat", "embedding"):
            wanted = "embedding" if capability == "embeddings" else "chat"
            if capability in ("chat", "completions", "embeddings") and entry.kind != wanted:
                raise _kind_error(model, entry.kind)
        if (missing_local := rt.supervisor.capability_error(entry, capability)) is not None:
            raise missing_local  # a voice asked for chat, a transcriber for embeddings: name who can
        return Route(entry.id, entry, None)

    async def _placed(self, model: str, entry: ModelEntry | None, capability: str) -> Route | None:
        """The route to the paired peer a bare model id is placed on (gateway/placing.py), else None."""
        placed = await self.placing.place(model, entry)
        remote = self.rt.remotes.resolve(placed.model_id) if placed is not None else None
        if placed is None or remote is None or remote.capability_error(capability) is not None:
            return None
        log.info("%s placed on peer %s: %s", model, placed.peer, placed.why)
        return Route(remote.model_id, None, remote)

    def _adapter_base(self, model: str) -> str | None:
        """The base id of a `BASE+ADAPTER` id whose base loads that adapter, else None; a catalog model of
        that very id wins."""
        if self.rt.catalog.find(model) is not None:
            return None
        return adapter_base(model, self.rt.settings)

    def remote_for(self, model: str) -> RemoteLane | None:
        """The remote lane `model` names (`NAME/MODEL`), or None: a local model of the same id always wins."""
        if self.rt.catalog.find(model) is not None:
            return None
        return self.rt.remotes.resolve(model)

    # ---- wait and hold -------------------------------------------------------------------------------
    def needs_start(self, route: Route) -> bool:
        """Whether a request for `route` would wait for a local lane to start (or restart)."""
        if route.entry is None:
            return False
        # looked up, never built: a Lane made only to answer this would be a lane nobody asked to start
        lane = self.rt.supervisor.lanes.get(route.entry.id)
        return lane is None or not lane.available

    async def wait_ready(self, route: Route, *, tick: Tick) -> None:
        """`_wait_ready` in a span: the wait for a lane's start that a stream hears about."""
        with tracing.span("switchyard.wait_lane", model=route.model, start=True):
            await self._wait_ready(route, tick=tick)

    async def _wait_ready(self, route: Route, *, tick: Tick) -> None:
        """Start `route`'s lane, calling `tick(phase, seconds)` at once and every LOADING_TICK_S until it is
        ready. Raises the start's error; a tick that raises (the client went away) ends the wait while the
        start goes on for the next request."""
        if route.entry is None:
            return
        await self.first_use.wait(route.entry, tick=tick)  # its engine installed first, where it is missing
        sup = self.rt.supervisor
        lane = sup.lane_for(route.entry)
        start = asyncio.ensure_future(sup.ensure(route.model, entry=route.entry))
        start.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if nobody waits
        t0 = time.monotonic()
        while True:
            phase = "queued" if lane.state is LaneState.STOPPED else lane.state.value  # waiting for a swap
            await tick(phase, time.monotonic() - t0)
            done, _ = await asyncio.wait({start}, timeout=LOADING_TICK_S)
            if done:
                break
        start.result()

    @contextlib.asynccontextmanager
    async def hold(self, route: Route) -> AsyncIterator[Target]:
        """Hold the target for one request (a local lane started just in time), counted as in flight."""
        if route.remote is not None:
            async with _waited(route, self.rt.remotes.use(route.remote)) as remote:
                yield remote
        else:
            if route.entry is not None and self.needs_start(route):  # (a loaded lane's engine is here)
                self.first_use.refuse(route.entry)  # 503 with the install's job where its engine is missing
            async with _waited(route, self.rt.supervisor.use(route.model, entry=route.entry)) as lane:
                if self.bank.banks(lane):  # its slots are saved before it stops (swap, idle, shutdown)
                    lane.before_stop = functools.partial(self.bank.save_slots, http=self.rt.supervisor.http)
                try:
                    yield lane
                finally:
                    self.bank.release()

    async def pin_slot(self, target: Target, body: dict[str, Any], *, route: str) -> dict[str, Any] | None:
        """The one slot choice for every surface: `body` with the llama.cpp slot it goes to (a banked
        conversation restored there first, app/lanes/bank/slots.py) and what the lane fills in that the
        client left open (the target's `request_defaults`), or None to send it as it is."""
        shaped = target.request_defaults(body, route=route, settings=self.rt.settings)
        slotted = await self.bank.route(target, shaped or body, route=route, http=target.http)
        return slotted or shaped

    async def speculation(self, lane: Lane) -> dict[str, Any]:
        """Whether a ready llama.cpp lane speculates, per slot, from the engine's own /slots (its /props
        says "none" even when it does): the engine is asked here, as every engine request is."""
        return await lane.speculation()

    # ---- checks --------------------------------------------------------------------------------------
    async def check(
        self,
        target: Target,
        body: dict[str, Any],
        *,
        route: str,
        body_bytes: int,
        has_images: bool,
        param: str | None = None,
    ) -> None:
        """What the engine will not check for itself: images it cannot read, a prompt its slot cannot hold."""
        if has_images and await target.sees_images(target.http) is False:
            raise ModelHasNoVisionError(
                f"model {target.model_id!r} cannot read images: its engine has no vision projector (mmproj) "
                "loaded; send text only, or use a vision model",
                param=param or ("messages" if route == "chat" else "prompt"),
            )
        images = 0
        if has_images and (ctx := target.slot_context()) is not None:  # they alone may fill the context
            where = param or "messages"
            # each image's own count where its size decides (Qwen-VL, Pixtral), else one per image
            n_images = len(image_parts(body))
            per = image_token_counts(body, target) or tokens_per_image(target)
            images = check_image_tokens(n_images, per, slot=ctx[0], model=target.model_id, where=where)
        if route in ("chat", "completions") and self.rt.settings.limits.check_prompt_length:
            await self._check_prompt(
                target, body, route=route, body_bytes=body_bytes, param=param, images=images
            )
            await check_window(target, body, route=route, settings=self.rt.settings, param=param)

    async def _check_prompt(
        self,
        target: Target,
        body: dict[str, Any],
        *,
        route: str,
        body_bytes: int,
        param: str | None,
        images: int = 0,
    ) -> None:
        """`images`: the tokens the request's images take, which the engine's tokenizer does not see."""
        ctx = target.slot_context()
        if ctx is None:
            return
        slot = ctx[0]
        try:
            if route == "chat":
                messages = body.get("messages")
                n_msgs = len(messages) if isinstance(messages, list) else 0
                if not may_exceed(body_bytes, messages=n_msgs, slot_ctx=slot):
                    return
                text = _chat_text(body)
                if (least := len(text.encode()) // MAX_BYTES_PER_TOKEN) >= slot:
                    raise _too_long(target, least, ctx, at_least=True, param=param, route=route)
                # one call: the texts alone, tokenized; only a prompt near the limit is counted exactly
                bound = await self._tokens(target, text) + images
                if bound + TEMPLATE_ALLOWANCE + PER_MESSAGE_ALLOWANCE * n_msgs < slot:
                    return
                n: int | None = await self.count_prompt(target, body) + images
            else:
                if (least := _least_tokens(body.get("prompt"))) >= slot:
                    raise _too_long(target, least, ctx, at_least=True, param=param, route=route)
                n = await self._completion_tokens(target, body.get("prompt"), body_bytes, slot)
        except ContextLengthExceededError:
            raise
        except SwitchyardError as exc:  # the engine could not count it (in time): let the engine decide
            log.info("could not count the prompt for %s: %s", target.model_id, exc.message)
            return
        if n is None or n < slot:
            return
        raise _too_long(target, n, ctx, at_least=False, param=param, route=route)

    async def _completion_tokens(self, target: Target, prompt: Any, body_bytes: int, slot: int) -> int | None:
        """The longest prompt of a completion request in tokens (a list of prompts is a batch), or None."""
        if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
            return len(prompt)  # token ids: exact, and free
        if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            return max(len(p) for p in prompt)
        texts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return None
        if not may_exceed(body_bytes, messages=0, slot_ctx=slot):
            return None
        longest = 0
        for text in texts:
            if len(text.encode()) + TEMPLATE_ALLOWANCE < slot:
                continue
            longest = max(longest, await self._tokens(target, text))
        return longest

    async def _counted(self, target: Target, path: str, body: dict[str, Any]) -> Any:
        """`post_json` for a count (render, tokenize), given up after TOKENIZE_DEADLINE_S: the call is
        dropped and the error says so."""
        try:
            async with asyncio.timeout(TOKENIZE_DEADLINE_S):
                return await self.post_json(target, path, body, http=self.counts_http())
        except TimeoutError:
            raise UpstreamRefusedError(
                f"the engine for {target.model_id!r} took over {TOKENIZE_DEADLINE_S:g} s to answer {path}",
                status=504,
                source="engine",
            ) from None

    async def _tokens(self, target: Target, text: str) -> int:
        """Tokens of `text` by the engine's tokenizer, within TOKENIZE_DEADLINE_S."""
        tokens = await self._counted(target, "/tokenize", {"content": text, "add_special": True})
        if not isinstance(tokens, dict) or not isinstance(tokens.get("tokens"), list):
            raise UpstreamRefusedError(
                f"the engine for {target.model_id!r} did not tokenize the prompt", status=502, source="engine"
            )
        return len(tokens["tokens"])

    async def count_prompt(self, target: Target, chat: dict[str, Any]) -> int:
        """Tokens the model will see for this chat request.

        A local llama.cpp engine renders and tokenizes it. A remote has no tokenizer route to rely on
        (vLLM's /tokenize sits outside /v1, a remote Switchyard has none), so it is asked for one token of
        answer to the same messages and tools: the `usage.prompt_tokens` it reports is what it counted."""
        shape: dict[str, Any] = {
            k: chat[k] for k in ("messages", "tools", "chat_template_kwargs") if k in chat
        }
        if not target.tokenizes:
            answer = await self.post_json(
                target, "/v1/chat/completions", {**shape, "max_tokens": 1, "stream": False}
            )
            usage = answer.get("usage") if isinstance(answer, dict) else None
            n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            if not _is_int(n):
                raise RemoteFailedError(
                    f"the upstream of {target.model_id!r} answered a chat completion without "
                    "usage.prompt_tokens, so its prompt tokens cannot be counted here; count them there"
                )
            assert isinstance(n, int)
            return n
        rendered = await self._counted(target, "/apply-template", shape)
        prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
        if not isinstance(prompt, str):
            raise UpstreamRefusedError(
                f"the engine for {target.model_id!r} did not render the prompt", status=502, source="engine"
            )
        return await self._tokens(target, prompt)

    # ---- post ----------------------------------------------------------------------------------------
    async def post(
        self,
        target: Target,
        path: str,
        body: bytes | dict[str, Any],
        *,
        stream: bool = False,
        content_type: str = "application/json",
        http: aiohttp.ClientSession | None = None,
    ) -> aiohttp.ClientResponse:
        """The one POST to a target, in a client span until the answer's head (the stream has its own
        span); `http`: the session to use instead of the target's own. A dict body is sent as JSON with
        the target's name for the model; bytes go as they are (the caller renamed them if it had to). An
        error status is raised as the target's refusal (the answer read and closed); the caller closes a
        successful answer when done with it."""
        data = json.dumps({**body, "model": target.served_name}).encode() if isinstance(body, dict) else body
        with _engine_span(target, path) as sp:
            headers = {"Content-Type": content_type, **target.auth_headers()}
            if target.traced:
                tracing.inject(headers)  # the trace goes on under this span (a remote's traceparent)
            if stream:
                # llama.cpp closes the connection after a streamed answer although it offers keep-alive;
                # asking for close keeps that socket out of the pool, where the next request finds it dead
                headers["Connection"] = "close"
            upstream = await self._send(target, path, data, headers, http or target.http)
            sp.set_attribute("http.response.status_code", upstream.status)
            return upstream

    async def _send(
        self, target: Target, path: str, data: bytes, headers: dict[str, str], http: aiohttp.ClientSession
    ) -> aiohttp.ClientResponse:
        """`post`'s request, a stale pooled connection retried once, errors mapped to the target's."""
        for attempt in (1, 2):
            try:
                upstream = await target.bounded(
                    http.post(target.base_url + path, data=data, headers=headers, timeout=_NO_TOTAL),
                )
                break
            except aiohttp.ClientConnectorError as exc:
                await asyncio.sleep(0.05)  # let a local lane see its engine's exit, so the error names it
                raise target.broken(exc) from exc
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # a pooled connection the upstream closed while idle fails before it read anything: once
                await asyncio.sleep(0)
                if attempt == 1 and target.available:
                    log.debug("connection to %s was stale (%s); retrying once", target.model_id, exc)
                    continue
                await asyncio.sleep(0.05)
                raise target.broken(exc) from exc
            except (aiohttp.ClientError, OSError) as exc:
                await asyncio.sleep(0.05)
                raise target.broken(exc) from exc
        else:  # pragma: no cover - the loop always breaks or raises
            raise AssertionError("unreachable")
        if upstream.status >= 400:
            try:
                answer = await upstream.read()
            except (aiohttp.ClientError, OSError) as exc:
                raise target.broken(exc) from exc
            finally:
                upstream.close()
            raise target.refused(upstream.status, answer)
        return upstream

    def can_relay_raw(self, target: Target) -> bool:
        """Whether a stream from `target` can be relayed at the protocol level (gateway/raw_http.py): a
        local engine on plain HTTP. A remote goes through aiohttp (TLS, proxies, pooled connections)."""
        return target.relays_raw

    async def open_stream(self, target: Target, path: str, body: bytes) -> RawUpstream:
        """The streamed POST for the byte relay: the same headers and the same error mapping as `post`,
        on a connection of its own (an engine closes a streamed connection anyway)."""
        with _engine_span(target, path) as sp:
            proto = await self._open_stream(target, path, body)
            sp.set_attribute("http.response.status_code", proto.head.result()[0])
            return proto

    async def _open_stream(self, target: Target, path: str, body: bytes) -> RawUpstream:
        headers = {"Content-Type": "application/json", **target.auth_headers()}
        try:
            proto = await target.bounded(
                open_post(target.base_url, path, body, headers, progress=target.progress)
            )
        except (OSError, TimeoutError) as exc:
            await asyncio.sleep(0.05)  # let a local lane see its engine's exit, so the error names it
            raise target.broken(exc) from exc
        status, _ = proto.head.result()
        if status >= 400:
            try:
                answer = await read_all(proto)
            finally:
                proto.close()
            raise target.refused(status, answer)
        return proto

    async def read(self, target: Target, upstream: aiohttp.ClientResponse) -> bytes:
        """The whole answer; a connection that breaks while it is read is the target's failure."""
        try:
            parts: list[bytes] = []
            while piece := await target.bounded(upstream.content.readany()):
                parts.append(piece)
            return b"".join(parts)
        except (aiohttp.ClientError, OSError) as exc:
            await asyncio.sleep(0.05)
            raise target.broken(exc) from exc
        finally:
            upstream.close()

    async def post_json(
        self, target: Target, path: str, body: dict[str, Any], *, http: aiohttp.ClientSession | None = None
    ) -> Any:
        upstream = await self.post(target, path, body, http=http)
        data = await self.read(target, upstream)
        try:
            return json.loads(data)
        except ValueError as exc:
            raise target.garbled(path) from exc

    def answers_whole(self, target: Target, route: str, body: dict[str, Any]) -> bool:
        """Whether a non-streamed `route` request is asked of `target` as a stream and answered whole
        (app/server/gateway/whole.py): a local engine with llama.cpp slots, which would not stop for a client
        that went away; a chat, or a completion of one prompt (a batch is answered whole by the engine)."""
        if route not in ("chat", "completions") or target.slot_context() is None:
            return False  # a remote (no slots of ours to free), or an engine without llama.cpp slots
        prompt = body.get("prompt")
        return route == "chat" or not isinstance(prompt, list) or all(_is_int(t) for t in prompt)

    def draft_unsuited(self, target: Target, body: dict[str, Any]) -> str | None:
        """Why the draft model of `target`'s lane does not pay on `body` ("grammar", "json_schema", "tools",
        "temperature"); None when it does or the lane has no draft. The engine drafts regardless (it reads
        no per-request speculation field), so this is reported, in `timings` and /metrics."""
        return target.draft_unsuited(body, settings=self.rt.settings)

    async def whole(self, target: Target, path: str, body: dict[str, Any], *, route: str) -> bytes:
        """The non-streamed answer to `body`, read from the engine's stream of it; the stream's connection
        is dropped if this is cancelled (the client went away), so the engine stops generating. A tool
        request whose answer the engine's own parser refused is asked again raw (gateway/raw_tools.py)."""
        try:
            return await self._whole(target, path, body, route=route)
        except SwitchyardError as exc:
            if route != "chat" or not takes_raw_path(exc, body, engine=target.engine):
                raise
            log.info("%s: the engine's parser refused a tool answer; asking on the raw path", target.model_id)
        return await raw_tool_answer(self.post_json, target, body)

    async def _whole(self, target: Target, path: str, body: dict[str, Any], *, route: str) -> bytes:
        upstream = await self.post(target, path, stream_body(body), stream=True)
        folded = WholeAnswer(route)
        try:
            while not folded.done and (piece := await target.bounded(upstream.content.readany())):
                folded.feed(piece)
        except StreamRefusal as exc:
            raise target.refused(500, exc.payload) from None
        except (aiohttp.ClientError, OSError) as exc:
            await asyncio.sleep(0.05)
            raise target.broken(exc) from exc
        finally:
            upstream.close()
        answer = folded.answer()
        if (why := self.draft_unsuited(target, body)) is not None and isinstance(answer.get("timings"), dict):
            answer["timings"]["draft_unsuited"] = why
        if (partial := target.logprobs_partial(body)) is not None:
            mark_partial_logprobs(answer, partial)  # the body says it too (issue 31, defect 17)
        return json.dumps(answer, ensure_ascii=False).encode()

    async def deltas(self, target: Target, upstream: aiohttp.ClientResponse) -> AsyncGenerator[Delta, None]:
        """The typed deltas of an OpenAI event stream, until `[DONE]`. A broken connection is the target's
        failure; an error inside the stream is its refusal."""
        reader = StreamReader()
        try:
            while piece := await target.bounded(upstream.content.readany()):
                for delta in reader.deltas(piece):
                    yield delta
                if reader.done:
                    return
        except StreamRefusal as exc:
            raise target.refused(500, exc.payload) from None
        except (aiohttp.ClientPayloadError, aiohttp.ClientError, OSError) as exc:
            await asyncio.sleep(0.05)
            raise target.broken(exc) from exc


_T = TypeVar("_T", bound=Target)


@contextlib.asynccontextmanager
async def _waited(route: Route, use: contextlib.AbstractAsyncContextManager[_T]) -> AsyncIterator[_T]:
    """`use` entered in a span: the wait for the lane (its start, a swap, a remote's request slot)."""
    async with contextlib.AsyncExitStack() as stack:
        with tracing.span("switchyard.wait_lane", model=route.model) as sp:
            target = await stack.enter_async_context(use)
            sp.set_attribute("switchyard.lane", target.engine)
        yield target


def _engine_span(target: Target, path: str) -> contextlib.AbstractContextManager[tracing.SpanLike]:
    name = "switchyard.engine"
    return tracing.span(name, kind="client", model=target.model_id, lane=target.engine, path=path)


def _chat_text(body: dict[str, Any]) -> str:
    """The text a chat template renders around: every message's text and the tools' schemas."""
    texts: list[str] = []
    for m in body.get("messages") or ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if isinstance(m, dict) and m.get("tool_calls"):
            texts.append(json.dumps(m["tool_calls"]))
    if body.get("tools"):
        texts.append(json.dumps(body["tools"]))
    return "\n".join(texts)


_IMAGE_PARTS = ("image_url", "input_image", "image")


def chat_has_images(body: dict[str, Any]) -> bool:
    """Whether any message of an OpenAI chat body carries an image part."""
    for m in body.get("messages") or ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") in _IMAGE_PARTS for p in content
        ):
            return True
    return False


def _kind_error(model: str, kind: str) -> BadRequestError:
    if kind == "embedding":
        return BadRequestError(
            f"model {model!r} is an embedding model; it cannot chat or complete text "
            "(use it with POST /v1/embeddings)",
            param="model",
        )
    return BadRequestError(
        f"model {model!r} is a generative model, not an embedding model (its GGUF has no pooling type); "
        "use an embedding model for embeddings",
        param="model",
    )


def _least_tokens(prompt: Any) -> int:
    """The fewest tokens the longest text of a completion prompt can be, from its length in bytes."""
    texts = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt, list) else []
    return max((len(t.encode()) // MAX_BYTES_PER_TOKEN for t in texts if isinstance(t, str)), default=0)


def _too_long(
    target: Target,
    n: int,
    ctx: tuple[int, int, int],
    *,
    at_least: bool,
    param: str | None,
    route: str,
) -> ContextLengthExceededError:
    slot, total, parallel = ctx
    shared = f"{total} tokens shared by {parallel} parallel slots" if parallel > 1 else "its whole context"
    size = f"at least {n} tokens (by its length in bytes)" if at_least else f"{n} tokens"
    return ContextLengthExceededError(
        f"the prompt is {size}, but model {target.model_id!r} has a context of {slot} tokens per "
        f"request ({shared}), and a prompt must leave room for at least one generated token; shorten "
        f"the prompt, or give each request more context: {more_context(target.model_id, parallel=parallel)}",
        param=param or ("messages" if route == "chat" else "prompt"),
        tokens=n,
        limit=slot,
    )


def may_exceed(body_bytes: int, *, messages: int, slot_ctx: int) -> bool:
    """Whether a request this large could hold `slot_ctx` tokens or more.

    A token covers at least one byte of the body, and the template adds at most TEMPLATE_ALLOWANCE tokens
    plus PER_MESSAGE_ALLOWANCE per message; below that bound the prompt fits without counting."""
    return body_bytes + TEMPLATE_ALLOWANCE + PER_MESSAGE_ALLOWANCE * messages >= slot_ctx


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
