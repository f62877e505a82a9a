"""Install, update, pin, roll back and remove an engine's own environment (`switchyard engine ...`).

An install first settles the build (mistral.rs and MLX have several: `--build`, else the one the
hardware probe chooses, app/hardware/build_choice.py) and with it the distribution and version. It then
builds a fresh virtual environment in a folder that no recorded version uses (`engines/<lane>/<version>`,
or `<version>-<build>`), pip-installs the engine and what our worker needs, imports the engine there and
reads its version, and only then records it as `current` in state.json (the old current becomes
`previous`, kept for a rollback; older ones are deleted). That write is the swap: any failure, or a
cancel, deletes the new folder and leaves state.json and every recorded folder as they were, so the
version that worked goes on working, even when the same version is being reinstalled with another build.
The folder is built where it will live because a virtual environment cannot be moved: its scripts
(vLLM's `vllm`, pip's own) carry their absolute path.

pip's output is published line by line as `engine.progress` events; every change as `engine.*`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.core.errors import (
    EngineBusyError,
    EngineInstallError,
    EngineInUseError,
    EngineStateError,
    SwitchyardError,
)
from app.core.events import EventBus, EventKind
from app.core.platform import locks
from app.hardware.build_choice import ONE_BUILD, choose_build
from app.hardware.model import Hardware
from app.lanes.engines.registry import kind_of
from app.lanes.install.store import (
    EngineSpec,
    EngineState,
    EngineStore,
    InstalledVersion,
    check_version,
    spec_for,
    venv_python,
)
from app.lanes.install.venv import base_python, processes_under, venv_env

_PIP = ("-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off")
# run inside the new environment: import the engine, report the distribution's version and the interpreter's
_VERIFY = (
    "import importlib, importlib.metadata, importlib.util, json, platform, sys\n"
    "module, dist, load = sys.argv[1], sys.argv[2], sys.argv[3] == '1'\n"
    "if load:\n"
    "    importlib.import_module(module)\n"
    "elif importlib.util.find_spec(module) is None:\n"
    "    sys.exit(module + ' is missing')\n"
    "found = {'version': importlib.metadata.version(dist), 'python': platform.python_version()}\n"
    "print('switchyard-verify ' + json.dumps(found))\n"
)
TAIL_LINES = 40


@dataclass(frozen=True)
class InstallPlan:
    """What an install puts in the environment: the build (None: the engine has one), why, and pip's list."""

    lane: str
    build: str | None
    why: str
    dist: str
    version: str
    requirements: tuple[str, ...]


@dataclass(frozen=True)
class InstallResult:
    lane: str
    version: str
    previous: str | None
    changed: bool  # False: that version was already the current one
    seconds: float
    path: str
    build: str | None = None

    def public(self) -> dict[str, Any]:
        return {
            "engine": self.lane,
            "version": self.version,
            "build": self.build,
            "previous": self.previous,
            "changed": self.changed,
            "seconds": round(self.seconds, 1),
            "path": self.path,
        }


@contextlib.contextmanager
def lane_lock(store: EngineStore, lane: str) -> Iterator[None]:
    """One change to a lane's engine at a time, across processes (a CLI and a server)."""
    folder = store.lane_dir(lane)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as fh:
        try:
            locks.lock(fh.fileno(), wait=False)
        except BlockingIOError:
            raise EngineBusyError(
                f"another install, update or removal of {lane} is running (in this or another Switchyard "
                "process); wait for it to finish, then try again"
            ) from None
        yield


def target_version(
    spec: EngineSpec, state: EngineState, asked: str | None, *, build: str | None = None
) -> str:
    """--version if given, else the user's pin, else the manifest's for `build` (default: the build
    installed now; a build whose wheels lag the engine has a pin of its own, mistral.rs's CUDA one)."""
    if build is None and state.current is not None:
        build = state.current.build
    return check_version(asked or state.pinned or spec.default_version(build))


def chosen_build(spec: EngineSpec, hardware: Hardware | None) -> tuple[str | None, str]:
    """The build the probe chooses for an engine with several, and why; (None, "") for one with one.
    Without a snapshot it takes a light probe (GPUs only, milliseconds)."""
    if not spec.builds:
        return None, ""
    if hardware is None:
        from app.hardware.probe import probe

        hardware = probe(engine=False)
    kind = kind_of(spec.lane)
    choice = choose_build(spec.lane, hardware, rule=kind.build_rule if kind is not None else ONE_BUILD)
    if choice.build in spec.builds:
        return choice.build, choice.reason
    return "cpu", f"{choice.reason}; {spec.lane} has no {choice.build} package: cpu"


def plan(
    spec: EngineSpec,
    state: EngineState,
    *,
    version: str | None = None,
    build: str | None = None,
    hardware: Hardware | None = None,
) -> InstallPlan:
    """The build (`build` if given, checked; else the probe's), its distribution, version and requirements.
    May probe the GPUs: call it off the event loop."""
    chosen: str | None
    if build is not None:
        chosen, why = spec.check_build(build), "asked for with --build"
    else:
        chosen, why = chosen_build(spec, hardware)
    want = target_version(spec, state, version, build=chosen)
    requirements = tuple(spec.requirements(want, chosen))
    return InstallPlan(spec.lane, chosen, why, spec.dist_for(chosen), want, requirements)


def build_status(lane: str, *, store: EngineStore, hardware: Hardware | None) -> dict[str, Any]:
    """For `engine ls`: the build installed (`installed_build`), what an install of the chosen build puts
    in besides the worker's needs (`build_requirements`), and `build_note` with the command to fix it when
    the two builds differ. All None for an engine with one build."""
    spec = spec_for(lane)
    out: dict[str, Any] = {"installed_build": None, "build_requirements": None, "build_note": None}
    if not spec.builds:
        return out
    try:
        state = store.read(lane)
    except EngineStateError:
        return out  # `problem` in the row says so
    want = plan(spec, state, hardware=hardware)
    out["build_requirements"] = [r for r in want.requirements if r not in spec.worker]
    cur = state.current if store.current(lane) is not None else None
    if cur is None:
        return out
    out["installed_build"] = cur.build
    fix = f"`switchyard engine install {lane} --build {want.build}`"
    if cur.build is None:
        out["build_note"] = (
            f"installed before Switchyard recorded builds; this machine calls for {want.build} "
            f"({want.why}): run {fix} to install it"
        )
    elif cur.build != want.build:
        out["build_note"] = (
            f"the {cur.build} build is installed but this machine calls for {want.build} ({want.why}): "
            f"run {fix} (or keep {cur.build}: it goes on working)"
        )
    return out


def _usable(store: EngineStore, lane: str, v: InstalledVersion | None) -> bool:
    return v is not None and venv_python(store.venv(lane, v)).exists()


async def install(
    lane: str,
    *,
    store: EngineStore,
    bus: EventBus | None = None,
    version: str | None = None,
    build: str | None = None,
    hardware: Hardware | None = None,
    engine_python: str | None = None,
    job: str = "",
    on_line: Callable[[str], None] | None = None,
) -> InstallResult:
    """Install `version` (else the pin, else the manifest's) of `build` (else the one `hardware`, or a
    light probe, chooses) and make it current; see the module doc. A build the engine has no package for
    is refused (EngineStateError) before anything changes."""
    spec = spec_for(lane)
    if build is not None:
        spec.check_build(build)
    started = time.monotonic()

    def say(phase: str, line: str) -> None:
        if on_line is not None:
            on_line(line)
        if bus is not None:
            bus.publish(EventKind.ENGINE_PROGRESS, id=job, engine=lane, phase=phase, line=line)

    with lane_lock(store, lane):
        state = store.read(lane)
        want = await asyncio.to_thread(plan, spec, state, version=version, build=build, hardware=hardware)
        if bus is not None:
            bus.publish(EventKind.ENGINE_STARTED, id=job, engine=lane, version=want.version, build=want.build)
        what = f"{want.dist} {want.version}" + (f" ({want.build} build)" if want.build else "")
        if want.build:
            say("build", f"{want.build} build: {want.why}")
        if _same(store, lane, state.current, want):
            say("done", f"{what} is already installed")
            return _result(store, lane, state, changed=False, started=started)
        if _same(store, lane, state.previous, want):  # the kept version: switching back costs nothing
            new = replace(state, current=state.previous, previous=state.current)
            store.write(lane, new)
            say("done", f"switched to the kept {what}")
            return _result(store, lane, new, changed=True, started=started)
        base = await asyncio.to_thread(base_python, engine_python)  # may run candidates to ask their version
        taken = {v.dir for v in (state.current, state.previous) if v is not None}
        built = await _build(spec, want, store=store, base=base, say=say, taken=taken)
        old = state.current if _usable(store, lane, state.current) else state.previous
        new = EngineState(current=built, previous=old, pinned=state.pinned)
        try:
            store.write(lane, new)  # the switch: lanes started from now on run the new version
        except OSError as exc:
            await asyncio.to_thread(shutil.rmtree, store.venv(lane, built), True)
            raise EngineInstallError(
                f"{what} was installed but could not be recorded in {store.state_file(lane)} "
                f"({exc.strerror or exc}); free space or fix the folder's permissions and install again"
                f"{_kept(store, lane)}"
            ) from exc
        for line in await asyncio.to_thread(_prune, store, lane, new):  # rmtree: off the event loop
            say("prune", line)
        say("done", f"{what} installed in {store.venv(lane, built)}")
        return _result(store, lane, new, changed=True, started=started)


def _same(store: EngineStore, lane: str, v: InstalledVersion | None, want: InstallPlan) -> bool:
    return v is not None and (v.version, v.build) == (want.version, want.build) and _usable(store, lane, v)


def _result(
    store: EngineStore, lane: str, state: EngineState, *, changed: bool, started: float
) -> InstallResult:
    assert state.current is not None
    return InstallResult(
        lane=lane,
        version=state.current.version,
        previous=state.previous.version if state.previous else None,
        changed=changed,
        seconds=time.monotonic() - started,
        path=str(store.venv(lane, state.current)),
        build=state.current.build,
    )


def _folder(store: EngineStore, want: InstallPlan, taken: set[str]) -> Path:
    """engines/<lane>/<version>[-<build>], with a suffix where a recorded version (a broken one being
    rebuilt) already has that name: a recorded folder is never deleted or built over here."""
    name = f"{want.version}-{want.build}" if want.build else want.version
    folder, n = name, 1
    while folder in taken:
        n += 1
        folder = f"{name}.{n}"
    return store.lane_dir(want.lane) / folder


async def _build(
    spec: EngineSpec,
    want: InstallPlan,
    *,
    store: EngineStore,
    base: str,
    say: Callable[[str, str], None],
    taken: set[str],
) -> InstalledVersion:
    """A verified environment in a folder no recorded version uses, or EngineInstallError with nothing left
    behind (the recorded versions untouched)."""
    folder = _folder(store, want, taken)
    if folder.exists():  # a leftover nobody records (an install that was cut off): start clean
        if processes_under(folder):
            raise EngineInUseError(f"a process still runs from {folder}; stop it, then install again")
        await asyncio.to_thread(shutil.rmtree, folder)
    python = venv_python(folder)
    dist, version = want.dist, want.version
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    keep = _kept(store, spec.lane)
    try:
        say("venv", f"creating an environment for {dist} {version} with {base}")
        if await _run((base, "-m", "venv", str(folder)), tail=tail, say=lambda ln: say("venv", ln)):
            raise EngineInstallError(
                f"creating the environment with {base} failed: {_gist(tail)}; on Debian or Ubuntu install "
                f"python3-venv, or set engine_python in settings.json to another Python 3.11+{keep}"
            )
        say("pip", "pip install " + " ".join(want.requirements))
        tail.clear()
        if await _run((str(python), *_PIP, *want.requirements), tail=tail, say=lambda ln: say("pip", ln)):
            builds = f", or another build with --build ({', '.join(spec.builds)})" if spec.builds else ""
            raise EngineInstallError(
                f"pip could not install {dist}=={version}: {_gist(tail)}; check the version "
                f"(`pip index versions {dist}` lists them){builds}, the network and pip's index settings "
                f"(PIP_INDEX_URL, pip.conf){keep}"
            )
        say("verify", f"checking that {spec.module} imports")
        tail.clear()
        load = "1" if spec.verify_import else "0"
        argv = (str(python), "-c", _VERIFY, spec.module, dist, load)
        if await _run(argv, tail=tail, say=lambda ln: say("verify", ln)):
            raise EngineInstallError(
                f"{dist} {version} installed but does not import ({_gist(tail)}); this version or build may "
                f"not support this machine or Python; try another with --version or --build{keep}"
            )
        mark = "switchyard-verify "
        found = json.loads(next(ln for ln in reversed(tail) if ln.startswith(mark))[len(mark) :])
        if found["version"] != version:
            raise EngineInstallError(
                f"asked for {dist} {version} but the environment has {found['version']}{keep}"
            )
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            shutil.rmtree(folder, ignore_errors=True)  # no awaiting while being cancelled
        else:
            await asyncio.to_thread(shutil.rmtree, folder, True)
        if isinstance(exc, SwitchyardError | asyncio.CancelledError | KeyboardInterrupt):
            raise
        raise EngineInstallError(f"installing {dist} {version} failed: {exc}{keep}") from exc
    return InstalledVersion(
        version=version,
        dir=folder.name,
        installed_at=time.time(),
        requirements=want.requirements,
        python=str(found.get("python", "")),
        build=want.build,
    )


def _kept(store: EngineStore, lane: str) -> str:
    try:
        cur = store.read(lane).current
    except EngineStateError:
        cur = None
    if cur is not None:
        return f"; {lane} {cur.version} is still installed and in use"
    return "; nothing was changed"


def _gist(tail: deque[str]) -> str:
    """pip's own words: its ERROR lines, else the last lines it printed."""
    errors = [ln for ln in tail if ln.startswith("ERROR")]
    lines = errors or [ln for ln in tail if ln.strip()][-4:]
    return " | ".join(ln.strip() for ln in lines)[:1500] or "no output"


async def _run(argv: tuple[str, ...], *, tail: deque[str], say: Callable[[str], None]) -> int:
    """Run without a shell; every output line goes to `say` and `tail`. Killed when cancelled."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=venv_env(None),
        limit=1 << 20,
    )
    try:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            tail.append(line)
            say(line)
        return await proc.wait()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.shield(proc.wait())


def _prune(store: EngineStore, lane: str, state: EngineState) -> list[str]:
    """Delete the version folders neither current nor previous, except one a running lane still uses."""
    keep = {v.dir for v in (state.current, state.previous) if v is not None}
    said = []
    for folder in store.lane_dir(lane).iterdir():
        if not folder.is_dir() or folder.name in keep or folder.name.startswith("."):
            continue
        if processes_under(folder):
            said.append(f"kept {folder}: a running lane uses it; it goes with the next install")
            continue
        shutil.rmtree(folder, ignore_errors=True)
        said.append(f"deleted {folder}")
    return said


def rollback(lane: str, *, store: EngineStore, bus: EventBus | None = None) -> EngineState:
    """Swap current and previous. Lanes already running keep their version until they restart."""
    spec_for(lane)
    with lane_lock(store, lane):
        state = store.read(lane)
        if not _usable(store, lane, state.previous):
            raise EngineStateError(
                f"{lane} has no previous version to roll back to; install one with "
                f"`switchyard engine install {lane} --version V`"
            )
        new = replace(state, current=state.previous, previous=state.current)
        store.write(lane, new)
    announce(bus, lane, "rollback", new)
    return new


def pin(lane: str, version: str | None, *, store: EngineStore, bus: EventBus | None = None) -> EngineState:
    """Record the version `install` and `update` use (None: the manifest's again). Installs nothing."""
    spec_for(lane)
    with lane_lock(store, lane):
        new = replace(store.read(lane), pinned=check_version(version) if version else None)
        store.write(lane, new)
    announce(bus, lane, "pin", new)
    return new


def remove(lane: str, *, store: EngineStore, bus: EventBus | None = None) -> list[str]:
    """Delete every version and the state (the pin too). Refused while a process runs from it."""
    folder = store.lane_dir(lane)
    if not folder.exists():
        return []
    with lane_lock(store, lane):
        pids = processes_under(folder)
        if pids:
            raise EngineInUseError(
                f"{lane} is running (pid {', '.join(map(str, pids))}); stop its lanes first (`switchyard ps` "
                f"lists them; POST /api/models/ID/unload stops one), then remove it"
            )
        state = EngineState()
        with contextlib.suppress(EngineStateError):
            state = store.read(lane)
        gone = [v.version for v in (state.current, state.previous) if v is not None]
        shutil.rmtree(folder)
    announce(bus, lane, "remove", EngineState())
    return gone


def announce(bus: EventBus | None, lane: str, action: str, state: EngineState) -> None:
    """`engine.changed` on the bus. Call it on the event loop's thread: the bus is not thread-safe."""
    if bus is not None:
        bus.publish(
            EventKind.ENGINE_CHANGED,
            engine=lane,
            action=action,
            current=state.current.version if state.current else None,
            previous=state.previous.version if state.previous else None,
            pinned=state.pinned,
        )
