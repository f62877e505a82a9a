"""Run under the Windows CPython (tests/windows/test_wine_platform.py): the platform module, the state
files and their locks, an engine's process tree, the hardware probe, as Windows code.

One JSON line per check: {"check": NAME, "ok": bool, "detail": ...}; {"wine": REASON} marks a result
that is wine's limit and not Windows' behaviour. Checks run in one process (a python.exe start costs
seconds under wine) and each catches its own failure, so one broken check does not hide the others.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path

from tests.windows.checks.runner import Checks

CHECKS = Checks()
check = CHECKS.add


@check
def data_home_is_local_appdata(tmp: Path) -> object:
    from app.core.paths import Paths
    from app.core.platform.home import data_home

    local = tmp / "Local AppData with spaces"
    home = Paths.from_env({"LOCALAPPDATA": str(local)}).home
    assert home == local / "Switchyard", home
    assert data_home({"LOCALAPPDATA": str(local)}) == home
    return str(home)


@check
def lock_excludes_a_second_descriptor(tmp: Path) -> object:
    from app.core.platform import locks

    path = tmp / "x.lock"
    a = os.open(path, os.O_RDWR | os.O_CREAT)
    b = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        locks.lock(a)
        try:
            locks.lock(b, wait=False)
        except BlockingIOError:
            pass
        else:
            raise AssertionError("a second descriptor took a held lock")
        locks.unlock(a)
        locks.lock(b, wait=False)
        locks.unlock(b)
    finally:
        os.close(a)
        os.close(b)
    return "held lock refused, freed lock taken"


@check
def statefile_updates_from_threads_are_not_lost(tmp: Path) -> object:
    from app.core import statefile

    path = tmp / "count.json"

    def bump() -> None:
        for _ in range(25):
            statefile.update(path, lambda doc: {"n": (doc or {"n": 0})["n"] + 1})

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    doc = json.loads(path.read_text())
    assert doc == {"n": 100}, doc
    return doc


@check
def atomic_write_survives_an_open_reader(tmp: Path) -> object:
    """A reader holds the old file open (no FILE_SHARE_DELETE) while the state file is replaced."""
    from app.core import statefile

    path = tmp / "settings with spaces.json"
    statefile.write_atomic(path, '{"v": 1}\n')
    holder = open(path, encoding="utf-8")  # Python opens without FILE_SHARE_DELETE: rename over it fails
    timer = threading.Timer(0.5, holder.close)
    timer.start()
    started = time.monotonic()
    statefile.write_atomic(path, '{"v": 2}\n')
    waited = time.monotonic() - started
    timer.join()
    assert json.loads(path.read_text()) == {"v": 2}
    leftovers = [p.name for p in tmp.iterdir() if p.name.endswith(".tmp")]
    assert not leftovers, leftovers
    return {"waited_s": round(waited, 2)}


@check
def long_paths_and_spaces(tmp: Path) -> object:
    from app.core import statefile

    deep = tmp.joinpath(*["a folder with spaces " + "x" * 40] * 6)  # past MAX_PATH (260)
    path = deep / "state.json"
    try:
        statefile.update(path, lambda _doc: {"ok": True})
    except OSError as exc:
        raise AssertionError(f"{len(str(path))} characters: {exc}") from exc
    return {"chars": len(str(path))}


def gone_within(pid: int, seconds: float) -> bool:
    from app.core.platform.procs import pid_alive

    deadline = time.monotonic() + seconds
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


_TREE = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(120)\n"
)


@check
def an_engine_tree_is_ended_whole(tmp: Path) -> object:
    """EngineProcess puts the engine in a Job Object; terminate ends it and what it started, at once."""
    from app.core.platform.procs import pid_alive
    from app.lanes.proc import EngineProcess, LogRing

    async def go() -> dict[str, object]:
        ring = LogRing(max_lines=50, file=None)
        env = dict(os.environ)
        engine = await EngineProcess.spawn(
            (sys.executable, "-c", _TREE), env=env, ring=ring, on_port=lambda _p: None
        )
        deadline = time.monotonic() + 60
        while not any(line.strip().isdigit() for line in ring.lines):
            assert time.monotonic() < deadline, list(ring.lines)
            await asyncio.sleep(0.1)
        grandchild = int(next(line for line in ring.lines if line.strip().isdigit()))
        assert pid_alive(grandchild) and pid_alive(engine.pid)
        started = time.monotonic()
        await engine.terminate(grace=1)
        took = time.monotonic() - started
        assert await asyncio.to_thread(gone_within, grandchild, 5), "the engine's child outlived the stop"
        assert not pid_alive(engine.pid)
        # this engine ignores the stop pipe (a foreign binary would): the job is ended after the grace
        assert took < 5, f"terminate took {took:.1f} s"
        return {"terminate_s": round(took, 2)}

    return asyncio.run(go())


_WORKER = (
    "import os, sys, time\n"
    "from app.lanes.parentwatch import watch_stop_pipe\n"
    "assert os.environ.get('SWITCHYARD_STOP_PIPE') == '1', 'the stop pipe was not announced'\n"
    "watch_stop_pipe()\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


@check
def a_worker_leaves_when_asked_through_its_stop_pipe(tmp: Path) -> object:
    """No signal reaches a Windows process without a console: the stop pipe is the ask, and a worker
    that watches it leaves by itself (exit 0) well before the grace runs out."""
    from app.lanes.proc import EngineProcess, LogRing

    async def go() -> dict[str, object]:
        ring = LogRing(max_lines=50, file=None)
        engine = await EngineProcess.spawn(
            (sys.executable, "-c", _WORKER), env=dict(os.environ), ring=ring, on_port=lambda _p: None
        )
        deadline = time.monotonic() + 60
        while "ready" not in ring.lines:
            assert engine.proc.returncode is None and time.monotonic() < deadline, list(ring.lines)
            await asyncio.sleep(0.1)
        started = time.monotonic()
        code = await engine.terminate(grace=30)
        took = time.monotonic() - started
        assert code == 0, f"the worker did not leave by itself (exit {code}): {list(ring.lines)}"
        assert took < 10, f"the stop took {took:.1f} s"
        return {"exit": code, "stop_s": round(took, 2)}

    return asyncio.run(go())


@check
def job_close_kills_what_is_left(tmp: Path) -> object:
    """The kill-on-close limit: closing the last handle (what the server's death does) ends the tree."""
    import subprocess

    from app.core.platform.jobs import Job
    from app.core.platform.procs import spawn_options

    child = subprocess.Popen(
        [sys.executable, "-c", _TREE],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        **spawn_options(),
    )
    job = Job.create()
    job.add(child.pid)
    grandchild = int(child.stdout.readline())  # type: ignore[union-attr]
    active = job.active_processes()
    job.close()
    child.wait(timeout=10)
    assert gone_within(grandchild, 5), "a process of the job outlived the job's last handle"
    return {"active_before_close": active}


@check
def pid_alive_does_not_kill(tmp: Path) -> object:
    import subprocess

    from app.core.platform.procs import pid_alive

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.DEVNULL)
    try:
        for _ in range(3):
            assert pid_alive(child.pid)
        time.sleep(0.2)
        assert child.poll() is None, "checking a pid ended the process (os.kill(pid, 0) on Windows does)"
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid)
    return "ok"


@check
def stop_signals_on_a_proactor_loop(tmp: Path) -> object:
    import signal

    from app.core.platform.signals import on_stop_signals, stop_signals

    assert stop_signals() == (signal.SIGBREAK, signal.SIGINT), stop_signals()

    async def go() -> tuple[str, ...]:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        handled = on_stop_signals(loop, stop.set)
        signal.raise_signal(signal.SIGINT)  # as Ctrl-C does
        await asyncio.wait_for(stop.wait(), 5)
        return tuple(s.name for s in handled)

    return asyncio.run(go())


@check
def hardware_probe_degrades_to_unknown(tmp: Path) -> object:
    """No crash where Windows (or wine) lacks a counter: the fact is None. Under wine psutil cannot read
    the page file (no performance counters), which was a crash of `serve` at start."""
    from app.core.events import EventBus
    from app.hardware.monitor import Monitor
    from app.hardware.probe import probe

    hw = probe(engine=False, sysfs_root=tmp / "no-sysfs")
    assert hw.memory.total > 0
    monitor = Monitor(EventBus(), sysfs_root=None)
    sample = monitor.sample()
    sample = monitor.sample()  # the second one has a CPU percentage
    assert sample["ram_total"] > 0
    return {
        "swap_total": hw.memory.swap_total,
        "swap_used": sample["swap_used"],
        "cpu": sample["cpu_percent"],
    }


@check
def port_owner_never_raises(tmp: Path) -> object:
    import socket

    from app.core.platform.ports import port_owner

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        owner = port_owner(s.getsockname()[1])
    return {"owner": owner}


@check
def keys_live_in_the_credential_manager(tmp: Path) -> object:
    """Secrets go to Windows' own store (WinVaultKeyring), are read back whole, and deleted."""
    import uuid

    from app.core.vault import Secret, backend_name, keyring_delete, keyring_get, keyring_put

    backend = backend_name()
    assert "WinVault" in backend, f"not the Windows Credential Manager: {backend}"
    user = f"windows-check-{uuid.uuid4().hex[:8]}"
    value = "sy-" + uuid.uuid4().hex + "-ü✓"
    problem = keyring_put(user, Secret(value))
    assert problem is None, problem
    try:
        got, problem = keyring_get(user)
        assert problem is None and got is not None and got.reveal() == value, (problem, got)
    finally:
        assert keyring_delete(user)
    assert keyring_get(user)[0] is None, "the secret stayed after it was deleted"
    return backend


@check
def hub_cache_is_where_huggingface_hub_puts_it(tmp: Path) -> object:
    """With no setting and no HF_* variable, the models cache is huggingface_hub's own Windows default, so
    models another tool downloaded are found and ours are shared."""
    import subprocess

    from app.hub.config import default_cache_dir

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "XDG_"))}
    theirs = subprocess.run(
        [sys.executable, "-c", "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"],
        env=clean,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert theirs.returncode == 0, theirs.stderr[-800:]
    ours = default_cache_dir(clean)
    assert Path(theirs.stdout.strip()) == ours, (theirs.stdout.strip(), str(ours))
    assert str(ours).startswith(os.environ["USERPROFILE"]), ours
    return str(ours)


@check
def tls_self_signed_pair_serves_a_pinned_client(tmp: Path) -> object:
    """The self-signed pair made under a data folder with spaces, its key file private, served by an asyncio
    TLS server and accepted by a client that trusts exactly that certificate (what the CLI does)."""
    from app.core.paths import Paths
    from app.server.tls import client_context, fingerprint, self_signed, server_context

    material = self_signed(Paths(home=tmp / "home with spaces"), host="127.0.0.1")
    assert material.fingerprint == fingerprint(material.cert.read_bytes())

    async def go() -> str:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write((await reader.readline()).upper())
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_context(material))
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_context(material.cert), server_hostname="127.0.0.1"
            )
            writer.write(b"hello over tls\n")
            await writer.drain()
            line = await reader.readline()
            writer.close()
            return line.decode().strip()
        finally:
            server.close()
            await server.wait_closed()

    got = asyncio.run(go())
    assert got == "HELLO OVER TLS", got
    return {"fingerprint": material.fingerprint[:23], "cert": str(material.cert)}


_TALKER = "print('caf\u00e9 \u2713 \u65e5\u672c\u8a9e', flush=True)\n"


@check
def an_engine_prints_non_ascii_whatever_the_code_page(tmp: Path) -> object:
    """An engine's streams are pipes, which take the ANSI code page (cp1252) on Windows: without UTF-8 mode
    printing a model's text ended the engine. engine_env gives every engine UTF-8 mode by default."""
    from app.lanes.proc import EngineProcess, LogRing, engine_env

    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONUTF8", "PYTHONIOENCODING")}
    env = engine_env(base)
    assert env.get("PYTHONUTF8") == "1", env.get("PYTHONUTF8")

    async def go() -> list[str]:
        ring = LogRing(max_lines=50, file=None)
        engine = await EngineProcess.spawn(
            (sys.executable, "-c", _TALKER), env=env, ring=ring, on_port=lambda _p: None
        )
        code = await asyncio.wait_for(engine.proc.wait(), 60)
        await engine.drain_output(5)
        assert code == 0, (code, list(ring.lines))
        return list(ring.lines)

    lines = asyncio.run(go())
    assert "caf\u00e9 \u2713 \u65e5\u672c\u8a9e" in lines, lines
    return lines


def main() -> int:
    return CHECKS.run(prefix="sy win checks ", wanted=set(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
