"""An engine stopped with SIGSTOP (issue 33) held its clients for at least 25 s while its lane said
`ready`. A real server and engine: the stopped engine is found within seconds, its request answered with
an error, and the lane restarts it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ServerProcess, link_models, wait_gone


def _lane(server: ServerProcess) -> dict[str, Any]:
    lanes = httpx.get(server.url + "/api/lanes", timeout=10).json()["lanes"]
    return next(ln for ln in lanes if ln["model"] == "tiny")


def test_a_stopped_engine_is_found_within_seconds(tmp_path: Path, model_store: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"idle_ttl_s": 600}))
    server = ServerProcess(home, link_models(tmp_path / "models", model_store / "tiny.gguf")).wait_ready()
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    pids: list[int] = []
    try:
        assert httpx.post(server.api + "/chat/completions", json=chat, timeout=60).status_code == 200
        pid = int(_lane(server)["pid"])
        pids = server.engine_pids()
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        answer: dict[str, Any] = {}

        def ask() -> None:
            r = httpx.post(server.api + "/chat/completions", json=chat, timeout=120)
            answer.update(status=r.status_code, at=time.monotonic(), body=r.text)

        asker = threading.Thread(target=ask)
        asker.start()
        asker.join(30)
        assert answer, "the request to a stopped engine got no answer in 30 s"
        waited = answer["at"] - stopped_at
        assert waited < 8, f"a stopped engine held its client {waited:.1f} s"
        # the lane did not stay ready on a stopped engine: it was killed and started again
        deadline = time.monotonic() + 30
        while int(_lane(server).get("pid") or 0) in (0, pid) or _lane(server)["state"] != "ready":
            assert time.monotonic() < deadline, _lane(server)
            time.sleep(0.2)
        assert httpx.post(server.api + "/chat/completions", json=chat, timeout=60).status_code == 200
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
        pids = server.engine_pids()
        server.stop()
        wait_gone(pids, 5)
