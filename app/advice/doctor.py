"""`switchyard doctor`: the hardware snapshot, each lane's install state, and anything wrong;
`switchyard doctor versions`: only the versions (Switchyard, Python, each engine, each package it runs on)."""

from __future__ import annotations

import platform
import re
import shutil
import socket
from importlib import metadata
from typing import Any

from app import __version__
from app.core.errors import SettingsError
from app.core.paths import Paths
from app.core.pins import PinStore
from app.core.settings import Settings
from app.core.units import fmt_bytes
from app.hardware.probe import probe
from app.lanes.engines.registry import default_lane
from app.lanes.install.installed import installed_lanes, lane_report
from app.lanes.install.runtimes import doctor_rows
from app.library.opening import opened_catalog

LOW_DISK = 10 << 30
# the extras whose packages a user runs on; "test" and "package" are for building Switchyard itself
USER_EXTRAS = ("gui",)
_REQ_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _problem(level: str, message: str) -> dict[str, str]:
    return {"level": level, "message": message}


def doctor(paths: Paths, *, settings: Settings, remotes: list[dict[str, Any]]) -> dict[str, Any]:
    """`remotes`: each remote lane's row (the CLI asks the running server, else checks from here)."""
    problems: list[dict[str, str]] = []
    hw = probe(bandwidth_cache=paths.hardware_cache)
    for note in hw.notes:
        # NVML absent on a machine without an NVIDIA card is normal; say it quietly
        problems.append(_problem("info", note))
    if not hw.gpus:
        problems.append(_problem("info", "no GPU found: models run on the CPU"))
    lanes = installed_lanes(settings)
    first = default_lane("gguf")  # the lane a GGUF chat model runs on: without it, nothing runs
    if first is not None and not lanes[first].installed:
        problems.append(
            _problem("error", "no llama.cpp runtime: `pip install xllamacpp` or put llama-server on PATH")
        )
    paths.home.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(paths.home).free
    if free < LOW_DISK:
        problems.append(
            _problem(
                "warning",
                f"only {fmt_bytes(free)} free in {paths.home}: downloads of large models will not fit",
            )
        )
    try:
        PinStore(paths.pins_file).all()
    except SettingsError as exc:
        problems.append(_problem("error", exc.message))
    dirs = settings.library.models_dirs or (paths.models,)
    with opened_catalog(settings, paths) as (_library, catalog):
        entries = catalog.scan()
    for e in entries:
        if e.problem is not None:
            problems.append(_problem("warning", f"model {e.id} ({e.path}) is broken: {e.problem}"))
    with socket.socket() as s:
        try:
            s.bind((settings.server.host, settings.server.port))
        except OSError:
            problems.append(
                _problem(
                    "info",
                    f"port {settings.server.port} is in use (a running Switchyard server, or "
                    "another program: `switchyard serve --port N` picks another)",
                )
            )
    for r in remotes:
        if r["state"] != "ready":
            problems.append(_problem("warning", r["error"] or f"remote {r['name']} is {r['state']}"))
    return {
        "home": str(paths.home),
        "disk_free": free,
        "hardware": hw.public(),
        "lanes": lane_report(settings, hw),
        "models": {
            "dirs": [str(d) for d in dirs],
            "servable": sum(e.ok for e in entries),
            "broken": sum(e.problem is not None for e in entries),
            "no_lane_yet": sum(e.problem is None and not e.ok for e in entries),
        },
        "remotes": remotes,
        # the llama.cpp runtimes in the order `runtime = "auto"` tries them, each chosen or skipped with why
        "runtimes": doctor_rows(settings, hw),
        "problems": problems,
    }


def render_doctor(r: dict[str, Any]) -> str:
    hw = r["hardware"]
    mem = hw["memory"]
    lines = [
        f"home:      {r['home']} ({fmt_bytes(r['disk_free'])} free)",
        f"system:    {hw['os']} {hw['arch']}",
        f"cpu:       {hw['cpu']['model_name'] or 'unknown'}; {hw['cpu']['usable_cores']} usable cores "
        f"(of {hw['cpu']['logical_cores'] or '?'} logical)",
        f"memory:    {fmt_bytes(mem['total'] or 0)} total, "
        f"{fmt_bytes(mem['available'] or 0)} available"
        + (f", cgroup limit {fmt_bytes(mem['cgroup_limit'])}" if mem.get("cgroup_limit") else ""),
    ]
    bw = hw.get("bandwidth")
    if bw:
        lines.append(
            f"bandwidth: {bw['single_core'] / 1e9:.1f} GB/s one core, {bw['all_cores'] / 1e9:.1f} GB/s "
            f"all cores (copy)"
        )
    for g in hw["gpus"] or []:
        total = fmt_bytes(g["memory_total"]) if g["memory_total"] else "shared memory"
        speed = f", {gbw / 1e9:.0f} GB/s" if (gbw := g.get("memory_bandwidth")) else ""
        lines.append(
            f"gpu {g['index']}:     {g['name']} ({g['vendor']}), {total}, "
            f"driver {g['driver_version'] or '?'}{speed}"
        )
    for d in hw["engine_devices"]:
        lines.append(f"llama.cpp: sees {d['name']} ({d['description']})")
    lines.append("lanes:")
    for ln in r["lanes"]:
        state = "installed" if ln["installed"] else "not available"
        extra = f" - {ln['version']}" if ln["version"] else ""
        if ln.get("can_start"):
            can = "; can start here"
        else:
            can = f"; cannot start here: {ln.get('why_not') or ln['note']}"
        lines.append(f"  {ln['lane']:<12} {state}{extra}{can}")
    m = r["models"]
    lines.append(
        f"models:    {m['servable']} servable, {m['broken']} broken, {m['no_lane_yet']} with no lane yet"
        f" in {', '.join(m['dirs'])}"
    )
    if r.get("runtimes"):
        lines.append("llama.cpp runtimes, in the order tried:")
        for row in r["runtimes"]:
            why = f": {row['reason']}" if row.get("reason") else ""
            lines.append(f"  {row['runtime']:<12} {row['state']}{why}")
    if r.get("remotes"):
        lines.append("remotes:")
        for rem in r["remotes"]:
            n = len(rem["models"])
            lines.append(
                f"  {rem['name']:<12} {rem['state']} - {rem['url']}; {n} model{'s' if n != 1 else ''}"
            )
    if r["problems"]:
        lines.append("notes:")
        lines += [f"  [{p['level']}] {p['message']}" for p in r["problems"]]
    return "\n".join(lines)


def _packages() -> list[str]:
    """The distributions Switchyard declares (core and the gui extra), from its installed metadata;
    empty where that metadata is absent (a frozen build)."""
    try:
        reqs = metadata.requires("switchyard") or []
    except metadata.PackageNotFoundError:
        return []
    names: list[str] = []
    for req in reqs:
        extra = _EXTRA.search(req)
        found = _REQ_NAME.match(req)
        if found and (extra is None or extra.group(1) in USER_EXTRAS) and found.group(0) not in names:
            names.append(found.group(0))
    return names


def _installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions(*, settings: Settings) -> dict[str, Any]:
    """Switchyard's version, Python's, each lane's engine (None: not installed) and each declared package
    (None: not installed); nothing is probed beyond what is installed."""
    return {
        "switchyard": __version__,
        "python": platform.python_version(),
        "engines": {
            lane: install.version if install.installed else None
            for lane, install in installed_lanes(settings).items()
        },
        "packages": {name: _installed_version(name) for name in _packages()},
    }


def render_versions(v: dict[str, Any]) -> str:
    lines = [f"switchyard {v['switchyard']}", f"python     {v['python']}", "engines:"]
    lines += [f"  {lane:<12} {ver or 'not installed'}" for lane, ver in v["engines"].items()]
    lines.append("packages:")
    lines += [f"  {name:<20} {ver or 'not installed'}" for name, ver in v["packages"].items()]
    return "\n".join(lines)
