"""One row per engine for `switchyard engine ls`, GET /api/engines and the Lanes page.

An engine is found in one of three places, in this order: its own environment under the data dir
(`managed`), Switchyard's own interpreter (`app`, a pip install beside Switchyard), or a binary on PATH or
configured (`path`: llama-server, sd-server), which is used as it is and never installed or updated here.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from app.core.errors import EngineStateError
from app.core.settings import Settings
from app.hardware.build_choice import choose_build
from app.hardware.model import Hardware
from app.lanes.engine_store import EngineState, EngineStore, load_manifest
from app.lanes.kind import dist_version
from app.lanes.kinds import engine_kinds
from app.lanes.runtimes import choose_runtime, machine_now
from app.routing.engines import LANES, title


def engine_rows(
    settings: Settings, hardware: Hardware | None, *, store: EngineStore | None = None
) -> list[dict[str, Any]]:
    store = store or EngineStore.default()
    kinds = engine_kinds()
    manifest = load_manifest()
    rows: list[dict[str, Any]] = []
    for lane in (x for x in LANES if x in kinds or x in manifest):
        kind, spec = kinds.get(lane), manifest.get(lane)
        problem = None
        try:
            state = store.read(lane) if spec else EngineState()
        except EngineStateError as exc:
            state, problem = EngineState(), exc.message
        managed = store.current(lane) if spec else None
        install = kind.install(settings) if kind else None
        where, version, path = None, None, None
        if managed is not None:
            where, version, path = "managed", managed.version, str(managed.venv)
        elif install is not None and install.installed:
            in_app = spec is not None and importlib.util.find_spec(spec.module) is not None
            if in_app and spec is not None:
                where, version = "app", dist_version(spec.dist)
                path = sys.executable
            else:  # a binary: its own text says which and where ("llama-server at /usr/bin/...")
                text = install.version or ""
                where, path = "path", text.split(" at ", 1)[1] if " at " in text else None
                version = text.split(" at ", 1)[0] or None
        if kind is None:
            refusal: str | None = f"Switchyard has no {title(lane)} lane yet"
        else:
            refusal = kind.start_refusal(settings, hardware)
        rows.append(
            {
                "engine": lane,
                "title": title(lane),
                "installed": where is not None,
                "version": version,
                "where": where,
                "path": path,
                "dist": spec.dist if spec else None,
                "manifest_version": spec.version if spec else None,
                "pinned": state.pinned or (spec.version if spec else None),
                "pinned_by": "you" if state.pinned else ("manifest" if spec else None),
                "previous": state.previous.version if state.previous else None,
                "installable": spec is not None,
                "can_start": refusal is None,
                "health": "ok" if refusal is None else refusal,
                "problem": problem,
                **build_fields(lane, settings, hardware),
            }
        )
    return rows


def build_fields(lane: str, settings: Settings, hardware: Hardware | None) -> dict[str, Any]:
    """`build` (cpu, cuda12, cuda13, rocm, vulkan, metal; None: unknown) and `build_why` for one engine:
    llama.cpp's from the runtime chosen, the Python engines' from the probe (the package that carries it)."""
    if lane == "llama.cpp":
        choice = choose_runtime(settings, hardware)
        return {"build": choice.build, "build_why": choice.why, "runtime": choice.runtime}
    chosen = choose_build(lane, machine_now(hardware))
    why = f"{chosen.reason} ({chosen.package})" if chosen.package else chosen.reason
    return {"build": chosen.build, "build_why": why, "runtime": None}
