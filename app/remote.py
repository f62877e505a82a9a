"""Talking to a running Switchyard server from the CLI (`switchyard ps`, `switchyard explain`).

A server that requires keys (a LAN bind, or `require_api_key`) answers 401 to a request without one; the
key comes from `--api-key` or SWITCHYARD_API_KEY and is sent as `Authorization: Bearer`. A 401 becomes
a message that says which of the two to use; a 403 (the admin API refused from another machine) keeps
the server's own message.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from app.core.errors import ServerAuthError, ServerNotRunningError, SwitchyardError
from app.core.secrets import Secret

API_KEY_ENV = "SWITCHYARD_API_KEY"


def api_key(flag: str | None) -> Secret | None:
    """The key to send: `--api-key` wins over SWITCHYARD_API_KEY; blank means none."""
    value = (flag if flag is not None else os.environ.get(API_KEY_ENV, "")).strip()
    return Secret(value) if value else None


def get_json(url: str, path: str, *, key: Secret | None, timeout: float) -> Any:
    """GET `url + path` as JSON. Raises ServerAuthError on 401, SwitchyardError with the server's
    message on other error statuses, and lets URLError/OSError through (the caller decides whether a
    server that does not answer is an error)."""
    headers = {"Accept": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key.reveal()}"
    req = urllib.request.Request(url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise ServerAuthError(_auth_hint(url, sent=key is not None)) from None
        message = _message(exc.read())
        raise SwitchyardError(message or f"the server at {url} answered HTTP {exc.code}") from None


def _auth_hint(url: str, *, sent: bool) -> str:
    if sent:
        return (
            f"the server at {url} refused the API key (unknown, revoked or mistyped); check --api-key or "
            f"{API_KEY_ENV} against `switchyard keys list` on the server's machine"
        )
    return (
        f"the server at {url} requires an API key; pass --api-key KEY or set {API_KEY_ENV}=KEY "
        "(create one with `switchyard keys create NAME` on the server's machine)"
    )


def _message(data: bytes) -> str:
    """The message of an error body in any of the server's shapes (OpenAI, Anthropic, Ollama)."""
    try:
        err = json.loads(data or b"{}").get("error")
    except (ValueError, AttributeError):
        return data.decode("utf-8", "replace").strip()[:300]
    if isinstance(err, dict):
        return str(err.get("message") or "")
    return err if isinstance(err, str) else ""


def not_running(url: str, exc: BaseException) -> ServerNotRunningError:
    return ServerNotRunningError(
        f"no Switchyard server answers at {url} ({exc}); start one with `switchyard serve`"
    )
