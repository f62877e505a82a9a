"""peers.json under SWITCHYARD_HOME/peers/, and where each peer's key is kept.

Per peer the file holds: its name (its models are served as NAME/MODEL), the API root it is called at,
its server certificate (pinned: the only one trusted for it), the fingerprint of its client certificate
(the only one its requests are accepted with), and the name of the key this server issued to it. The key
the peer issued to this server goes to the system keyring (user "peer:NAME"), or, where there is none,
this process's memory (headless Linux: the pairing then lasts as long as the server; pair again after a
restart). Changes are locked read-modify-writes (app/core/statefile.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core import statefile
from app.core.errors import BadRequestError, PeerExistsError, PeerNotFoundError, SettingsError
from app.core.vault import Kept, Secret, SessionVault

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")


@dataclass(frozen=True)
class PeerSpec:
    name: str
    url: str  # its OpenAI API root, https://HOST:PORT/v1
    server_cert: str  # PEM, pinned
    client_cert: str  # PEM: trusted by this server's TLS context for this peer's calls
    client_fingerprint: str  # its SHA-256: the only certificate the peer's key is accepted with
    issued_key: str  # the name of the key in this server's keys.json that the peer calls with
    key_kept: str | None = None  # where the peer's key to us went: "keyring" or "session"
    paired_at: float = 0.0

    def public(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PeerSpec:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise BadRequestError(
            f"peer name {name!r} is not allowed; use 1-32 letters, digits, '.', '_' or '-' (its models are "
            "named NAME/MODEL), e.g. 'desk' (--name)",
            param="name",
        )
    return name


def suggest_name(wanted: str, taken: set[str]) -> str:
    """`wanted` made a valid name, with -2, -3... when it is taken (three machines may share a hostname)."""
    base = re.sub(r"[^A-Za-z0-9._-]", "-", wanted).strip("-._")[:28] or "peer"
    if not base[0].isalnum():
        base = "p" + base
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


def _user(name: str) -> str:
    return f"peer:{name}"


class PeerStore:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / "peers.json"
        self.vault = SessionVault()

    def specs(self) -> list[PeerSpec]:
        try:
            text = statefile.read_text(self.path)
        except OSError as exc:
            raise SettingsError(f"{self.path} cannot be read ({exc}); fix or remove it") from exc
        return [] if text is None else self._parse(text)

    def _parse(self, text: str) -> list[PeerSpec]:
        try:
            return [PeerSpec.from_json(d) for d in json.loads(text)["peers"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise SettingsError(
                f"{self.path} is damaged ({exc}); fix it, or remove it and pair again"
            ) from exc

    def get(self, name: str) -> PeerSpec:
        for spec in self.specs():
            if spec.name == name:
                return spec
        known = ", ".join(s.name for s in self.specs()) or "none"
        raise PeerNotFoundError(f"no peer named {name!r} (peers: {known}); see `switchyard peers ls`")

    def _update(self, change: Callable[[list[PeerSpec]], Any]) -> Any:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        return statefile.update(
            self.path,
            lambda specs: change(specs or []),
            parse=self._parse,
            dump=lambda specs: statefile.dump_json({"version": 1, "peers": [s.public() for s in specs]}),
            mode=0o600,
        )

    def add(self, spec: PeerSpec, key: Secret) -> PeerSpec:
        """Record `spec` and keep the key the peer gave us; refused when the name or the peer is known."""
        check_name(spec.name)
        kept: list[Kept] = []

        def add(specs: list[PeerSpec]) -> list[PeerSpec]:
            for s in specs:
                if s.name == spec.name or s.client_fingerprint == spec.client_fingerprint:
                    raise PeerExistsError(
                        f"that machine is already paired as {s.name!r}; `switchyard peers rm {s.name}` first "
                        "to pair it again"
                    )
            kept.append(self.vault.put(_user(spec.name), key))
            return [*specs, dataclasses.replace(spec, key_kept=kept[0].where)]

        stored: PeerSpec = self._update(add)[-1]
        return stored

    def remove(self, name: str) -> PeerSpec:
        gone: list[PeerSpec] = []

        def drop(specs: list[PeerSpec]) -> list[PeerSpec]:
            gone.extend(s for s in specs if s.name == name)
            if not gone:
                known = ", ".join(s.name for s in specs) or "none"
                raise PeerNotFoundError(f"no peer named {name!r} (peers: {known}); see `switchyard peers ls`")
            return [s for s in specs if s.name != name]

        self._update(drop)
        self.vault.forget(_user(name))
        return gone[0]

    def key(self, name: str) -> tuple[Secret | None, str | None]:
        value, where, _ = self.vault.find(_user(name))
        return value, where
