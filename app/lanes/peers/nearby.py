"""mDNS: which machines nearby run Switchyard ready to pair. A hint to save typing an address, never trust.

A server whose TLS site is armed for peers announces the service `_switchyard._tcp.local.` (setting
`peers_announce`: app/server/admin/peers.py decides when) with its machine name, port and certificate
fingerprint, never a key or a code. `browse` listens for a few seconds and lists what answered.

Nothing learnt here is believed: anyone on the network can announce anything. Pairing still takes the
one-time code shown on the other machine, and the line offered here passes the announced fingerprint to
`peers add --fingerprint`, which refuses a machine whose TLS handshake presents another certificate
(registry.py `pair`), before the code is sent; so a spoofed announcement cannot pair, and the typed
address works as it always did. zeroconf is imported only to announce or browse: a server that does
neither (plain HTTP, loopback) never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import re
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.core.public import Public

if TYPE_CHECKING:
    from app.lanes.peers.registry import PeerRegistry

log = logging.getLogger(__name__)

SERVICE = "_switchyard._tcp.local."
PROTOCOL = "1"  # the TXT record's layout; a browser skips announcements of layouts it does not know
BROWSE_S = 3.0  # mDNS answers within about a second; three leave room for a busy network
LOOKUP_MS = 1500
_FINGERPRINT = re.compile(r"(?:[0-9A-F]{2}:){31}[0-9A-F]{2}")
_LABEL = re.compile(r"[^A-Za-z0-9-]+")


@dataclass(frozen=True)
class Announcement:
    """What this server says about itself: `hosts` are the addresses it is dialled at (bound to one
    address: that one; bound to all: this machine's own, app/lanes/peers/registry.py `addresses`)."""

    machine: str
    hosts: tuple[str, ...]
    port: int
    fingerprint: str
    everywhere: bool  # bound to every interface: answer on all of them, else only on `hosts`


@dataclass(frozen=True)
class Found(Public):
    """One machine that answered a browse, as it described itself (unverified)."""

    machine: str
    addresses: tuple[str, ...]
    port: int
    fingerprint: str

    def address(self) -> str:
        host = self.addresses[0]
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def add_command(self) -> str:
        """The pairing line to type (CODE: the one `switchyard peers invite` shows on that machine)."""
        return f"switchyard peers add {self.address()} --code CODE --fingerprint {self.fingerprint}"


def _label(machine: str) -> str:
    return _LABEL.sub("-", machine).strip("-")[:40] or "switchyard"


def _ip_version(hosts: tuple[str, ...]) -> Any:
    from zeroconf import IPVersion

    v6 = any(ipaddress.ip_address(h).version == 6 for h in hosts)
    v4 = any(ipaddress.ip_address(h).version == 4 for h in hosts)
    return IPVersion.All if v4 and v6 else IPVersion.V6Only if v6 else IPVersion.V4Only


def service_info(ann: Announcement) -> Any:
    """The zeroconf record of `ann`: instance `LABEL-PORT` (two servers on one machine differ by port)."""
    from zeroconf.asyncio import AsyncServiceInfo

    label = _label(ann.machine)
    return AsyncServiceInfo(
        SERVICE,
        f"{label}-{ann.port}.{SERVICE}",
        port=ann.port,
        properties={
            "protocol": PROTOCOL,
            "machine": ann.machine[:64],
            "port": str(ann.port),
            "fingerprint": ann.fingerprint,
        },
        server=f"{label}.local.",
        parsed_addresses=list(ann.hosts),
    )


class Announcer:
    """The mDNS responder of one server, owned by the admin app's cleanup context. `announce` and
    `withdraw` are called from synchronous code (the TLS site's arm and disarm) and run in order on the
    loop; a failure (no multicast here, port 5353 refused) is logged and kept in `problem`, never raised:
    the typed address works without it."""

    def __init__(self) -> None:
        self._zc: Any = None
        self._chain: asyncio.Task[None] | None = None
        self.current: Announcement | None = None
        self.problem: str | None = None

    def announce(self, ann: Announcement) -> None:
        self._then(ann)

    def withdraw(self) -> None:
        self._then(None)

    async def settle(self) -> None:
        """Wait until every change asked for so far is on the network (or has failed)."""
        while self._chain is not None and not self._chain.done():
            await asyncio.wait([self._chain])

    async def aclose(self) -> None:
        self.withdraw()
        await self.settle()

    def public(self) -> dict[str, Any]:
        return {
            "announcing": self.current is not None and self._zc is not None,
            "service": SERVICE,
            "problem": self.problem,
        }

    def _then(self, ann: Announcement | None) -> None:
        before = self._chain
        self._chain = asyncio.get_running_loop().create_task(self._switch(before, ann))

    async def _switch(self, before: asyncio.Task[None] | None, ann: Announcement | None) -> None:
        if before is not None:
            await asyncio.wait([before])  # never raises: each step catches its own failures
        await self._stop()
        if ann is not None:
            await self._start(ann)

    async def _start(self, ann: Announcement) -> None:
        from zeroconf import Error as ZeroconfError
        from zeroconf import InterfaceChoice
        from zeroconf.asyncio import AsyncZeroconf

        try:
            ann = dataclasses.replace(ann, hosts=await _numeric(ann.hosts))
            info = service_info(ann)
            interfaces = InterfaceChoice.All if ann.everywhere else list(ann.hosts)
            self._zc = AsyncZeroconf(interfaces=interfaces, ip_version=_ip_version(ann.hosts))
            sent = await self._zc.async_register_service(info, allow_name_change=True)
            await sent
        except (OSError, ValueError, ZeroconfError) as exc:
            self.problem = f"could not announce this machine on mDNS ({exc!r}); type its address instead"
            log.warning("peers: %s", self.problem)
            await self._stop()
            return
        self.current, self.problem = ann, None
        log.info("peers: announcing %s on mDNS at %s", info.name, ", ".join(ann.hosts))

    async def _stop(self) -> None:
        zc, self._zc, self.current = self._zc, None, None
        if zc is not None:
            with contextlib.suppress(Exception):  # best effort: the records expire on their own anyway
                await zc.async_unregister_all_services()  # goodbyes: browsers drop it at once
            with contextlib.suppress(Exception):
                await zc.async_close()


async def _numeric(hosts: tuple[str, ...]) -> tuple[str, ...]:
    """The addresses of `hosts` (a server bound by name, --host desk.lan, is announced by its addresses)."""
    out: list[str] = []
    for host in hosts:
        try:
            out.append(str(ipaddress.ip_address(host)))
        except ValueError:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
            out += [str(i[4][0]) for i in infos if str(i[4][0]) not in out]
    return tuple(dict.fromkeys(out))


def _read(info: Any) -> Found | None:
    """A Found from a resolved record, or None when it is not a Switchyard announcement we can use."""
    props = info.decoded_properties
    fingerprint = str(props.get("fingerprint") or "").upper()
    addresses = tuple(info.parsed_addresses())
    if props.get("protocol") != PROTOCOL or not _FINGERPRINT.fullmatch(fingerprint) or not addresses:
        return None
    if not isinstance(info.port, int) or not 0 < info.port < 65536:
        return None
    machine = str(props.get("machine") or "").strip()[:64] or info.name.removesuffix("." + SERVICE)
    return Found(machine=machine, addresses=addresses, port=info.port, fingerprint=fingerprint)


async def browse(*, seconds: float = BROWSE_S) -> list[Found]:
    """The machines announcing Switchyard that answer within `seconds`, each once (by fingerprint and
    port), sorted by machine name. OSError when mDNS cannot listen here at all."""
    from zeroconf import InterfaceChoice, IPVersion, ServiceStateChange
    from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

    try:
        zc = AsyncZeroconf(interfaces=InterfaceChoice.All, ip_version=IPVersion.All)
    except OSError:  # a machine without IPv6 (disabled in the kernel): IPv4 announcements still come
        zc = AsyncZeroconf(interfaces=InterfaceChoice.All, ip_version=IPVersion.V4Only)
    names: set[str] = set()

    def seen(*, zeroconf: Any, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change is ServiceStateChange.Removed:
            names.discard(name)
        else:
            names.add(name)

    try:
        browser = AsyncServiceBrowser(zc.zeroconf, SERVICE, handlers=[seen])
        await asyncio.sleep(seconds)
        infos = [AsyncServiceInfo(SERVICE, name) for name in sorted(names)]
        await asyncio.gather(*(i.async_request(zc.zeroconf, LOOKUP_MS) for i in infos))
        await browser.async_cancel()
    finally:
        await zc.async_close()
    found: dict[tuple[str, int], Found] = {}
    for info in infos:
        item = _read(info)
        if item is not None:
            found.setdefault((item.fingerprint, item.port), item)
    return sorted(found.values(), key=lambda f: (f.machine.lower(), f.port))


def listing(found: list[Found], *, own: str | None, paired: dict[str, str]) -> list[dict[str, Any]]:
    """What `peers nearby` shows: each machine but this one, with the peer name it is paired as (matched
    by the certificate fingerprint it announced) or the pairing line to type."""
    out = []
    for f in found:
        if own is not None and f.fingerprint == own:
            continue
        name = paired.get(f.fingerprint)
        out.append({**f.public(), "address": f.address(), "paired": name, "add_command": f.add_command()})
    return out


async def around(peers: PeerRegistry, *, seconds: float = BROWSE_S) -> list[dict[str, Any]]:
    """`listing` of a browse, against this server's certificate and paired peers (the admin API's and the
    window's list). OSError when mDNS cannot listen here."""
    found = await browse(seconds=seconds)
    doc = peers.public()
    paired = {p["fingerprint"]: p["name"] for p in doc["peers"]}
    return listing(found, own=doc["fingerprint"], paired=paired)
