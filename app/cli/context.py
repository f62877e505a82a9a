"""CliContext: what every command is handed — the data dir, the settings, and the way to the server."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.cli.client import ServerClient, address, recorded_url, trust_context
from app.cli.client import api_key as key_from
from app.core.paths import Paths
from app.core.settings import Settings, load_settings

# flags that mean the setting of the same name for this run (serve, explain, pin, ls ...)
_SETTING_FLAGS = (
    "host",
    "port",
    "max_loaded_lanes",
    "idle_ttl_s",
    "ctx_size",
    "parallel",
    "threads",
    "kv_type",
    "flash_attn",
    "gpu_layers",
    "runtime",
    "llama_server_path",
    "llama_cpp_version",
    "sd_server_path",
)


@dataclass(frozen=True)
class CliContext:
    paths: Paths
    cacert: Path | None = None  # --cacert: the certificate of an https server not recorded here

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, paths: Paths | None = None) -> CliContext:
        cacert = getattr(args, "cacert", None)
        return cls(paths=paths or Paths.from_env(), cacert=Path(cacert).expanduser() if cacert else None)

    def base_settings(self) -> Settings:
        """settings.json as it is (no flags)."""
        return load_settings(self.paths.settings_file)

    def settings(self, args: argparse.Namespace) -> Settings:
        """settings.json with this command's setting flags (and --models-dir) laid over it."""
        changes: dict[str, Any] = {k: getattr(args, k, None) for k in _SETTING_FLAGS}
        if getattr(args, "models_dirs", None):
            changes["models_dirs"] = tuple(p.expanduser().resolve() for p in args.models_dirs)
        return self.base_settings().with_changes(**changes)

    def client(self, url: str, *, api_key: str | None) -> ServerClient:
        """A client for the server at `url`, with the key from `--api-key` or the environment."""
        context = trust_context(self.paths, url, cacert=self.cacert)
        return ServerClient(url, key=key_from(api_key), context=context)

    def server(self, url: str | None, *, api_key: str | None) -> ServerClient:
        """The server a command needs (ps, explain): it is not asked whether it answers here."""
        return self.client(address(self.paths, url), api_key=api_key)

    def running(self, url: str | None, *, api_key: str | None) -> ServerClient | None:
        """The server to work through when one runs: `--url` as given, else the recorded one if it
        answers; None means work here (no record, or a stale one)."""
        if url:
            return self.client(url.rstrip("/"), api_key=api_key)
        found = recorded_url(self.paths)
        if found is None:
            return None
        server = self.client(found, api_key=api_key)
        return server if server.answers() else None

    def setting(self, args: argparse.Namespace, name: str) -> Any:
        """One setting as it stands: the running server's (live) where one runs, else settings.json's."""
        server = self.running(args.url, api_key=args.api_key)
        if server is not None:
            return server.get("/api/settings", timeout=30)["settings"].get(name)
        return self.base_settings().value(name)

    def change_settings(self, args: argparse.Namespace, values: dict[str, Any], *, origin: str) -> None:
        """Write `values` through the running server (it applies them live), else into settings.json."""
        server = self.running(args.url, api_key=args.api_key)
        if server is not None:
            server.call("PUT", "/api/settings", body=values, timeout=60)
            return
        from app.core.settings_file import set_settings

        set_settings(self.paths.settings_file, values, origin=origin)
