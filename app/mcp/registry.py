"""MCP servers registered on this machine: `mcp.json` under SWITCHYARD_HOME, secrets in the keyring.

A server is a stdio command or a streamable-HTTP URL. Values of its environment variables and HTTP headers
are secrets (tokens, mostly): the file holds only their names, the values live in the keyring under
`mcp:NAME:env:VAR` / `mcp:NAME:header:HEADER`. Each tool has a permission (allow, ask, deny); a tool not
named is `ask`, so a new tool never runs unseen. A permission may also be set for one API key (the name
`switchyard keys` gave it): the key's rule wins over the server-wide one for requests made with that key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core import statefile
from app.core.errors import BadRequestError, NotFoundError, SettingsError
from app.core.names import check_short_name
from app.core.paths import Paths
from app.core.vault import Secret, keyring_delete, keyring_get, keyring_put

PERMISSIONS = ("allow", "ask", "deny")


@dataclass(frozen=True)
class McpServerSpec:
    """How to reach one server: `command` (stdio) or `url` (streamable HTTP), never both."""

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    env: dict[str, Secret] = field(default_factory=dict)
    headers: dict[str, Secret] = field(default_factory=dict)
    tools: dict[str, str] = field(default_factory=dict)  # tool -> allow | ask | deny
    timeout_s: float | None = None  # the deadline of one call; None: McpBounds' default
    keys: dict[str, dict[str, str]] = field(default_factory=dict)  # API key name -> tool -> permission

    def permission(self, tool: str, *, key: str | None = None) -> str:
        """The tool's permission for a request made with API key `key` (None: no key): the key's own
        rule, else the server-wide one, else ask."""
        own = self.keys.get(key, {}).get(tool) if key is not None else None
        return own or self.tools.get(tool, "ask")

    def public(self) -> dict[str, Any]:
        """What the CLI and /api/mcp show: names of secrets, never their values."""
        return {
            "name": self.name,
            "transport": "stdio" if self.command else "http",
            "command": list(self.command) or None,
            "url": self.url,
            "env": sorted(self.env),
            "headers": sorted(self.headers),
            "tools": dict(self.tools),
            "keys": {k: dict(v) for k, v in self.keys.items()},
            "timeout_s": self.timeout_s,
        }


def check_name(name: str) -> str:
    return check_short_name(name, what="MCP server name", longest=64, example="'files' or 'github'")


def check_key(paths: Paths, key: str) -> str:
    """`key` names an API key of this server (`switchyard keys ls`), so a rule for it can ever apply."""
    from app.core.secrets import KeyStore

    names = sorted(k.name for k in KeyStore.at(paths).entries())
    if key not in names:
        raise NotFoundError(
            f"no API key named {key!r}; "
            + (f"the keys are {', '.join(names)}" if names else "this server has no keys yet")
            + " (`switchyard keys create NAME` makes one)"
        )
    return key


def check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise BadRequestError(f"MCP server URL {url!r} must start with http:// or https://", param="url")
    return url


def _secret_user(server: str, kind: str, key: str) -> str:
    return f"mcp:{server}:{kind}:{key}"


class McpRegistry:
    """The registered servers in `path` (Paths.home / mcp.json); every change is a locked rewrite."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def of(cls, paths: Paths) -> McpRegistry:
        return cls(paths.home / "mcp.json")

    def _doc(self) -> dict[str, Any]:
        text = statefile.read_text(self.path)
        return statefile.json.loads(text) if text else {"servers": {}}

    def names(self) -> list[str]:
        return sorted(self._doc()["servers"])

    def all(self) -> list[McpServerSpec]:
        return [self.get(n) for n in self.names()]

    def get(self, name: str) -> McpServerSpec:
        raw = self._doc()["servers"].get(name)
        if raw is None:
            raise NotFoundError(
                f"no MCP server named {name!r} is registered; `switchyard mcp ls` lists them, "
                "`switchyard mcp add NAME -- COMMAND` adds one"
            )
        return McpServerSpec(
            name=name,
            command=tuple(raw.get("command") or ()),
            url=raw.get("url"),
            env={k: self._secret(name, "env", k) for k in raw.get("env", [])},
            headers={k: self._secret(name, "header", k) for k in raw.get("headers", [])},
            tools=dict(raw.get("tools", {})),
            timeout_s=raw.get("timeout_s"),
            keys={k: dict(v) for k, v in raw.get("keys", {}).items()},
        )

    @staticmethod
    def _secret(server: str, kind: str, key: str) -> Secret:
        value, problem = keyring_get(_secret_user(server, kind, key))
        if value is None:
            raise SettingsError(
                f"the {kind} value {key!r} of MCP server {server!r} is not in the keyring"
                + (f" ({problem})" if problem else "")
                + f"; add the server again with `switchyard mcp add {server} ...`"
            )
        return value

    def add(
        self,
        name: str,
        *,
        command: tuple[str, ...] = (),
        url: str | None = None,
        env: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> McpServerSpec:
        """Register (or replace) a server; secrets go to the keyring first, so a refusal writes nothing."""
        check_name(name)
        if bool(command) == bool(url):
            raise BadRequestError("give an MCP server either a command (stdio) or a URL (streamable HTTP)")
        if url is not None:
            check_url(url)
        if timeout_s is not None and not 0 < timeout_s <= 3600:
            raise BadRequestError(
                "an MCP call's timeout must be between 0 and 3600 seconds", param="timeout_s"
            )
        for kind, values in (("env", env or {}), ("header", headers or {})):
            for key, value in values.items():
                problem = keyring_put(_secret_user(name, kind, key), Secret(value))
                if problem is not None:
                    raise SettingsError(
                        f"cannot keep the {kind} value {key!r} of MCP server {name!r}: {problem}; "
                        "install a keyring backend (for example `pip install keyrings.alt`) and try again"
                    )

        def change(doc: Any) -> Any:
            doc = doc or {"servers": {}}
            old = doc["servers"].get(name, {})
            doc["servers"][name] = {
                "command": list(command) or None,
                "url": url,
                "env": sorted(env or {}),
                "headers": sorted(headers or {}),
                "tools": old.get("tools", {}),  # permissions outlive a re-add of the same name
                "keys": old.get("keys", {}),
                "timeout_s": timeout_s,
            }
            return doc

        statefile.update(self.path, change, mode=0o600)
        return self.get(name)

    def remove(self, name: str) -> McpServerSpec:
        spec = self.get(name)

        def change(doc: Any) -> Any:
            doc["servers"].pop(name, None)
            return doc

        statefile.update(self.path, change, mode=0o600)
        for key in spec.env:
            keyring_delete(_secret_user(name, "env", key))
        for key in spec.headers:
            keyring_delete(_secret_user(name, "header", key))
        return spec

    def set_permission(
        self, name: str, *, tool: str, permission: str, key: str | None = None
    ) -> McpServerSpec:
        """Set a tool's permission server-wide, or (`key`) for requests made with that API key only."""
        if permission not in PERMISSIONS:
            raise BadRequestError(f"permission must be one of {', '.join(PERMISSIONS)}", param="permission")
        self.get(name)

        def change(doc: Any) -> Any:
            server = doc["servers"][name]
            rules = server.setdefault("tools", {}) if key is None else server.setdefault("keys", {})
            (rules if key is None else rules.setdefault(key, {}))[tool] = permission
            return doc

        statefile.update(self.path, change, mode=0o600)
        return self.get(name)
