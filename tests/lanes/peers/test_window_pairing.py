"""The window's own server pairs like `serve --tls`: when it serves TLS (a network bind, or settings that
name a certificate) its TLS site is handed to the peers, so the CLI and /api/peers pair through it, and a
paired machine's model answers through the window's server. Its Stop takes pairing away again.

Before: the window never handed its site over, and every pairing through it failed with "peers need this
server to serve TLS" although it served HTTPS."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.server import tls
from app.server.admin.peers import PEERS
from app.ui.server_ctl import ServerControl
from tests.conftest import REPO, ServerProcess, link_models

GRAMMAR = 'root ::= "the answer is 42"'


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "peers", *args],
        cwd=REPO,
        env=dict(os.environ, SWITCHYARD_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.mark.timeout(300)
async def test_the_windows_server_pairs_and_routes_a_peers_model(
    tmp_path: Path, model_store: Path, start_server: Callable[..., ServerProcess]
) -> None:
    bee = await asyncio.to_thread(
        lambda: start_server(link_models(tmp_path / "bee-models", model_store / "tiny.gguf"), "--tls")
    )
    # the window: its own home, a certificate named in its settings (what the LAN switch does with its own)
    material = tls.self_signed(Paths(home=tmp_path / "certs"), host="127.0.0.1")
    paths = Paths(home=tmp_path / "window home")
    (tmp_path / "empty").mkdir()
    settings = Settings.flat(
        port=0,
        models_dirs=(tmp_path / "empty",),
        tls_cert=str(material.cert),
        tls_key=str(material.key),
        monitor_interval_s=0,
    )
    ctl = ServerControl(Runtime(settings=settings, paths=paths), paths)
    await ctl.setup()
    try:
        url = await ctl.start()
        assert url.startswith("https://")
        code = json.loads((await asyncio.to_thread(_cli, bee.home, "invite", "--json")).stdout)
        # the window's server redeems bee's code (the CLI finds it through the window's server.json)
        address = bee.url.split("//", 1)[1]
        done = await asyncio.to_thread(
            _cli, paths.home, "add", address, "--code", code["code"], "--name", "bee"
        )
        assert done.returncode == 0, done.stderr
        listed = await asyncio.to_thread(_cli, bee.home, "ls", "--json")
        assert listed.returncode == 0 and len(json.loads(listed.stdout)["peers"]) == 1, listed.stdout

        def chat() -> str:
            http = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(material.cert)))
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", http_client=http, max_retries=0)
            ids = [m.id for m in client.models.list()]
            assert "bee/tiny" in ids, ids
            reply = client.chat.completions.create(
                model="bee/tiny",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=16,
                extra_body={"grammar": GRAMMAR},
            )
            return reply.choices[0].message.content or ""

        assert await asyncio.to_thread(chat) == "the answer is 42"
        await ctl.stop()
        assert ctl.app[PEERS].listening is None  # no pairing through a site that is gone
    finally:
        await ctl.stop()
        await ctl.runner.cleanup()
