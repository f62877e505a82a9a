"""The HTTP client huggingface_hub uses, set up from a HubConfig before every hub call.

huggingface_hub keeps one shared `httpx2.Client` per process, made by a factory it lets callers replace
(`set_client_factory`), and it reads HF_HUB_OFFLINE once at import. `prepare(config)` makes both follow the
config at call time: the proxy setting (`hf_proxy`, else HTTPS_PROXY, which httpx reads itself) goes into
the client, and huggingface_hub's offline flag mirrors ours. The factory is only replaced when the proxy
changes, because replacing it closes the shared client under any transfer that is using it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx2
from huggingface_hub import constants
from huggingface_hub.utils import _http as hf_http

from app.core.errors import HubOfflineError
from app.hub.config import HubConfig

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0  # per read; a download streams for longer than this, a stalled read does not


@dataclass(frozen=True)
class ClientFactory:
    """Makes huggingface_hub's shared client; `proxy` None leaves proxies to the environment."""

    proxy: str | None

    def __call__(self) -> httpx2.Client:
        return httpx2.Client(
            proxy=self.proxy,
            event_hooks={"request": [hf_http.hf_request_event_hook]},
            follow_redirects=True,
            timeout=httpx2.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
        )


def offline_error(config: HubConfig, what: str = "this request") -> HubOfflineError:
    return HubOfflineError(
        f"offline: the hub at {config.endpoint} was not asked for {what}, because offline mode is on "
        "(setting `offline` or HF_HUB_OFFLINE=1). Local models keep working; turn offline mode off to "
        "browse or download"
    )


def prepare(config: HubConfig, what: str = "this request") -> None:
    """Fail fast when offline; else point huggingface_hub's shared client at the configured proxy."""
    if config.offline:
        raise offline_error(config, what)
    # huggingface_hub froze HF_HUB_OFFLINE at import; our config is the truth at call time
    constants.HF_HUB_OFFLINE = False
    proxy = explicit_proxy(config)
    current = getattr(hf_http, "_GLOBAL_CLIENT_FACTORY", None)
    if not (isinstance(current, ClientFactory) and current.proxy == proxy):
        hf_http.set_client_factory(ClientFactory(proxy))


def explicit_proxy(config: HubConfig) -> str | None:
    """The proxy to hand to the client; None where it came from HTTPS_PROXY, which httpx reads itself
    (honouring NO_PROXY). A `hf_proxy` setting applies to every hub request."""
    if config.proxy is None or config.proxy in (os.environ.get("HTTPS_PROXY"), os.environ.get("https_proxy")):
        return None
    return config.proxy


def session(config: HubConfig) -> httpx2.Client:
    """The shared client, prepared for `config` (for our own Range reads beside HfApi's calls)."""
    prepare(config)
    return hf_http.get_session()


def token_arg(config: HubConfig) -> str | bool:
    """What huggingface_hub's `token=` gets: ours, or False so it never falls back to a token of its own."""
    return config.token.reveal() if config.token is not None else False
