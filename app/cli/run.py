"""`switchyard run MODEL [PROMPT]`: an answer streamed to the terminal, or a chat when no prompt is given.

The request goes to the running server (app/cli/client.py finds it); when none runs, a server is started
in this process for the call, on a free loopback port and not recorded in server.json, and stopped after.
With a prompt (or a prompt piped on stdin) the answer is printed as it streams and the command exits. With
no prompt on a terminal it is a chat: line editing and history (readline), Ctrl-C stops the answer being
written, Ctrl-D (or /bye) leaves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable, Generator
from typing import IO, Any

from app.cli.client import ServerClient
from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg, models_dir_arg
from app.core.errors import SwitchyardError
from app.core.settings import Settings

START_TIMEOUT_S = 60.0


def register(sub: Subparsers) -> None:
    r = sub.add_parser("run", help="answer one prompt from a model, or chat with it in the terminal")
    r.add_argument("model", help="a model id from `switchyard ls` (or a remote's NAME/MODEL)")
    r.add_argument("prompt", nargs="?", help="the prompt (default: read from stdin, or a chat on a terminal)")
    r.add_argument("--system", help="a system message sent before the conversation")
    r.add_argument("--max-tokens", type=int, help="stop each answer after this many tokens")
    r.add_argument("--url", help="use the server at this address (default: the running one, else one here)")
    api_key_arg(r)
    models_dir_arg(r)


class Chat:
    """One conversation with a model through a server: each answer streamed to `out` and kept."""

    def __init__(
        self,
        server: ServerClient,
        model: str,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.server = server
        self.model = model
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self.options: dict[str, Any] = {**(extra or {})}
        if max_tokens is not None:
            self.options["max_tokens"] = max_tokens

    def ask(self, prompt: str, *, out: IO[str]) -> str:
        """Stream the answer to `prompt`; on Ctrl-C the stream is closed (the engine stops) and the part
        written so far is kept as the answer before KeyboardInterrupt goes on."""
        self.messages.append({"role": "user", "content": prompt})
        body = {"model": self.model, "messages": self.messages, "stream": True, **self.options}
        parts: list[str] = []
        stream = _deltas(self.server.events("/v1/chat/completions", body=body, timeout=600))
        try:
            with contextlib.closing(stream):  # on Ctrl-C too: closing it closes the connection
                for text in stream:
                    parts.append(text)
                    out.write(text)
                    out.flush()
        finally:
            self.messages.append({"role": "assistant", "content": "".join(parts)})
        return "".join(parts)


def _deltas(events: Generator[tuple[str, Any], None, None]) -> Generator[str, None, None]:
    with contextlib.closing(events):
        for _kind, data in events:
            if isinstance(data, dict) and data.get("error"):
                err = data["error"]
                raise SwitchyardError(str(err.get("message") if isinstance(err, dict) else err))
            for choice in data.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    yield str(text)


def chat_loop(chat: Chat, *, read: Callable[[str], str] = input, out: IO[str] = sys.stdout) -> int:
    """The terminal chat: a prompt per line until Ctrl-D or /bye; Ctrl-C stops an answer or clears a line."""
    print(f"chatting with {chat.model}: Ctrl-C stops an answer, Ctrl-D or /bye leaves", file=out)
    while True:
        try:
            line = read(">>> ").strip()
        except EOFError:
            print(file=out)
            return 0
        except KeyboardInterrupt:
            print(file=out)
            continue
        if line in ("/bye", "/exit"):
            return 0
        if not line:
            continue
        try:
            chat.ask(line, out=out)
        except KeyboardInterrupt:
            out.write(" [stopped]")
        print(file=out)


class LocalServer:
    """A server in a thread of this process for one command: loopback, a free port, no server.json."""

    def __init__(self, ctx: CliContext, settings: Settings, *, api_key: str | None) -> None:
        self._ctx = ctx
        self._api_key = api_key  # where settings require a key even on loopback
        self._settings = settings.with_changes(host="127.0.0.1", port=0)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._main, name="switchyard-run-server", daemon=True)

    def __enter__(self) -> ServerClient:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise SwitchyardError(f"the server for this run did not start in {START_TIMEOUT_S:.0f} s")
        if self._error is not None:
            raise self._error
        return self._ctx.client(self.url, api_key=self._api_key)

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # handed to the caller's thread, which raises it
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        from aiohttp import web

        from app.runtime import Runtime
        from app.server.app import make_app

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = make_app(Runtime(settings=self._settings, paths=self._ctx.paths))
        # as `serve` does: a request whose client left is cancelled, so its engine connection is closed
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()  # stops every lane this run started


def server_for(args: argparse.Namespace, ctx: CliContext) -> contextlib.AbstractContextManager[ServerClient]:
    found = ctx.running(args.url, api_key=args.api_key)
    if found is not None:
        return contextlib.nullcontext(found)
    print("no server running: starting one in this process for this run", file=sys.stderr)
    return LocalServer(ctx, ctx.settings(args), api_key=args.api_key)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    prompt = args.prompt
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read().strip()
        if not prompt:
            raise SwitchyardError("no prompt: give one after the model, pipe one in, or run it on a terminal")
    with server_for(args, ctx) as server:
        chat = Chat(server, args.model, system=args.system, max_tokens=args.max_tokens)
        if prompt is None:
            with contextlib.suppress(ImportError):
                import readline  # noqa: F401  (line editing and history for input())
            return chat_loop(chat)
        try:
            chat.ask(prompt, out=sys.stdout)
        except KeyboardInterrupt:
            print(file=sys.stdout)
            return 130
        print()
    return 0
