"""The one way the CLI talks to a running Switchyard server: finding it, calling it, reading its streams.

Finding: `--url` when given, else the address the running server recorded in server.json; a command that
can also work without a server asks whether that one answers (`/health`), a command that needs a server
falls back to settings.json's host and port so its error names the address it tried.

Calling: JSON in and out with the API key (`--api-key`, else SWITCHYARD_API_KEY) as a Bearer token. A 401
becomes a message saying which of the two to use; a 403 or any other refusal keeps the server's own message;
a server that does not answer is a ServerNotRunningError naming the address.

Trust: an https server is checked against `--cacert FILE` when given, else the certificate server.json
records for that address, else the system's store plus this data dir's own self-signed certificate. No
process-wide opener is installed: each client carries its own TLS context.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

from app.core.errors import (
    ModelInUseError,
    ServerAuthError,
    ServerNotRunningError,
    SettingsError,
    SwitchyardError,
)
from app.core.paths import Paths
from app.core.secrets import Secret
from app.core.settings import load_settings

API_KEY_ENV = "SWITCHYARD_API_KEY"
HEALTH_TIMEOUT_S = 3.0


def api_key(flag: str | None) -> Secret | None:
    """The key to send: `--api-key` wins over SWITCHYARD_API_KEY; blank means none."""
    value = (flag if flag is not None else os.environ.get(API_KEY_ENV, "")).strip()
    return Secret(value) if value else None


# ---- finding the server -----------------------------------------------------------------------------
def recorded_url(paths: Paths) -> str | None:
    """The address the running server wrote to server.json, or None when there is no readable record."""
    try:
        return str(json.loads(paths.server_file.read_text())["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def address(paths: Paths, flag: str | None) -> str:
    """Where to look for a server a command needs: `--url`, the recorded one, else settings' host:port."""
    if flag:
        return flag.rstrip("/")
    recorded = recorded_url(paths)
    if recorded is not None:
        return recorded
    settings = load_settings(paths.settings_file)
    return f"http://{settings.server.host}:{settings.server.port}"


# ---- trust ------------------------------------------------------------------------------------------
def trust_context(paths: Paths, url: str, *, cacert: Path | None) -> ssl.SSLContext | None:
    """The TLS context for `url` (None for plain http). See the module docstring for the order."""
    if not url.lower().startswith("https:"):
        return None
    from app.server import tls  # only for https: plain calls do not load the certificate helpers

    if cacert is not None:
        try:
            return tls.client_context(cacert)
        except (OSError, ssl.SSLError) as exc:
            raise SettingsError(
                f"--cacert {cacert} cannot be used ({exc}); give the PEM file of the server's certificate"
            ) from None
    recorded = tls.recorded_cert(paths, url)
    if recorded is not None:
        return tls.client_context(recorded)
    ctx = ssl.create_default_context()
    own = tls.tls_dir(paths) / "cert.pem"
    if own.is_file():  # this data dir's own server, reached under another address than it recorded
        ctx.load_verify_locations(cafile=str(own))
        ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return ctx


# ---- the client -------------------------------------------------------------------------------------
class ServerClient:
    """JSON calls and event streams to one server, with its key and its TLS trust."""

    def __init__(self, url: str, *, key: Secret | None, context: ssl.SSLContext | None) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self._context = context

    def __repr__(self) -> str:
        return f"ServerClient({self.url!r}, key={'set' if self.key else 'none'})"

    def answers(self, *, timeout: float = HEALTH_TIMEOUT_S) -> bool:
        """True when /health answers with a success status; a stale server.json reads False."""
        try:
            with self._open(self._request("GET", "/health", None, "application/json"), timeout):
                return True
        except (OSError, ValueError):  # HTTPError included
            return False

    def get(self, path: str, *, timeout: float = 60) -> Any:
        return self.call("GET", path, timeout=timeout)

    def call(self, method: str, path: str, *, body: Any = None, timeout: float = 60) -> Any:
        """One JSON request; the decoded answer, or the errors the module docstring describes."""
        req = self._request(method, path, body, "application/json")
        with self._checked(req, timeout) as r:
            return json.loads(r.read())

    def events(
        self, path: str, *, body: Any = None, timeout: float = 60
    ) -> Generator[tuple[str, Any], None, None]:
        """A server-sent event stream as (event kind, decoded data); a POST when `body` is given. The
        OpenAI `data: [DONE]` ends it; a dropped connection is a ServerNotRunningError."""
        req = self._request("POST" if body is not None else "GET", path, body, "text/event-stream")
        with self._checked(req, timeout) as r:
            try:
                yield from read_sse(r)
            except OSError as exc:
                raise self._unreachable(exc) from exc

    def outcome(
        self,
        path: str,
        *,
        body: Any,
        timeout: float,
        show: Callable[[str, Any], None],
        stopped: str,
        unfinished: str,
    ) -> dict[str, Any]:
        """The data of the `done` event that ends a long piece of work the server streams (an eval run, a
        gated update); each other event goes to `show` as it comes. An `error` event is a SwitchyardError
        "`stopped`: its message", and a stream that ends without `done` one that says `unfinished`."""
        for kind, data in self.events(path, body=body, timeout=timeout):
            if kind == "error":
                raise SwitchyardError(f"{stopped}: {data['message']}")
            if kind == "done":
                return dict(data)
            show(kind, data)
        raise SwitchyardError(unfinished)

    # -- plumbing --
    def _request(self, method: str, path: str, body: Any, accept: str) -> urllib.request.Request:
        headers = {"Accept": accept}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.key is not None:
            headers["Authorization"] = f"Bearer {self.key.reveal()}"
        return urllib.request.Request(self.url + path, data=data, headers=headers, method=method)

    def _open(self, req: urllib.request.Request, timeout: float) -> Any:
        return urllib.request.urlopen(req, timeout=timeout, context=self._context)

    def _checked(self, req: urllib.request.Request, timeout: float) -> Any:
        try:
            return self._open(req, timeout)
        except urllib.error.HTTPError as exc:
            raise self._refused(exc) from None
        except OSError as exc:  # URLError, a reset, a timeout
            raise self._unreachable(exc) from exc

    def _refused(self, exc: urllib.error.HTTPError) -> SwitchyardError:
        if exc.code == 401:
            return ServerAuthError(auth_hint(self.url, sent=self.key is not None))
        err = error_body(exc.read())
        message = str(err.get("message") or "") or f"the server at {self.url} answered HTTP {exc.code}"
        if exc.code == 409 and err.get("code") == "model_loaded":
            return ModelInUseError(message)
        return SwitchyardError(message)

    def _unreachable(self, exc: OSError) -> ServerNotRunningError:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLCertVerificationError):
            return ServerNotRunningError(
                f"the server at {self.url} presented a certificate this machine does not trust "
                f"({reason.verify_message}); pass --cacert FILE with that server's certificate"
            )
        return ServerNotRunningError(f"no Switchyard server answers at {self.url} ({exc})")


def read_sse(lines: Iterable[bytes]) -> Iterator[tuple[str, Any]]:
    """Server-sent events from raw lines: `event:` names the kind (default "message"), `data:` lines are
    joined, a blank line dispatches, comment lines are keep-alives."""
    kind, data = "", list[str]()
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                text = "\n".join(data)
                if text == "[DONE]":
                    return
                yield kind or "message", json.loads(text)
            kind, data = "", list[str]()
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data and "\n".join(data) != "[DONE]":  # a stream cut before its last blank line
        yield kind or "message", json.loads("\n".join(data))


def auth_hint(url: str, *, sent: bool) -> str:
    if sent:
        return (
            f"the server at {url} refused the API key (unknown, revoked or mistyped); check --api-key or "
            f"{API_KEY_ENV} against `switchyard keys ls` on the server's machine"
        )
    return (
        f"the server at {url} requires an API key; pass --api-key KEY or set {API_KEY_ENV}=KEY "
        "(create one with `switchyard keys create NAME` on the server's machine)"
    )


def error_body(data: bytes) -> dict[str, Any]:
    """The error object of a body in any of the server's shapes (OpenAI, Anthropic, Ollama)."""
    try:
        err = json.loads(data or b"{}").get("error")
    except (ValueError, AttributeError):
        return {"message": data.decode("utf-8", "replace").strip()[:300]}
    if isinstance(err, dict):
        return err
    return {"message": err} if isinstance(err, str) else {}
