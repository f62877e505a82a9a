"""How the window calls its own server like any client: the base URL, the API key the server wants and the
TLS certificate to trust (app/ui/pages/chat.py's stream, app/ui/voice.py's talk and read aloud).

The key: where the server requires keys (`require_api_key`, or a network bind), the window uses a key of
its own named `switchyard-window`, made with the same KeyStore as every other key, so it shows on the
Server page's key list and can be revoked there like any other (the window then makes a new one at its
next call). It is made only when a key is required, never just because the window started. Its secret
stays in this process (and in the system keyring where there is one, as for every key); when the secret
is lost (no keyring, a new process) the old record is revoked and a new key is made. The window never
borrows a user's key: that would blur whose requests the logs and the per-client limits count, and their
secrets are not on disk to read anyway.

TLS: the window trusts exactly the certificate its server is serving (`ServerControl.tls`), the
self-signed one included, and nothing else.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from app.core.secrets import KeyStore, keyring_secret
from app.core.vault import Secret
from app.server import auth, tls

if TYPE_CHECKING:
    from app.ui.context import Desk

WINDOW_KEY = "switchyard-window"
_held: dict[Path, Secret] = {}  # keys.json -> the window's secret, for this process
_making = threading.Lock()  # the chat and read aloud asking at once make one key, not two


@dataclass(frozen=True)
class Access:
    url: str
    key: Secret | None
    ssl: ssl.SSLContext | None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key.reveal()}"} if self.key is not None else {}

    def session(self) -> aiohttp.ClientSession:
        """A session that sends the key and trusts the server's certificate."""
        connector = aiohttp.TCPConnector(ssl=self.ssl) if self.ssl is not None else None
        return aiohttp.ClientSession(connector=connector, headers=self.headers)


def _window_key(store: KeyStore) -> Secret:
    """The window's own key: the one held, else the keyring's copy, else a new one (blocking: scrypt)."""
    with _making:
        return _find_or_make(store)


def _find_or_make(store: KeyStore) -> Secret:
    for held in (_held.get(store.path), keyring_secret(WINDOW_KEY)):
        if held is not None and store.verify(held) == WINDOW_KEY:
            _held[store.path] = held
            return held
    if any(k.name == WINDOW_KEY for k in store.entries()):
        store.revoke(WINDOW_KEY)  # its secret is lost to this process: replace it
    made = store.create(WINDOW_KEY)
    _held[store.path] = made.secret
    return made.secret


async def window_access(desk: Desk) -> Access:
    """The running server's URL, key and certificate for the window's own calls."""
    srv = desk.server
    if not srv.running or not srv.url:
        raise RuntimeError("The local server is stopped: start it on the Server page.")
    key = None
    if auth.keys_required(desk.runtime.settings):
        key = await asyncio.to_thread(_window_key, KeyStore.at(desk.paths))
    context = tls.client_context(srv.tls.cert) if srv.tls is not None else None
    return Access(url=srv.url.rstrip("/"), key=key, ssl=context)
