"""Races in the state files: keys, remotes, pins, settings and ui.json, download jobs (issue 21, STORES).

Real concurrency only: threads of one process, separate Python processes, and a real `switchyard serve`
answering concurrent admin calls. Each test fails against a plain read-then-write (a lost update)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from app.core import statefile
from app.core.events import EventBus
from app.core.pins import PinStore
from app.core.secrets import KeyStore, Secret
from app.core.settings import Settings
from app.core.settings_file import update_settings
from app.hub.download import DownloadManager, Job
from app.hub.transfer import FileSpec
from app.lanes.remote.store import RemoteStore
from app.ui.state import UiState
from tests.conftest import REPO, ServerProcess, link_models, wait_gone


# ---- the helper ---------------------------------------------------------------------------------------
def _increment(path: Path, times: int) -> None:
    for _ in range(times):
        statefile.update(path, lambda doc: {"n": (doc or {"n": 0})["n"] + 1})


def test_threads_never_lose_an_increment(tmp_path: Path) -> None:
    path = tmp_path / "counter.json"
    threads = [threading.Thread(target=_increment, args=(path, 40)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert json.loads(path.read_text())["n"] == 8 * 40
    # the temp files are gone; only the state file and its lock file remain
    assert sorted(p.name for p in tmp_path.iterdir()) == [".counter.json.lock", "counter.json"]


def _run_together(script: str, n: int, tmp_path: Path, *args: str) -> None:
    """Start `n` Python processes running `script` (it gets its index, the go file and `args` as argv);
    they all begin once every one of them is up, so their writes overlap."""
    go = tmp_path / "go"
    wait = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        while not Path(sys.argv[2]).exists():
            time.sleep(0.005)
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", wait + textwrap.dedent(script), str(i), str(go), *args],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err


def test_processes_never_lose_an_increment(tmp_path: Path) -> None:
    path = tmp_path / "counter.json"
    script = """
        from app.core import statefile
        for _ in range(25):
            statefile.update(Path(sys.argv[3]), lambda doc: {"n": (doc or {"n": 0})["n"] + 1})
    """
    _run_together(script, 4, tmp_path, str(path))
    assert json.loads(path.read_text())["n"] == 4 * 25


def test_a_failing_change_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    statefile.update(path, lambda _doc: {"a": 1})

    def refuse(_doc: object) -> object:
        raise ValueError("no")

    with pytest.raises(ValueError):
        statefile.update(path, refuse)
    assert json.loads(path.read_text()) == {"a": 1}
    assert statefile.update(path, lambda _doc: statefile.KEEP) is statefile.KEEP
    statefile.update(path, lambda _doc: statefile.DELETE)
    assert not path.exists()


# ---- API keys: a real server, concurrent admin calls, concurrent CLI processes --------------------------
class KeyServer:
    def __init__(self, home: Path, server: ServerProcess, admin: dict[str, str]) -> None:
        self.home, self.server, self.admin = home, server, admin
        self.api = httpx.Client(base_url=server.url, timeout=60)

    def works(self, key: str) -> bool:
        status = self.api.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code
        assert status in (200, 401), status
        return status == 200

    def create(self, name: str) -> str:
        r = self.api.post("/api/keys", json={"name": name}, headers=self.admin)
        assert r.status_code == 201, r.text
        return str(r.json()["key"])

    def names(self) -> list[str]:
        return [k["name"] for k in self.api.get("/api/keys", headers=self.admin).json()["keys"]]


def _keys_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SWITCHYARD_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "app", "keys", *args], cwd=REPO, env=env, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def key_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyServer]:
    base = tmp_path_factory.mktemp("keys")
    home = base / "home"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"require_api_key": True}))
    boot = _keys_cli(home, "create", "boot")
    assert boot.returncode == 0, boot.stderr
    s = ServerProcess(home, link_models(base / "models")).wait_ready()
    try:
        yield KeyServer(home, s, {"Authorization": f"Bearer {boot.stdout.strip()}"})
    finally:
        pids = s.engine_pids()
        s.stop()
        wait_gone(pids, 5)


def test_twenty_concurrent_creates_each_give_a_working_key(key_server: KeyServer) -> None:
    names = [f"c20-{i}" for i in range(20)]
    with ThreadPoolExecutor(20) as pool:
        keys = list(pool.map(key_server.create, names))
    assert len(set(keys)) == 20
    assert all(key_server.works(k) for k in keys)  # every key shown "only this once" was kept
    assert set(names) <= set(key_server.names())
    stored = KeyStore(key_server.home / "keys.json")  # as a fresh process sees the file
    assert [stored.verify(Secret(k)) for k in keys] == names


def test_a_revoke_racing_creates_stays_revoked(key_server: KeyServer) -> None:
    victim = key_server.create("victim")
    assert key_server.works(victim)
    names = [f"race-{i}" for i in range(10)]

    def revoke() -> int:
        return key_server.api.delete("/api/keys/victim", headers=key_server.admin).status_code

    with ThreadPoolExecutor(11) as pool:
        made = [pool.submit(key_server.create, n) for n in names[:5]]
        gone = pool.submit(revoke)
        made += [pool.submit(key_server.create, n) for n in names[5:]]
        keys = [f.result() for f in made]
        assert gone.result() == 200
    assert not key_server.works(victim)  # refused afterwards: no create wrote back a stale list
    assert "victim" not in key_server.names()
    assert all(key_server.works(k) for k in keys)


def test_six_concurrent_cli_creates_store_six_keys(key_server: KeyServer) -> None:
    env = dict(os.environ, SWITCHYARD_HOME=str(key_server.home))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "app", "keys", "create", f"cli-{i}"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    printed = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        printed.append(out.strip())
    assert {f"cli-{i}" for i in range(6)} <= set(key_server.names())
    assert all(key_server.works(k) for k in printed)  # the running server sees them at once


def test_a_key_revoked_by_an_in_place_rewrite_is_refused_at_once(tmp_path: Path) -> None:
    """An editor that rewrites keys.json in place keeps its inode; with the same size and mtime the file
    looks unchanged to stat, and a cached key must still stop working."""
    path = tmp_path / "keys.json"
    server_view = KeyStore(path)
    old = server_view.create("old").secret
    assert server_view.verify(old) == "old" and server_view.cached(old) == "old"
    other = KeyStore(tmp_path / "other.json")
    new = other.create("new").secret  # a record of exactly the same length ("old" and "new")
    st = path.stat()
    with path.open("r+", encoding="utf-8") as f:  # same inode, same size
        text = (tmp_path / "other.json").read_text(encoding="utf-8")
        assert len(text) == st.st_size
        f.write(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime: stat sees no change
    assert server_view.cached(old) is None and server_view.verify(old) is None
    assert server_view.verify(new) == "new"


# ---- remotes, pins, settings, ui.json ----------------------------------------------------------------
def test_processes_adding_remotes_lose_none(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = """
        from app.lanes.remote.store import RemoteSpec, RemoteStore
        store = RemoteStore.at(Path(sys.argv[3]))
        for j in range(8):
            store.add(RemoteSpec(f"r{sys.argv[1]}-{j}", f"http://box{j}:8000/v1"), None)
    """
    _run_together(script, 4, tmp_path, str(home))
    names = {s.name for s in RemoteStore.at(home).specs()}
    assert names == {f"r{i}-{j}" for i in range(4) for j in range(8)}


def test_processes_pinning_lose_no_pin(tmp_path: Path) -> None:
    pins = tmp_path / "pins.json"
    script = """
        from app.core.pins import PinStore
        store = PinStore(Path(sys.argv[3]))
        for j in range(10):
            store.set(f"m{sys.argv[1]}-{j}", "llama.cpp")
        store.set(f"m{sys.argv[1]}-0", None)
    """
    _run_together(script, 4, tmp_path, str(pins))
    assert PinStore(pins).all() == {f"m{i}-{j}": "llama.cpp" for i in range(4) for j in range(1, 10)}


def test_settings_changes_from_threads_are_all_kept(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"ctx_size": 2048}))

    def tune(i: int) -> None:
        def change(raw: dict[str, object]) -> None:
            over = dict(raw.get("model_overrides") or {})  # type: ignore[call-overload]
            over[f"model-{i}"] = {"ctx_size": 1024 + i}
            raw["model_overrides"] = over

        update_settings(path, change)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(tune, range(24)))
    raw = json.loads(path.read_text())
    assert raw["ctx_size"] == 2048
    assert raw["model_overrides"] == {f"model-{i}": {"ctx_size": 1024 + i} for i in range(24)}


def test_two_windows_keep_each_others_ui_state(tmp_path: Path) -> None:
    path = tmp_path / "ui.json"
    first, second = UiState(path), UiState(path)  # both read the (missing) file at start
    first.set("theme", "dark")
    second.set("closed_to_tray_noted", True)
    assert json.loads(path.read_text()) == {"theme": "dark", "closed_to_tray_noted": True}
    assert second.get("theme") == "dark"


# ---- download jobs ------------------------------------------------------------------------------------
def test_a_job_finished_elsewhere_is_not_brought_back(tmp_path: Path) -> None:
    state = tmp_path / "downloads"
    job = Job(
        id="abc123", repo="o/r", revision="main", commit="0" * 40, files=[FileSpec("a.gguf", 10, "0" * 64)]
    )

    async def main() -> None:
        settings = Settings()
        first = DownloadManager(settings=settings, bus=EventBus(), state_dir=state, resume_on_start=False)
        first.jobs[job.id] = job
        first._save(job)
        async with DownloadManager(
            settings=settings, bus=EventBus(), state_dir=state, resume_on_start=False
        ) as second:
            stale = second.get(job.id)
            first._forget(job)  # the first process finished (or cancelled) it
            second.pause(stale.id)  # a stale copy is saved by the second
        assert not (state / f"{job.id}.json").exists()

    asyncio.run(main())
    assert [p.name for p in state.iterdir()] == [".jobs.lock"]
