"""Addresses an outgoing request of the server must not reach, checked when it connects.

aiohttp connects to a host of digits and dots, or one with a colon, without asking its resolver (`127.1`,
`2130706433` and `[::ffff:127.0.0.1]` all reach loopback), so such a host is read here the way the
connection will read it; a name is checked by `GuardedResolver` on every address it resolves to, at the
moment it is connected to (a name that changes its answer gains nothing).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

import aiohttp
import psutil
from aiohttp.abc import AbstractResolver, ResolveResult


def literal_addresses(host: str) -> set[str] | None:
    """The addresses a host that aiohttp takes as an IP literal connects to; None for a name. ValueError
    for a literal-looking host that is no address."""
    if not (":" in host or host.replace(".", "").isdigit()):
        return None
    try:
        return {str(a[4][0]) for a in socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)}
    except (OSError, UnicodeError):
        raise ValueError(f"{host!r} is neither a name nor an IP address") from None


def _plain(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def own_addresses() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Every address of this machine's interfaces (a server bound to all of them answers on each)."""
    found = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    found.add(_plain(a.address))
                except ValueError:
                    continue
    return found


def is_this_machine(address: str) -> bool:
    """Whether an address reaches this machine: loopback, unspecified, or one of its interfaces'."""
    ip = _plain(address)
    return ip.is_loopback or ip.is_unspecified or ip in own_addresses()


class GuardedResolver(AbstractResolver):
    """aiohttp's threaded resolver, refusing a name when `refuse(host, address)` returns an error for any
    of its addresses."""

    def __init__(self, refuse: Callable[[str, str], Exception | None]) -> None:
        self._inner = aiohttp.ThreadedResolver()
        self._refuse = refuse

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        for r in found:
            if (error := self._refuse(host, r["host"])) is not None:
                raise error
        return found

    async def close(self) -> None:
        await self._inner.close()
