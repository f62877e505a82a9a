"""One row per engine for `switchyard engine ls`, GET /api/engines and the Lanes page.

An engine is found in one of these places, in this order: its own environment under the data dir
(`managed`), an upstream image that docker or podman runs (`container`: vLLM, SGLang without their
package; the image is the path), Switchyard's own interpreter (`app`, a pip install beside Switchyard), or
a binary on PATH or configured (`path`: llama-server, sd-server), which is used as it is and never
installed or updated here. The capability lane `llama.cpp-compat` is found only as a build registered
with `engine register` (`registered`: the interpreter or binary is the path) or in its own environment:
it never runs on the app's interpreter.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass, replace
from typing import Any

from app.core.errors import EngineStateError
from app.core.settings import Settings
from app.hardware.build_choice import ONE_BUILD, choose_build
from app.hardware.model import Hardware
from app.lanes.engines.kind import EngineKind, FoundByRegistration, KnowsOwnBuild, dist_version
from app.lanes.engines.registry import engine_kinds, kind_of
from app.lanes.install.containers import load_images
from app.lanes.install.engine import build_status
from app.lanes.install.runtimes import CONTAINER_CLIS, machine_now
from app.lanes.install.store import EngineSpec, EngineState, EngineStore, ManagedEngine, load_manifest
from app.routing.engines import LANES, title
from app.routing.model import LaneInstall


def engine_rows(
    settings: Settings, hardware: Hardware | None, *, store: EngineStore | None = None
) -> list[dict[str, Any]]:
    """One row per lane; each carries where the engine is found (the module doc), its health, the build
    this machine calls for and, for an engine Switchyard installs, the build installed (build_status).
    Without a snapshot the GPUs are probed once (milliseconds)."""
    store = store or EngineStore.default()
    kinds = engine_kinds()
    manifest = load_manifest()
    machine = machine_now(hardware)
    rows: list[dict[str, Any]] = []
    for lane in (x for x in LANES if x in kinds or x in manifest):
        kind, spec = kinds.get(lane), manifest.get(lane)
        problem = None
        try:
            state = store.read(lane) if spec else EngineState()
        except EngineStateError as exc:
            state, problem = EngineState(), exc.message
        install = kind.install(settings) if kind else None
        found = _where(lane, spec, store, install, kind)
        builds = build_fields(lane, settings, hardware, machine=machine)
        if found.where == "container" and found.runtime is not None:
            found = _tagged(lane, found, builds["build"])
            builds["runtime"] = found.runtime
        if kind is None:
            refusal: str | None = f"Switchyard has no {title(lane)} lane yet"
        else:
            refusal = kind.start_refusal(settings, hardware)
        rows.append(
            {
                "engine": lane,
                "title": title(lane),
                "installed": found.where is not None,
                "version": found.version,
                "where": found.where,
                "path": found.path,
                "dist": spec.dist if spec else None,
                "manifest_version": spec.version if spec else None,
                "pinned": state.pinned or (spec.version if spec else None),
                "pinned_by": "you" if state.pinned else ("manifest" if spec else None),
                "previous": state.previous.version if state.previous else None,
                "installable": spec is not None,
                "can_start": refusal is None,
                "health": "ok" if refusal is None else refusal,
                "problem": problem,
                **builds,
                **(
                    build_status(lane, store=store, hardware=machine)
                    if spec is not None
                    else {"installed_build": None, "build_requirements": None, "build_note": None}
                ),
            }
        )
    return rows


@dataclass(frozen=True)
class Found:
    """Where a lane's engine comes from: `where` (None: not installed), its version and path, and for a
    container the CLI that runs it."""

    where: str | None = None
    version: str | None = None
    path: str | None = None
    runtime: str | None = None


def _where(
    lane: str,
    spec: EngineSpec | None,
    store: EngineStore,
    install: LaneInstall | None,
    kind: EngineKind | None,
) -> Found:
    managed = store.current(lane) if spec else None
    if isinstance(kind, FoundByRegistration):  # never the app's interpreter
        return _registered(kind.registered_engine(), managed)
    if managed is not None:
        return Found("managed", managed.version, str(managed.venv))
    if install is None or not install.installed:
        return Found()
    text = install.version or ""
    cli = next((c for c in CONTAINER_CLIS if install.note.startswith(f"runtime {c}:")), None)
    if cli is not None and text.endswith(f" through {cli}"):  # runtimes.engine_install's words
        return Found("container", spec.version if spec else None, text.rsplit(" through ", 1)[0], cli)
    if spec is not None and importlib.util.find_spec(spec.module) is not None:
        return Found("app", dist_version(spec.dist), sys.executable)
    # a binary: its own text says which and where ("llama-server at /usr/bin/...")
    version, _, path = text.partition(" at ")
    return Found("path", version or None, path or None)


def _registered(build: tuple[str | None, str] | None, managed: ManagedEngine | None) -> Found:
    """A registered build (an interpreter or a llama-server: its version and path), else its own env."""
    if build is not None and (managed is None or build[1] != str(managed.python)):
        return Found("registered", build[0], build[1])
    if managed is not None:
        return Found("managed", managed.version, str(managed.venv))
    return Found()


def _tagged(lane: str, found: Found, build: str | None) -> Found:
    """A container row's image with the tag this machine's build runs, where the image has one."""
    image = load_images().get(lane)
    tagged = image.image_for(build) if image is not None and build else None
    return replace(found, path=tagged or found.path)


def build_packages(spec: EngineSpec) -> dict[str, str]:
    """Per build of an engine's manifest entry, the requirement that carries it, as people name it: the
    build's own distribution where it has one (mistralrs-cuda), else its first companion without the
    version (mlx[cuda12]), else the engine's distribution (mistralrs)."""
    out = {}
    for build, b in spec.builds.items():
        if b.dist != spec.dist or not b.also:
            out[build] = b.dist
        else:
            out[build] = re.split(r"[=<>!~;\s]", b.also[0].strip(), maxsplit=1)[0]
    return out


def build_fields(
    lane: str, settings: Settings, hardware: Hardware | None, *, machine: Hardware | None = None
) -> dict[str, Any]:
    """`build` (cpu, cuda12, cuda13, rocm, vulkan, metal; None: unknown) and `build_why` for one engine:
    a kind that knows its own build says it (llama.cpp: the runtime chosen; kind.KnowsOwnBuild), the
    Python engines' comes from the probe (`machine`, else a light probe), with the package the manifest
    names for that build."""
    kind = kind_of(lane)
    if isinstance(kind, KnowsOwnBuild):
        own = kind.own_build(settings, hardware)
        return {"build": own.build, "build_why": own.why, "runtime": own.runtime}
    spec = load_manifest().get(lane)
    packages = build_packages(spec) if spec is not None else None
    rule = kind.build_rule if kind is not None else ONE_BUILD
    chosen = choose_build(lane, machine or machine_now(hardware), rule=rule, packages=packages)
    why = f"{chosen.reason} ({chosen.package})" if chosen.package else chosen.reason
    return {"build": chosen.build, "build_why": why, "runtime": None}
