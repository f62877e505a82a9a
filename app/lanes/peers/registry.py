"""The running server's peers: invitations, pairing both ways, the trust each link carries, removal.

Each peer is served as a remote (app/lanes/remote/): `PEER/MODEL` ids in /v1/models and on every surface,
health-checked with the others, through an aiohttp session of its own that pins the peer's server
certificate and presents this machine's client certificate. Incoming peer calls carry the key this server
issued to that peer (keys.json, named `peer.NAME`) and are accepted only with the peer's pinned client
certificate (app/server/admin/peers.py checks both).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from app.core.errors import (
    BadRequestError,
    KeyNotFoundError,
    PairingRefusedError,
    PeerExistsError,
    PeersNeedTLSError,
    PeerUnavailableError,
    SettingsError,
)
from app.core.events import EventBus
from app.core.paths import Paths
from app.core.secrets import KeyStore
from app.core.vault import Secret
from app.lanes.peers import identity, nodes, pairing, rpc
from app.lanes.peers.store import PeerSpec, PeerStore, check_name, suggest_name
from app.lanes.remote.lane import Remote, RemoteState, describe
from app.lanes.remote.registry import RemoteRegistry
from app.lanes.remote.store import RemoteSpec

KEY_PREFIX = "peer."  # keys.json names of the keys issued to peers (reserved: see peer_of_key)
PAIR_PATH = "/peer/pair"
LINK_PATH = "/peer/link"  # DELETE: a peer unpaired (authenticated by its pinned certificate alone)
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Listening:
    """What this server serves peers with: its certificate, its TLS context, its address."""

    server_pem: str
    ctx: ssl.SSLContext
    host: str
    port: int


def _wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::")


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadRequestError(
            f"peer address {address!r} is not HOST:PORT; give the address `switchyard peers invite` showed "
            "on the other machine, e.g. 192.168.1.20:8080",
            param="address",
        )
    return host, int(port)


def cert_hostname(pem: str) -> str:
    """The machine name in a Switchyard certificate's common name ('Switchyard on NAME'), else 'peer'."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    names = x509.load_pem_x509_certificate(pem.encode()).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = str(names[0].value) if names else ""
    return cn.rsplit(" ", 1)[-1] if cn.startswith("Switchyard") else "peer"


class PeerRemote(Remote):
    """A peer served as a remote: the same checks and lanes, with advice that speaks of pairing."""

    noun, runs, check_command = "peer", "it runs with `serve --tls`", "switchyard peers check"

    def _auth_message(self, status: int) -> str:
        return (
            f"peer {self.name!r} refused this machine (HTTP {status}): the key it issued is not kept here "
            "(it was held in this server's memory before a restart: no keyring) or it unpaired; "
            f"`switchyard peers rm {self.name}`, then pair again with a new code from `switchyard peers "
            "invite` there"
        )


class PeerRegistry:
    def __init__(self, paths: Paths, *, bus: EventBus, remotes: RemoteRegistry) -> None:
        self.store = PeerStore(paths.home / "peers")
        self.keys = KeyStore.at(paths)
        self.bus = bus
        self.remotes = remotes
        self.gate = pairing.Gate()
        self.listening: Listening | None = None
        self.identity: identity.Identity | None = None
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._info: dict[str, dict[str, Any]] = {}  # each peer's last /peer/info: its own probe, its models
        self._tasks: set[asyncio.Task[Any]] = set()
        self.workers = rpc.RpcWorkers(logs=paths.lane_logs)  # the RPC workers this machine lends peers
        self.nodes = nodes.NodeParts(logs=paths.lane_logs)  # its parts of peers' multi-node models

    # ---- life ------------------------------------------------------------------------------------------
    async def __aenter__(self) -> PeerRegistry:
        self.identity = await asyncio.to_thread(identity.load_or_make, self.store.folder)
        try:
            specs = await asyncio.to_thread(self.store.specs)
        except SettingsError:
            specs = []  # a damaged peers.json: `peers ls` says so; serving goes on without peers
        for spec in specs:
            self._attach(spec)
            # checked now, not at the remotes' next round (remote_check_s away): their models list at once
            self._later(self._check_soon(spec.name, delay=0.0))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.workers.close()
        await self.nodes.close()
        for task in list(self._tasks):
            task.cancel()
        for name in list(self._sessions):
            await self._detach(name)

    def arm(self, listening: Listening) -> None:
        """Called once the server's TLS context exists: peers' client certificates are trusted on it."""
        self.listening = listening
        identity.accept_peers(listening.ctx, [s.client_cert for s in self._specs_quiet()])

    def disarm(self) -> None:
        """The TLS site closed (the window's Stop): no pairing until a TLS site listens again."""
        self.listening = None

    def _specs_quiet(self) -> list[PeerSpec]:
        try:
            return self.store.specs()
        except SettingsError:
            return []

    def _need_tls(self) -> Listening:
        if self.listening is None:
            raise PeersNeedTLSError(
                "peers need this server to serve TLS: start it with `switchyard serve --tls` (and, to be "
                "reachable from other machines, --host 0.0.0.0 with an API key), or in the window turn on "
                '"Allow access from the local network" on the Server page and press Start'
            )
        return self.listening

    def _attach(self, spec: PeerSpec) -> Remote:
        assert self.identity is not None
        ctx = identity.pinned_client(spec.server_cert, identity=self.identity)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx))
        self._sessions[spec.name] = session
        remote_spec = RemoteSpec(name=spec.name, url=spec.url, key_kept=spec.key_kept)
        remote = PeerRemote(remote_spec, bus=self.bus, key=self.store.key(spec.name), http=session)
        self.remotes.attach(remote)
        return remote

    async def _detach(self, name: str) -> None:
        self.remotes.detach(name)
        session = self._sessions.pop(name, None)
        if session is not None:
            await session.close()

    def _later(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- inviting and pairing ------------------------------------------------------------------------
    def invite(self) -> dict[str, Any]:
        """A one-time code, the addresses this server is reached at, and its certificate's fingerprint."""
        listening = self._need_tls()
        code, ttl = self.gate.invite()
        return {
            "code": code,
            "expires_in_s": ttl,
            "addresses": self.addresses(),
            "fingerprint": identity.fingerprint(listening.server_pem.encode()),
        }

    def addresses(self) -> list[str]:
        listening = self._need_tls()
        if not _wildcard(listening.host):
            hosts = [listening.host]
        else:
            hosts = sorted(_own_addresses()) or ["127.0.0.1"]
        return [f"[{h}]:{listening.port}" if ":" in h else f"{h}:{listening.port}" for h in hosts]

    async def pair(
        self, address: str, code: str, *, name: str | None = None, fingerprint: str | None = None
    ) -> tuple[PeerSpec, Remote]:
        """Pair with the machine at `address` that showed `code`: both sides pin each other's certificates
        and keep each other's key. A wrong code, or a certificate other than the one the code was made
        with, fails without keeping anything."""
        listening = self._need_tls()
        assert self.identity is not None
        host, port = split_address(address)
        pairing.normalize(code)
        if name is not None:
            check_name(name)
        try:
            pem = await asyncio.to_thread(ssl.get_server_certificate, (host, port), timeout=TIMEOUT_S)
        except (OSError, ssl.SSLError) as exc:
            raise PeerUnavailableError(
                f"cannot reach {host}:{port} over TLS ({exc}); check the address `switchyard peers invite` "
                "showed there, and that it was started with `serve --tls`"
            ) from exc
        seen = identity.fingerprint(pem.encode())
        if seen == identity.fingerprint(listening.server_pem.encode()):
            raise BadRequestError(
                f"{host}:{port} is this server itself; run `switchyard peers add` on the other machine",
                param="address",
            )
        if fingerprint is not None and _bare(fingerprint) != _bare(seen):
            raise PairingRefusedError(
                f"{host}:{port} presented the certificate {seen}, not the {fingerprint} you gave: you may be "
                "talking to another machine; nothing was paired"
            )
        known = self._specs_quiet()
        for s in known:  # refused before the other side keeps anything, and before a key is replaced
            if identity.fingerprint(s.server_cert.encode()) == seen:
                raise PeerExistsError(
                    f"{host}:{port} is already paired as {s.name!r}; `switchyard peers rm {s.name}` first to "
                    "pair it again"
                )
        taken = {s.name for s in known} | set(self.remotes.remotes)
        if name is not None and name in taken:
            raise PeerExistsError(
                f"the name {name!r} is taken by a peer or a remote (`switchyard peers ls`, `switchyard "
                "remote ls`); choose another with --name"
            )
        local = name or suggest_name(cert_hostname(pem), taken)
        issued = await self._issue(local)
        fields = {
            "name": socket.gethostname(),
            "host": "" if _wildcard(listening.host) else listening.host,
            "port": listening.port,
            "server_cert": listening.server_pem,
            "client_cert": self.identity.pem,
            "key": issued.reveal(),
            "seen": seen,
        }
        try:
            answer = await self._post_pair(
                host, port, pem, {**fields, "proof": pairing.proof(code, role="join", fields=fields)}
            )
            theirs = _answer_fields(answer)
            if not hmac.compare_digest(
                str(answer.get("proof", "")), pairing.proof(code, role="host", fields=theirs)
            ):
                raise PairingRefusedError(
                    f"{host}:{port} answered without proving the pairing code; nothing was paired"
                )
            spec = PeerSpec(
                name=local,
                url=f"https://{_url_host(host)}:{port}/v1",
                server_cert=pem,
                client_cert=theirs["client_cert"],
                client_fingerprint=identity.fingerprint(theirs["client_cert"].encode()),
                issued_key=KEY_PREFIX + local,
                paired_at=time.time(),
            )
            spec = await asyncio.to_thread(self.store.add, spec, Secret(theirs["key"]))
        except BaseException:
            await asyncio.to_thread(self._revoke, KEY_PREFIX + local)
            raise
        identity.accept_peers(listening.ctx, [spec.client_cert])
        remote = self._attach(spec)
        await self.remotes.check(spec.name)
        with contextlib.suppress(PeerUnavailableError):
            await self._learn(spec.name)
        return spec, remote

    async def _post_pair(self, host: str, port: int, pem: str, body: dict[str, Any]) -> dict[str, Any]:
        ctx = identity.pinned_client(pem, identity=None)  # the code is the credential here, not a key
        url = f"https://{_url_host(host)}:{port}{PAIR_PATH}"
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.post(url, json=body, ssl=ctx, timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as r,
            ):
                doc = await r.json(content_type=None)
                status = r.status
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise PeerUnavailableError(f"pairing with {host}:{port} failed ({describe(exc)})") from exc
        if status >= 400:
            err = doc.get("error", {}) if isinstance(doc, dict) else {}
            message = err.get("message") or f"HTTP {status}"
            if status == 403:
                raise PairingRefusedError(f"{host}:{port} refused: {message}")
            if status == 429:
                from app.core.errors import PairingLockedError

                raise PairingLockedError(f"{host}:{port} refused: {message}")
            raise PeerUnavailableError(f"{host}:{port} refused pairing: {message}")
        if not isinstance(doc, dict):
            raise PeerUnavailableError(f"{host}:{port} answered pairing with something that is not JSON")
        return doc

    async def accept(self, body: dict[str, Any], *, remote_addr: str | None) -> dict[str, Any]:
        """The other side of `pair`: check the proof against the open codes (a wrong one counts toward the
        lock), then keep the peer and answer with our certificate, our key for it and our proof."""
        listening = self._need_tls()
        assert self.identity is not None
        fields = _join_fields(body)
        own = identity.fingerprint(listening.server_pem.encode())

        def matches(code: str) -> bool:
            return fields["seen"] == own and hmac.compare_digest(
                str(body.get("proof", "")), pairing.proof(code, role="join", fields=fields)
            )

        code = self.gate.redeem(matches)
        taken = {s.name for s in self._specs_quiet()} | set(self.remotes.remotes)
        local = suggest_name(fields["name"], taken)
        host = fields["host"] or (remote_addr or "")
        issued = await self._issue(local)
        spec = PeerSpec(
            name=local,
            url=f"https://{_url_host(host)}:{fields['port']}/v1",
            server_cert=fields["server_cert"],
            client_cert=fields["client_cert"],
            client_fingerprint=identity.fingerprint(fields["client_cert"].encode()),
            issued_key=KEY_PREFIX + local,
            paired_at=time.time(),
        )
        try:
            spec = await asyncio.to_thread(self.store.add, spec, Secret(fields["key"]))
        except BaseException:
            await asyncio.to_thread(self._revoke, KEY_PREFIX + local)
            raise
        identity.accept_peers(listening.ctx, [spec.client_cert])
        self._attach(spec)
        self._later(self._check_soon(spec.name))  # the joiner trusts our certificate once we answer
        answer = {"name": socket.gethostname(), "client_cert": self.identity.pem, "key": issued.reveal()}
        return {**answer, "proof": pairing.proof(code, role="host", fields=answer)}

    async def _check_soon(self, name: str, *, delay: float = 1.0) -> None:
        await asyncio.sleep(delay)
        with contextlib.suppress(Exception):  # the state says what happened; the next round tries again
            await self.remotes.check(name)
            await self._learn(name)

    async def _issue(self, name: str) -> Secret:
        """A fresh key for peer `name` in keys.json (an old one of that name, left by a crash, replaced)."""
        await asyncio.to_thread(self._revoke, KEY_PREFIX + name)
        created = await asyncio.to_thread(self.keys.create, KEY_PREFIX + name)
        return created.secret

    def _revoke(self, key_name: str) -> None:
        with contextlib.suppress(KeyNotFoundError):
            self.keys.revoke(key_name)

    # ---- using and removing ----------------------------------------------------------------------------
    def peer_of_key(self, client: str) -> PeerSpec | None:
        """The peer a key of keys.json was issued to (None for an ordinary client's key)."""
        return next((s for s in self._specs_quiet() if s.issued_key == client), None)

    def peer_of_certificate(self, fingerprint: str | None) -> PeerSpec | None:
        """The peer whose pinned client certificate has `fingerprint`."""
        if fingerprint is None:
            return None
        return next((s for s in self._specs_quiet() if s.client_fingerprint == fingerprint), None)

    def get(self, name: str) -> PeerSpec:
        return self.store.get(name)

    def session(self, name: str) -> aiohttp.ClientSession:
        """The pinned mutual-TLS session to a peer (for the split lane's tunnels)."""
        try:
            return self._sessions[name]
        except KeyError:
            raise PeerUnavailableError(
                f"peer {name!r} is not paired with this machine (`switchyard peers ls`)"
            ) from None

    async def check(self, name: str) -> dict[str, Any]:
        """Health now, and the peer's own hardware probe and models."""
        spec = self.store.get(name)
        remote = await self.remotes.check(spec.name)
        if remote.state == RemoteState.READY:
            await self._learn(spec.name)
        doc = self.describe(spec)
        if spec.name in self._info:
            doc["info"] = self._info[spec.name]
        return doc

    async def _learn(self, name: str) -> None:
        """Keep the peer's own hardware probe and model list (shown by ls, the API and check)."""
        info = await self.ask(name, "GET", "/peer/info")
        if isinstance(info, dict):
            self._info[name] = {**info, "at": time.time()}

    async def ask(self, name: str, method: str, path: str, body: Any = None) -> Any:
        """One call to a peer's /peer/... routes over the pinned link, with its key (and `body` as JSON)."""
        session = self.session(name)
        remote = self.remotes.get(name)
        try:
            async with session.request(
                method,
                remote.base + path,
                headers=remote.headers(),
                json=body,
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
            ) as r:
                doc = await r.json(content_type=None)
                if r.status >= 400:
                    msg = doc.get("error", {}).get("message") if isinstance(doc, dict) else None
                    raise PeerUnavailableError(f"peer {name!r} answered {path} with HTTP {r.status}: {msg}")
                return doc
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise PeerUnavailableError(f"peer {name!r} does not answer ({describe(exc)})") from exc

    async def remove(self, name: str, *, tell: bool = True) -> PeerSpec:
        """Forget a peer: its models leave at once, its key to us is revoked, its certificate is no longer
        accepted; `tell`: ask it to forget us too (best effort: it may be off)."""
        spec = self.store.get(name)
        if tell and name in self._sessions:
            with contextlib.suppress(PeerUnavailableError):
                await self.ask(name, "DELETE", LINK_PATH)
        await self._detach(name)
        await self.workers.stop_peer(name)  # what it borrowed here ends with the pairing
        await self.nodes.stop_peer(name)
        self._info.pop(name, None)
        await asyncio.to_thread(self.store.remove, name)
        await asyncio.to_thread(self._revoke, spec.issued_key)
        return spec

    def describe(self, spec: PeerSpec) -> dict[str, Any]:
        remote = self.remotes.remotes.get(spec.name)
        doc: dict[str, Any] = {
            "name": spec.name,
            "url": spec.url,
            "fingerprint": identity.fingerprint(spec.server_cert.encode()),
            "client_fingerprint": spec.client_fingerprint,
            "paired_at": spec.paired_at,
            "key_kept": spec.key_kept,
            "key": self.store.key(spec.name)[1],
            "hardware": self._info.get(spec.name, {}).get("hardware"),  # from the peer's own probe
            "hardware_at": self._info.get(spec.name, {}).get("at"),
            # the user's word that the network to it is trusted (multi-node vLLM/SGLang traffic is plain)
            "trusted_network": spec.trusted_network,
            "rpc": self._info.get(spec.name, {}).get("rpc"),  # the RPC build it lends a split, if any
        }
        if remote is not None:
            pub = remote.public()
            doc |= {k: pub[k] for k in ("state", "error", "checked_at", "models", "in_flight")}
        else:
            doc |= {"state": "detached", "error": None, "models": []}
        return doc

    def public(self) -> dict[str, Any]:
        return {
            "peers": [self.describe(s) for s in self._specs_quiet()],
            "pairing": {**self.gate.public(), "tls": self.listening is not None},
            "fingerprint": identity.fingerprint(self.listening.server_pem.encode())
            if self.listening
            else None,
            "client_fingerprint": self.identity.fingerprint if self.identity else None,
        }


def _bare(fp: str) -> str:
    return fp.replace(":", "").replace(" ", "").upper()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _own_addresses() -> set[str]:
    import psutil

    out = set()
    with contextlib.suppress(Exception):
        for snics in psutil.net_if_addrs().values():
            for s in snics:
                if s.family == socket.AF_INET and not s.address.startswith("127."):
                    out.add(s.address)
    return out


def _text(body: dict[str, Any], key: str, *, limit: int = 16384) -> str:
    value = body.get(key)
    if not isinstance(value, str) or len(value) > limit:
        raise BadRequestError(f"pairing field {key!r} is missing or not text", param=key)
    return value


def _join_fields(body: dict[str, Any]) -> dict[str, Any]:
    port = body.get("port")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise BadRequestError("pairing field 'port' must be the joiner's port", param="port")
    fields: dict[str, Any] = {
        k: _text(body, k) for k in ("name", "host", "server_cert", "client_cert", "key", "seen")
    }
    for pem in ("server_cert", "client_cert"):
        try:
            identity.fingerprint(fields[pem].encode())
        except ValueError as exc:
            raise BadRequestError(f"pairing field {pem!r} is not a PEM certificate", param=pem) from exc
    return {**fields, "port": port}


def _answer_fields(doc: dict[str, Any]) -> dict[str, Any]:
    fields = {k: _text(doc, k) for k in ("name", "client_cert", "key")}
    try:
        identity.fingerprint(fields["client_cert"].encode())
    except ValueError as exc:
        raise PairingRefusedError("the peer's answer holds no valid client certificate") from exc
    return fields
