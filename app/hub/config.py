"""Where the hub is and how to reach it, resolved at call time (never at import).

`huggingface_hub` reads HF_ENDPOINT, HF_HUB_CACHE and HF_HUB_OFFLINE once, when it is imported; Switchyard
passes `endpoint=`, `cache_dir=` and the token explicitly instead, so a setting or an environment change
takes effect without a restart and tests can point it at a local hub.

Precedence for each value: the setting, then the environment, then the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from app.core.secrets import Secret
from app.core.settings import Settings

DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class HubConfig:
    endpoint: str
    cache_dir: Path
    offline: bool
    proxy: str | None = None
    token: Secret | None = None

    def public(self) -> dict[str, object]:
        return {
            "endpoint": self.endpoint,
            "cache_dir": str(self.cache_dir),
            "offline": self.offline,
            "proxy": masked_url(self.proxy),
            "token": "set" if self.token is not None else None,
        }


def masked_url(url: str | None) -> str | None:
    """`http://user:****@proxy:3128`: a proxy URL may carry a password, which is never shown."""
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:****" if parts.password is not None else "****"
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


def default_cache_dir(env: Mapping[str, str]) -> Path:
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "huggingface" / "hub"


def hub_config(
    settings: Settings, *, env: Mapping[str, str] | None = None, token: Secret | None = None
) -> HubConfig:
    """The hub as this process sees it now. `token` is passed in by the token store (app.hub.token)."""
    env = os.environ if env is None else env
    endpoint = (settings.hub.hf_endpoint or env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    cache = (
        Path(settings.hub.hf_cache_dir).expanduser() if settings.hub.hf_cache_dir else default_cache_dir(env)
    )
    offline = settings.hub.offline or env.get("HF_HUB_OFFLINE", "").lower() in _TRUE
    proxy = settings.hub.hf_proxy or env.get("HTTPS_PROXY") or env.get("https_proxy") or None
    return HubConfig(endpoint=endpoint, cache_dir=cache, offline=offline, proxy=proxy, token=token)
