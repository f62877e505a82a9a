"""`switchyard serve` as Windows code: a chat from a GGUF through the xllamacpp Windows wheel to a Linux
client on 127.0.0.1 (the official openai client), and no engine left when serve is killed hard.

Under wine a Windows process is a Linux process too, so the engine is found and watched from here: its
command line names the llama.cpp worker module and this test's own models folder.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import psutil
import pytest

from tests.support.tinymodels import CHAT, write_tiny_gguf
from tests.windows.wine import WinePython, win_path

GRAMMAR = 'root ::= "the answer is 42"'
WORKER = "app.lanes.workers.llamacpp"
READY_S = 120  # a cold start under wine: python.exe, aiohttp, the catalog (about 10 to 20 s here)


@dataclass
class WineServe:
    proc: object
    url: str
    marker: str  # the models folder's name: in every worker's command line (its model's path)
    env: dict[str, str]  # what serve was started with: the CLI finds it through the same home
    stderr: list[str] = field(default_factory=list)

    def engines(self) -> list[psutil.Process]:
        """The llama.cpp workers this serve started: Linux processes whose command line names the worker
        and this test's models folder."""
        found = []
        for p in psutil.process_iter(["cmdline"]):
            line = " ".join(p.info["cmdline"] or [])
            if WORKER in line and self.marker in line:
                found.append(p)
        return found


@pytest.fixture
def wine_serve(wine: WinePython, tmp_path: Path) -> Iterator[WineServe]:
    marker = f"models with spaces {uuid.uuid4().hex[:12]}"
    models = tmp_path / marker
    models.mkdir()
    write_tiny_gguf(models / "tiny.gguf", CHAT)
    home = tmp_path / "Switchyard home"
    env = {
        "SWITCHYARD_HOME": win_path(home),
        "HF_HOME": win_path(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "SWITCHYARD_NO_STARTER": "1",
        "SWITCHYARD_NO_FIRST_RUN": "1",
    }
    proc = wine.popen(["-m", "app", "serve", "--port", "0", "--models-dir", win_path(models)], env=env)
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
    url = ""
    deadline = time.monotonic() + READY_S
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("listening on "):
            url = line.split()[-1]
            break
        if time.monotonic() > deadline:
            break
    if not url:
        proc.kill()
        proc.wait()
        pytest.fail("serve under wine did not listen:\n" + "".join(stderr[-60:]))
    served = WineServe(proc, url, marker, env, stderr)
    try:
        yield served
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in served.engines():  # never leave a stray Windows worker to the next test
            p.kill()


@pytest.mark.timeout(400)  # a cold Windows start under wine on a loaded machine: minutes, not seconds
def test_a_linux_client_chats_with_windows_serve_and_a_hard_kill_leaves_no_engine(
    wine: WinePython, wine_serve: WineServe
) -> None:
    client = openai.OpenAI(base_url=wine_serve.url + "/v1", api_key="unused", timeout=240, max_retries=0)
    started = time.monotonic()
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=16,
        extra_body={"grammar": GRAMMAR},
    )
    first_answer_s = time.monotonic() - started
    assert reply.choices[0].message.content == "the answer is 42"
    chunks = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "again"}],
        max_tokens=16,
        stream=True,
        extra_body={"grammar": GRAMMAR},
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == "the answer is 42"

    engines = wine_serve.engines()
    assert engines, "no llama.cpp worker process was seen while serve answered"

    # the command line as Windows code finds the Windows server through the home's server.json
    listed = json.loads(cli(wine, wine_serve, "ps", "--json"))
    assert [(lane["model"], lane["state"]) for lane in listed["lanes"]] == [("tiny", "ready")], listed
    before = {p.pid for p in engines}
    cli(wine, wine_serve, "unload", "tiny")
    stopped = time.monotonic()
    _gone, alive = psutil.wait_procs(engines, timeout=30)
    assert not alive, "the unloaded model's worker is still running"
    unload_s = time.monotonic() - stopped
    again = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=16,
        extra_body={"grammar": GRAMMAR},
    )
    assert again.choices[0].message.content == "the answer is 42"
    engines = wine_serve.engines()
    assert engines and not {p.pid for p in engines} & before

    wine_serve.proc.kill()  # type: ignore[attr-defined]  # SIGKILL to python.exe: no cleanup code runs
    wine_serve.proc.wait()  # type: ignore[attr-defined]
    killed = time.monotonic()
    _gone, alive = psutil.wait_procs(engines, timeout=15)
    assert not alive, f"engines outlived the killed serve: {[p.pid for p in alive]}"
    print(
        f"first answer {first_answer_s:.1f} s; unloaded worker gone {unload_s:.2f} s after `unload`; "
        f"engines gone {time.monotonic() - killed:.2f} s after the kill"
    )


def cli(wine: WinePython, served: WineServe, *args: str) -> str:
    """`switchyard ARGS` as Windows code, with serve's home: its standard output, or the test fails."""
    proc = wine.popen(["-m", "app", *args], env=served.env)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, f"switchyard {' '.join(args)} failed ({proc.returncode}): {err[-1500:]}"
    return out
