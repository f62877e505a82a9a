"""The HTTP client huggingface_hub uses, set up from a HubConfig before every hub call.

huggingface_hub keeps one shared `httpx2.Client` per process, made by a factory it lets callers replace
(`set_client_factory`), and it reads HF_HUB_OFFLINE once at import. `prepare(config)` makes both follow the
config at call time: the proxy setting (`hf_proxy`, else HTTPS_PROXY, which httpx reads itself) goes into
the client, and huggingface_hub's offline flag mirrors ours. The factory is only replaced when the proxy
changes, because replacing it closes the shared client under any transfer that is using it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
from huggingface_hub import constants
from huggingface_hub.utils import _http as hf_http
from huggingface_hub.utils import hf_raise_for_status

from app import __version__
from app.core.errors import HubOfflineError
from app.hub.config import HubConfig

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0  # per read; a download streams for longer than this, a stalled read does not
# a listing the user waits for: an unreachable or hung hub must fail in seconds, not after
# huggingface_hub's ~24 s of retries with backoff
QUICK_TIMEOUT = httpx2.Timeout(1.5, connect=2.0)
QUICK_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
QUICK_RETRY_PAUSE_S = 0.3


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


def quick_get(config: HubConfig, url: str, *, params: dict[str, Any] | None = None) -> httpx2.Response:
    """One GET on the shared client, bounded by QUICK_TIMEOUT; an answer of 429/5xx is asked once more
    (the hub is up), a connection failure or a timeout is not (it would only make the user wait).
    Raises httpx2 errors; wrap the call in app.hub.errors.hub_errors."""
    http = session(config)
    headers = quick_headers(config)
    r = http.get(url, params=params, headers=headers, timeout=QUICK_TIMEOUT)
    if r.status_code in QUICK_RETRY_STATUS:
        time.sleep(QUICK_RETRY_PAUSE_S)
        r = http.get(url, params=params, headers=headers, timeout=QUICK_TIMEOUT)
    return r


def quick_headers(config: HubConfig) -> dict[str, str]:
    """Our own user agent and the token: huggingface_hub's build_hf_headers first asks the endpoint for
    its agent-harness list (3 s more against a hung hub, and a request the user did not ask for)."""
    headers = {"user-agent": f"switchyard/{__version__}"}
    if config.token is not None:
        headers["authorization"] = f"Bearer {config.token.reveal()}"
    return headers


def quick_pages(config: HubConfig, url: str, *, params: dict[str, Any]) -> Iterator[Any]:
    """The items of a paginated hub listing (a JSON list per page, the next page in the Link header),
    each page fetched with `quick_get`; stop iterating to stop asking."""
    next_url: str | None = url
    page_params: dict[str, Any] | None = params
    while next_url is not None:
        r = quick_get(config, next_url, params=page_params)
        hf_raise_for_status(r)
        yield from r.json()
        next_url = r.links.get("next", {}).get("url")
        page_params = None  # the Link URL carries the query already
