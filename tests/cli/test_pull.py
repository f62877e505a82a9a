"""`switchyard pull` as a real subprocess (killed mid-download and resumed), the downloads admin API with
SSE progress through a real `switchyard serve`, and a pulled model answering the official openai client."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from huggingface_hub import hf_hub_download

from app.hub import cache_layout
from tests.conftest import REPO as SRC
from tests.hub.test_download import BIG, MIB, REPO, blob, gets, range_starts, sha
from tests.support.fakehub import FakeHub


def cache_dir() -> Path:
    return Path(os.environ["HF_HUB_CACHE"])


def switchyard(*args: str, home: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if home is not None:
        env["SWITCHYARD_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=SRC,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def partial_done(path: Path) -> int:
    try:
        return sum(p[2] for p in json.loads(path.read_text())["parts"])
    except (OSError, ValueError, KeyError):
        return 0


def test_pull_killed_with_sigkill_resumes_from_its_parts(fake_hub: FakeHub) -> None:
    data = blob(12 * MIB, 21)
    fake_hub.add_repo(REPO, {BIG: data, "README.md": b"# tiny\n"})
    fake_hub.faults.delay_per_chunk = 0.03
    state = cache_layout.partial_dir(cache_layout.repo_folder(cache_dir(), REPO), sha(data)) / "state.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "pull", f"{REPO}:Q4_K_M", "--local"],
        cwd=SRC,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while partial_done(state) < 2 * MIB:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the pull made no progress"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    kept = partial_done(state)
    assert kept >= 2 * MIB and not (state.parent.parent / sha(data)).exists()
    fake_hub.reset_counters()
    fake_hub.faults.delay_per_chunk = 0
    r = switchyard("pull", f"{REPO}:Q4_K_M", "--local")
    assert r.returncode == 0, r.stderr
    assert "verified" in r.stdout
    starts = range_starts(gets(fake_hub, BIG))
    # nothing refetched from byte 0; parts with bytes on disk continued past their first byte
    assert starts and min(starts) > 0 and any(s % (3 * MIB) for s in starts)
    assert fake_hub.served[f"{REPO}/{BIG}"] <= len(data) - kept + 4 * 256 * 1024
    local = hf_hub_download(REPO, BIG, cache_dir=cache_dir(), local_files_only=True)
    assert sha(Path(local).read_bytes()) == sha(data)
    assert not state.parent.exists()


def test_pull_exit_codes_for_bad_input(fake_hub: FakeHub) -> None:
    fake_hub.add_repo(REPO, {BIG: blob(1000, 1), "tiny-Q8_0.gguf": blob(1000, 2)})
    r = switchyard("pull", REPO, "--local")
    assert r.returncode == 2 and "name one" in r.stderr and "Q4_K_M" in r.stderr
    r = switchyard("pull", "org/missing", "--local")
    assert r.returncode == 2 and "not found" in r.stderr
    fake_hub.faults.corrupt = {"tiny-Q8_0.gguf"}
    r = switchyard("pull", f"{REPO}:Q8_0", "--local")
    assert r.returncode == 1 and "corrupt" in r.stderr and "retry the pull" in r.stderr


class SSE:
    """Reads /api/downloads/events in a thread."""

    def __init__(self, url: str) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        u = urllib.parse.urlsplit(url)
        self._conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=60)
        self._conn.request("GET", "/api/downloads/events")
        self._r = self._conn.getresponse()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        kind = ""
        try:
            for raw in self._r:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    self.events.append((kind, json.loads(line[6:])))
        except (OSError, ValueError):
            pass

    def wait_for(self, kind: str, job_id: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for k, d in list(self.events):
                if k == kind and d.get("id") == job_id:
                    return d
            time.sleep(0.05)
        raise AssertionError(f"no {kind} for {job_id}: {[k for k, _ in self.events]}")

    def close(self) -> None:
        if self._conn.sock is not None:  # unblocks the reader (a plain close would wait for it)
            self._conn.sock.shutdown(socket.SHUT_RDWR)


def call(url: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_state(url: str, job_id: str, state: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, job = call(url, "GET", f"/api/downloads/{job_id}")
        if job["state"] == state:
            return dict(job)
        time.sleep(0.05)
    raise AssertionError(f"download {job_id} never reached {state}: {job}")


def test_admin_api_sse_update_and_a_pulled_model_that_chats(
    fake_hub: FakeHub, model_store: Path, start_server: Any, tmp_path: Path
) -> None:
    big = blob(12 * MIB, 31)
    parts = {f"Q8_0/tiny-Q8_0-0000{i}-of-00003.gguf": blob(400_000, 40 + i) for i in (1, 2, 3)}
    fake_hub.add_repo(REPO, {BIG: big, **parts, "README.md": b"# tiny\n"})
    fake_hub.add_repo("org/chat-GGUF", {"chat-Q8_0.gguf": (model_store / "tiny.gguf").read_bytes()})
    (tmp_path / "models").mkdir()
    server = start_server(tmp_path / "models")
    url = server.url
    sse = SSE(url)
    fake_hub.faults.delay_per_chunk = 0.01
    status, job = call(url, "POST", "/api/downloads", {"repo": f"{REPO}:Q4_K_M"})
    assert status == 202 and job["state"] in ("queued", "running") and job["bytes_total"] == len(big)
    done = sse.wait_for("download.completed", job["id"])
    assert done["bytes_done"] == len(big)
    progress = [d for k, d in sse.events if k == "download.progress" and d["id"] == job["id"]]
    assert len(progress) >= 2 and sum(d["delta"] for d in progress) == len(big)
    assert all(set(d) >= {"rate_bps", "eta_s", "bytes_done", "bytes_total", "file"} for d in progress)
    assert sse.events[0][0] == "snapshot"
    assert sha(
        Path(hf_hub_download(REPO, BIG, cache_dir=cache_dir(), local_files_only=True)).read_bytes()
    ) == sha(big)

    # pause, resume, cancel a slow multi-part download
    fake_hub.faults.delay_per_chunk = 0.2
    _, j2 = call(url, "POST", "/api/downloads", {"repo": REPO, "quant": "Q8_0"})
    assert call(url, "POST", f"/api/downloads/{j2['id']}/pause")[1]["state"] == "paused"
    sse.wait_for("download.paused", j2["id"])
    assert call(url, "POST", f"/api/downloads/{j2['id']}/resume")[1]["state"] in ("queued", "running")
    sse.wait_for("download.resumed", j2["id"])
    status, cancelled = call(url, "DELETE", f"/api/downloads/{j2['id']}")
    assert status == 200 and cancelled["state"] == "cancelled"
    sse.wait_for("download.cancelled", j2["id"])
    assert not list((cache_layout.repo_folder(cache_dir(), REPO) / "blobs").glob("*.incomplete.d"))
    fake_hub.faults.delay_per_chunk = 0
    assert call(url, "GET", "/api/downloads/nope")[0] == 404
    status, err = call(url, "POST", "/api/downloads", {"repo": REPO, "quant": "Q9"})
    assert status == 404 and "Q4_K_M" in err["error"]["message"]

    # update and rollback through the API
    assert call(url, "POST", "/api/hub/update", {"repo": REPO})[1]["status"] == "up_to_date"
    old = fake_hub.repos[REPO].head.sha
    new = fake_hub.commit(REPO, {BIG: blob(12 * MIB, 32)})
    status, up = call(url, "POST", "/api/hub/update", {"repo": REPO})
    assert status == 202 and up["status"] == "queued" and up["job"]["previous"] == old
    sse.wait_for("download.completed", up["job"]["id"])
    rd = cache_layout.repo_folder(cache_dir(), REPO)
    assert cache_layout.read_ref(rd, "main") == new and (rd / "snapshots" / old).is_dir()
    status, back = call(url, "POST", "/api/hub/update", {"repo": REPO, "rollback": True})
    assert status == 200 and back["commit"] == old and cache_layout.read_ref(rd, "main") == old

    # the CLI finds the running server and goes through it
    r = switchyard("pull", "org/chat-GGUF", home=server.home)
    assert r.returncode == 0, r.stderr
    assert "queued on the server" in r.stderr and "verified" in r.stdout
    sse.close()

    # the pulled model is served from the HF cache and answers a chat request
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
    ids = [m.id for m in client.models.list().data]
    model = "org/chat-GGUF/chat-Q8_0"
    if model not in ids:
        pytest.fail(f"the pulled model is not served (HF-cache source of the library): {ids}")
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].message.content is not None and reply.usage is not None
    assert reply.usage.completion_tokens > 0
    # and the library says where it came from
    listed = switchyard("ls", "--json", home=server.home)
    assert listed.returncode == 0, listed.stderr
    row = next(m for m in json.loads(listed.stdout)["models"] if m["id"] == model)
    assert row["source"] == "download" and row["origin"]["repo"] == "org/chat-GGUF"


def test_ctrl_c_pauses_and_the_next_pull_continues(fake_hub: FakeHub, isolated_env: Path) -> None:
    data = blob(12 * MIB, 22)
    fake_hub.add_repo(REPO, {BIG: data})
    fake_hub.faults.delay_per_chunk = 0.1  # slow enough that SIGINT lands mid-transfer on a loaded machine
    state = cache_layout.partial_dir(cache_layout.repo_folder(cache_dir(), REPO), sha(data)) / "state.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "pull", f"{REPO}:Q4_K_M"],
        cwd=SRC,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a test runner started in the background (or a pytest-xdist worker) hands
        # its children SIGINT ignored, and Python then never turns Ctrl-C into KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 30
        while partial_done(state) < MIB:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "paused" in err and "again" in err
    (job,) = [json.loads(p.read_text()) for p in (isolated_env / "downloads").glob("*.json")]
    assert job["state"] == "paused" and partial_done(state) >= MIB
    fake_hub.faults.delay_per_chunk = 0
    fake_hub.reset_counters()
    r = switchyard("pull", f"{REPO}:Q4_K_M")
    assert r.returncode == 0, r.stderr
    assert min(range_starts(gets(fake_hub, BIG))) > 0
    assert not list((isolated_env / "downloads").glob("*.json"))  # finished jobs are not kept


def test_update_by_model_id_and_rollback_from_the_cli(fake_hub: FakeHub, model_store: Path) -> None:
    """No server running: `update MODEL` finds the repository from the library, fetches the new revision
    beside the old one, and `--rollback` points refs/main back; `ls` follows refs/main both times."""
    tiny = (model_store / "tiny.gguf").read_bytes()
    fake_hub.add_repo("org/upd-GGUF", {"upd-Q8_0.gguf": tiny, "README.md": b"# one\n"})
    old = fake_hub.repos["org/upd-GGUF"].head.sha
    r = switchyard("pull", "org/upd-GGUF:Q8_0")
    assert r.returncode == 0, r.stderr

    def origin() -> dict[str, Any]:
        listed = switchyard("ls", "--json")
        assert listed.returncode == 0, listed.stderr
        row = next(m for m in json.loads(listed.stdout)["models"] if m["id"] == "org/upd-GGUF/upd-Q8_0")
        assert row["source"] == "download"
        return dict(row["origin"])

    assert origin()["commit"] == old
    r = switchyard("update", "org/upd-GGUF/upd-Q8_0")
    assert r.returncode == 0 and "up to date" in r.stdout, r.stdout + r.stderr

    changed = (model_store / "tiny2.gguf").read_bytes()
    new = fake_hub.commit("org/upd-GGUF", {"upd-Q8_0.gguf": changed})
    fake_hub.reset_counters()
    r = switchyard("update", "org/upd-GGUF/upd-Q8_0")
    assert r.returncode == 0, r.stderr
    assert f"{old[:12]} -> {new[:12]}" in r.stdout
    assert set(fake_hub.served) == {"org/upd-GGUF/upd-Q8_0.gguf"}  # the unchanged README is not fetched
    rd = cache_layout.repo_folder(cache_dir(), "org/upd-GGUF")
    assert cache_layout.read_ref(rd, "main") == new and (rd / "snapshots" / old / "upd-Q8_0.gguf").exists()
    assert origin()["commit"] == new
    path = Path(
        hf_hub_download("org/upd-GGUF", "upd-Q8_0.gguf", cache_dir=cache_dir(), local_files_only=True)
    )
    assert sha(path.read_bytes()) == sha(changed)

    r = switchyard("update", "org/upd-GGUF", "--rollback")
    assert r.returncode == 0, r.stderr
    assert "back at" in r.stdout and cache_layout.read_ref(rd, "main") == old
    assert origin()["commit"] == old


def test_pull_on_a_terminal_redraws_progress_lines_in_place(fake_hub: FakeHub) -> None:
    import pty

    fake_hub.add_repo(REPO, {BIG: blob(3 * MIB, 77)})
    fake_hub.faults.delay_per_chunk = 0.01  # ~48 chunks: long enough for several progress events
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "pull", f"{REPO}:Q4_K_M", "--local"],
        cwd=SRC,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    text = out.decode()
    assert "\x1b[2K" in text and "\x1b[1F" in text  # cleared and redrawn in place
    assert "MiB/s" in text and "ETA" in text
    assert f"{BIG}  3.0/3.0 MiB  100.0%" in text and "verified" in text


def test_pull_brings_the_projector_unless_told_otherwise(fake_hub: FakeHub) -> None:
    """`pull REPO:Q4_K_M` also fetches the f16 projector; `--mmproj FILE` picks another, `none` none."""
    repo = "org/VL-GGUF"
    files = {
        "vl-Q4_K_M.gguf": blob(64 * 1024, 1),
        "mmproj-vl-f16.gguf": blob(16 * 1024, 2),
        "mmproj-vl-q8_0.gguf": blob(8 * 1024, 3),
    }
    fake_hub.add_repo(repo, files)
    snapshot = cache_layout.repo_folder(cache_dir(), repo) / "snapshots" / fake_hub.repos[repo].head.sha

    r = switchyard("pull", f"{repo}:Q4_K_M", "--mmproj", "none")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in snapshot.iterdir()) == ["vl-Q4_K_M.gguf"]
    r = switchyard("pull", f"{repo}:Q4_K_M", "--mmproj", "mmproj-vl-q8_0.gguf")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in snapshot.iterdir()) == ["mmproj-vl-q8_0.gguf", "vl-Q4_K_M.gguf"]
    r = switchyard("pull", f"{repo}:Q4_K_M")
    assert r.returncode == 0, r.stderr
    assert (snapshot / "mmproj-vl-f16.gguf").read_bytes() == files["mmproj-vl-f16.gguf"]
