"""peers.json under SWITCHYARD_HOME/peers/, and where each peer's key is kept.

Per peer the file holds: its name (its models are served as NAME/MODEL), the API root it is called at,
its server certificate (pinned: the only one trusted for it), the fingerprint of its client certificate
(the only one its requests are accepted with), the name of the key this server issued to it, and whether
the user marked the network to it as trusted (`switchyard peers trust NAME --network`). The key
the peer issued to this server goes to the system keyring (user "peer:NAME"), or, where there is none,
this process's memory (headless Linux: the pairing then lasts as long as the server; pair again after a
restart). Changes are locked read-modify-writes (app/core/statefile.py).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core import statefile
from app.core.errors import PeerExistsError, PeerNotFoundError
from app.core.names import check_short_name
from app.core.public import Public
from app.core.vault import Kept, Secret, SessionVault


@dataclass(frozen=True)
class PeerSpec(Public):
    name: str
    url: str  # its OpenAI API root, https://HOST:PORT/v1
    server_cert: str  # PEM, pinned
    client_cert: str  # PEM: trusted by this server's TLS context for this peer's calls
    client_fingerprint: str  # its SHA-256: the only certificate the peer's key is accepted with
    issued_key: str  # the name of the key in this server's keys.json that the peer calls with
    key_kept: str | None = None  # where the peer's key to us went: "keyring" or "session"
    paired_at: float = 0.0
    # the user said the network to this peer is theirs: multi-node vLLM/SGLang may use it (their traffic
    # between machines is unencrypted: app/lanes/engines/multinode.py); absent in older files: False
    trusted_network: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PeerSpec:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


def check_name(name: str) -> str:
    return check_short_name(
        name, what="peer name", longest=32, note="its models are named NAME/MODEL", example="'desk' (--name)"
    )


def suggest_name(wanted: str, taken: set[str]) -> str:
    """`wanted` made a valid name, with -2, -3... when it is taken (three machines may share a hostname)."""
    base = re.sub(r"[^A-Za-z0-9._-]", "-", wanted).strip("-._")[:28] or "peer"
    if not base[0].isalnum():
        base = "p" + base
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


class PeerStore(statefile.NamedRecords[PeerSpec]):
    list_key, noun, listing = "peers", "peer", "switchyard peers ls"
    missing_error = PeerNotFoundError
    repair = "fix it, or remove it and pair again"

    def __init__(self, folder: Path) -> None:
        super().__init__(folder / "peers.json")
        self.folder = folder
        self.vault = SessionVault()

    def _record(self, data: Any) -> PeerSpec:
        return PeerSpec.from_json(data)

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
            kept.append(self.vault.put(self.keyring_user(spec.name), key))
            return [*specs, dataclasses.replace(spec, key_kept=kept[0].where)]

        stored: PeerSpec = self._update(add)[-1]
        return stored

    def remove(self, name: str) -> PeerSpec:
        gone = self._drop(name)
        self.vault.forget(self.keyring_user(name))
        return gone

    def set_trusted_network(self, name: str, trusted: bool) -> PeerSpec:
        """Mark (or unmark) the network to peer `name` as trusted; PeerNotFoundError naming the peers."""
        changed: list[PeerSpec] = []

        def mark(specs: list[PeerSpec]) -> list[PeerSpec]:
            out = []
            for s in specs:
                if s.name == name:
                    s = dataclasses.replace(s, trusted_network=trusted)
                    changed.append(s)
                out.append(s)
            if not changed:
                raise self.missing(name, specs)
            return out

        self._update(mark)
        return changed[0]

    def key(self, name: str) -> tuple[Secret | None, str | None]:
        value, where, _ = self.vault.find(self.keyring_user(name))
        return value, where
