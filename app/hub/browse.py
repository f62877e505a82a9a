"""`Hub`: the token store, the config made from settings at call time, and the clients built on them.

One `Hub` per process (the CLI makes one per command, the server one per app), because it holds the
token kept for this process only where no keyring exists.
"""

from __future__ import annotations

from typing import Any

from app.core.errors import HubAuthError, HubError
from app.core.paths import Paths
from app.core.settings import Settings
from app.hub.api import HubClient
from app.hub.config import HubConfig, hub_config
from app.hub.range_reader import RangeReader, ReadCache
from app.hub.token import TokenStore


class Hub:
    def __init__(self, paths: Paths, settings: Settings, *, tokens: TokenStore | None = None) -> None:
        self.paths = paths
        self.settings = settings
        self.tokens = tokens or TokenStore(paths, settings)

    @property
    def cache_root(self) -> Any:
        return self.paths.home / "cache" / "hub-reads"

    def config(self) -> HubConfig:
        return hub_config(self.settings, token=self.tokens.get())

    def reader(self, config: HubConfig | None = None) -> RangeReader:
        return RangeReader(config or self.config(), ReadCache(self.cache_root))

    def client(self) -> HubClient:
        config = self.config()
        return HubClient(config, self.reader(config))

    def status(self, *, verify: bool = True) -> dict[str, Any]:
        """Endpoint, offline, proxy, the token (whether set and from where, never its value), and whether
        the hub accepts it (`verified`: True / False / None when not checked)."""
        found = self.tokens.find()
        config = hub_config(self.settings, token=found.token)
        out: dict[str, Any] = {
            **config.public(),
            "token": found.public(),
            "token_file": str(self.tokens.file),
            "verified": None,
            "user": None,
            "problem": None,
        }
        if not verify or found.token is None:
            return out
        if config.offline:
            out["problem"] = "offline mode is on: the token was not checked with the hub"
            return out
        try:
            who = HubClient(config, self.reader(config)).whoami() or {}
        except HubAuthError as exc:
            out["verified"] = False
            out["problem"] = exc.message
            return out
        except HubError as exc:
            out["problem"] = exc.message
            return out
        out["verified"] = True
        out["user"] = who.get("name")
        return out
