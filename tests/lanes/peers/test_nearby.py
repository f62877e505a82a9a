"""Finding machines nearby on mDNS (app/lanes/peers/nearby.py): a hint that never pairs by itself.

Real zeroconf responders and browsers on this machine (multicast works on its loopback and its network
interface: several processes see each other's announcements), and real `switchyard serve --tls`
processes: one that announces (peers_announce on), one that keeps quiet on loopback (auto), a spoofed
announcement that names a real server's address with another fingerprint and cannot pair with it even
with the right code, and the line `peers nearby` shows pairing for real.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from app.core.errors import SettingsError
from app.core.paths import Paths
from app.core.settings import Settings
from app.lanes.peers import identity, nearby
from app.runtime import Runtime
from app.server import tls
from app.server.admin import peers as routes_peers
from app.server.admin.peers import announce_wanted
from app.server.app import make_app
from tests.conftest import ServerProcess
from tests.lanes.peers.test_peers_serve import cli

FAKE = ":".join(["5A"] * 32)  # a fingerprint no certificate here has


def announcement(port: int, *, machine: str = "bench", fingerprint: str = FAKE) -> nearby.Announcement:
    return nearby.Announcement(
        machine=machine, hosts=("127.0.0.1",), port=port, fingerprint=fingerprint, everywhere=False
    )


def mine(found: list[nearby.Found], port: int) -> list[nearby.Found]:
    """What a browse found of ours (other tests or machines may announce Switchyard at the same time)."""
    return [f for f in found if f.port == port]


# ---- when to announce ----------------------------------------------------------------------------------
def test_auto_announces_only_beyond_loopback_and_the_setting_is_checked() -> None:
    assert Settings().server.peers_announce == "auto"
    assert announce_wanted("auto", host="0.0.0.0") and announce_wanted("auto", host="192.168.1.20")
    assert not announce_wanted("auto", host="127.0.0.1") and not announce_wanted("auto", host="::1")
    assert not announce_wanted("auto", host="localhost")
    assert announce_wanted("on", host="127.0.0.1")
    assert not announce_wanted("off", host="0.0.0.0")
    with pytest.raises(SettingsError, match="peers_announce must be auto"):
        Settings.flat(peers_announce="yes")


def test_the_listing_marks_paired_machines_and_leaves_this_one_out() -> None:
    own, theirs, other = (":".join([b] * 32) for b in ("11", "22", "33"))
    found = [
        nearby.Found(machine="me", addresses=("10.0.0.1",), port=1, fingerprint=own),
        nearby.Found(machine="desk", addresses=("10.0.0.2",), port=8686, fingerprint=theirs),
        nearby.Found(machine="new", addresses=("fd00::7", "10.0.0.3"), port=9, fingerprint=other),
    ]
    rows = nearby.listing(found, own=own, paired={theirs: "desk"})
    assert [(r["machine"], r["paired"]) for r in rows] == [("desk", "desk"), ("new", None)]
    assert rows[1]["address"] == "[fd00::7]:9"
    assert rows[1]["add_command"] == f"switchyard peers add [fd00::7]:9 --code CODE --fingerprint {other}"


# ---- two real zeroconf instances in one process ------------------------------------------------------------
async def test_an_announcement_is_found_with_its_fingerprint_and_goes_with_withdraw(
    unused_tcp_port: int,
) -> None:
    """Beside it, another program's records under our service name, or damaged ones: left out, not shown
    wrong."""
    from zeroconf.asyncio import AsyncServiceInfo

    port = unused_tcp_port
    announcer = nearby.Announcer()
    announcer.announce(announcement(port))
    other = nearby_zeroconf()
    odd = [
        {"protocol": "1", "machine": "short", "fingerprint": "AB:CD"},
        {"protocol": "9", "machine": "future", "fingerprint": FAKE},
        {"machine": "none", "fingerprint": FAKE},
    ]
    try:
        sent = [
            await other.async_register_service(
                AsyncServiceInfo(
                    nearby.SERVICE,
                    f"odd{i}-{port}.{nearby.SERVICE}",
                    port=port,
                    properties=props,
                    server="odd.local.",
                    parsed_addresses=["127.0.0.1"],
                )
            )
            for i, props in enumerate(odd)
        ]
        await asyncio.gather(*sent, announcer.settle())
        assert announcer.public()["announcing"] and announcer.public()["problem"] is None
        found = mine(await nearby.browse(seconds=1.5), port)
        assert found == [nearby.Found(machine="bench", addresses=("127.0.0.1",), port=port, fingerprint=FAKE)]
        # what the record says: these four and nothing else (never a key or a code)
        info = await other.async_get_service_info(nearby.SERVICE, f"bench-{port}.{nearby.SERVICE}")
        assert info is not None
        assert info.decoded_properties == {
            "protocol": "1",
            "machine": "bench",
            "port": str(port),
            "fingerprint": FAKE,
        }
    finally:
        await other.async_close()
        announcer.withdraw()
        await announcer.settle()
    assert not announcer.public()["announcing"]
    assert mine(await nearby.browse(seconds=1.5), port) == []


def nearby_zeroconf() -> Any:
    from zeroconf.asyncio import AsyncZeroconf

    return AsyncZeroconf(interfaces=["127.0.0.1"])


# ---- real servers ----------------------------------------------------------------------------------------
def nearby_json(server: ServerProcess) -> dict[str, Any]:
    done = cli(server, "nearby", "--seconds", "2", "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def port_of(server: ServerProcess) -> int:
    return int(server.url.rsplit(":", 1)[1])


@pytest.fixture
def pair_of(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """a: the default (auto) on loopback, so silent; b: peers_announce on."""
    empty = tmp_path / "empty"
    empty.mkdir()
    started: list[ServerProcess] = []
    try:
        for name, mode in (("a", "auto"), ("b", "on")):
            home = tmp_path / name
            home.mkdir()
            (home / "settings.json").write_text(json.dumps({"peers_announce": mode, "offline": True}))
            started.append(ServerProcess(home, empty, "--tls"))
        a, b = (s.wait_ready(60) for s in started)
        yield a, b
    finally:
        for s in started:
            s.stop()


def test_nearby_lists_the_announcing_server_and_its_line_pairs_a_spoof_cannot(
    pair_of: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair_of
    b_fp = identity.fingerprint((b.home / "tls" / "cert.pem").read_bytes())

    async def spoofed() -> tuple[dict[str, Any], dict[str, Any], subprocess.CompletedProcess[str]]:
        # an impostor announces b's address under another fingerprint, as anyone on a network can
        impostor = nearby.Announcer()
        impostor.announce(announcement(port_of(b), machine="impostor"))
        await impostor.settle()
        try:
            seen_by_a = await asyncio.to_thread(nearby_json, a)
            seen_by_b = await asyncio.to_thread(nearby_json, b)
            code = json.loads((await asyncio.to_thread(cli, b, "invite", "--json")).stdout)["code"]
            line = next(m for m in seen_by_a["machines"] if m["machine"] == "impostor")["add_command"]
            tried = await asyncio.to_thread(cli, a, *line.replace("CODE", code).split()[2:])
        finally:
            await impostor.aclose()
        return seen_by_a, {"code": code, **seen_by_b}, tried

    seen_by_a, seen_by_b, tried = asyncio.run(spoofed())
    ours = {p for p in (port_of(a), port_of(b))}
    found = {m["machine"]: m for m in seen_by_a["machines"] if m["port"] in ours}
    assert set(found) == {"impostor", found_b_name(found, b_fp)}  # a itself is not listed
    real = next(m for m in found.values() if m["fingerprint"] == b_fp)
    assert real["address"] == f"127.0.0.1:{port_of(b)}" and real["paired"] is None
    assert (
        real["add_command"] == f"switchyard peers add 127.0.0.1:{port_of(b)} --code CODE --fingerprint {b_fp}"
    )
    assert seen_by_a["this_machine"]["announcing"] is False  # auto on loopback: silent
    assert seen_by_b["this_machine"]["announcing"] is True
    # a (auto on loopback) announced nothing: b finds only the impostor on these ports
    assert [m["machine"] for m in seen_by_b["machines"] if m["port"] in ours] == ["impostor"]

    # the spoof's line with b's real code: refused on the TLS handshake's certificate, before the code is sent
    assert tried.returncode == 2, tried.stdout + tried.stderr
    assert f"presented the certificate {b_fp}" in tried.stderr and "nothing was paired" in tried.stderr

    # b's own line with the same (unspent) code pairs; then a lists b as paired
    paired = cli(a, *real["add_command"].replace("CODE", seen_by_b["code"]).split()[2:])
    assert paired.returncode == 0, paired.stderr
    again = {m["fingerprint"]: m for m in nearby_json(a)["machines"]}
    assert again[b_fp]["paired"] is not None
    assert "impostor" not in {m["machine"] for m in again.values()}  # withdrawn

    # human output: the table and the line to type
    text = cli(a, "nearby", "--seconds", "1").stdout
    assert "MACHINE" in text and f"127.0.0.1:{port_of(b)}" in text

    # b stops: it is no longer announced
    assert b.stop() == 0
    assert b_fp not in {m["fingerprint"] for m in nearby_json(a)["machines"]}


def found_b_name(found: dict[str, dict[str, Any]], fp: str) -> str:
    return next(name for name, m in found.items() if m["fingerprint"] == fp)


async def test_the_admin_app_announces_while_armed_and_browses_only_with_tls(
    tmp_path: Path, unused_tcp_port: int
) -> None:
    """The server's own path (the window's Start and Stop call the same arm and disarm)."""
    settings = Settings.flat(
        plan_memory=False, monitor_interval_s=0, models_dirs=(tmp_path / "none",), peers_announce="on"
    )
    paths = Paths(home=tmp_path / "home")
    app = make_app(Runtime(settings=settings, paths=paths))
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/api/peers/nearby")
        assert r.status == 409 and (await r.json())["error"]["code"] == "peers_need_tls"
        material = tls.material_for(settings, paths, use_tls=True)
        assert material is not None
        cert_pem = material.cert.read_text()
        port = unused_tcp_port
        routes_peers.arm(
            app, cert_pem=cert_pem, ctx=tls.server_context(material), host="127.0.0.1", port=port
        )
        await app[routes_peers.ANNOUNCER].settle()
        own = identity.fingerprint(cert_pem.encode())
        assert [f.fingerprint for f in mine(await nearby.browse(seconds=1.5), port)] == [own]
        for bad in ("0.5", "nan", "11", "soon"):
            r = await client.get(f"/api/peers/nearby?seconds={bad}")
            assert r.status == 400 and "from 1 to 10" in (await r.json())["error"]["message"]
        doc = await (await client.get("/api/peers/nearby?seconds=1")).json()
        assert doc["this_machine"]["announcing"] is True
        assert [m for m in doc["machines"] if m["port"] == port] == []  # this machine is not offered
        routes_peers.disarm(app)
        await app[routes_peers.ANNOUNCER].settle()
        assert mine(await nearby.browse(seconds=1.5), port) == []
