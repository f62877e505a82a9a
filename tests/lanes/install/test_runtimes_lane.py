"""The `bin` runtime end to end: a release pulled from the local host, then a real `switchyard serve`
whose llama.cpp lane runs that asset's llama-server (the stand-in) under the guard, asked through the
official openai client, streamed and whole."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import openai

from app.lanes.install.releases import ReleaseFetcher, load_releases
from tests.conftest import link_models, running_server
from tests.support.release_host import ReleaseHost, zip_asset
from tests.support.standin_llama_server import STANDIN_TEXT

KEY = "linux-x86_64-cpu"


def test_bin_runtime_serves_a_lane_from_the_pulled_release(model_store: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    pin = load_releases()["llama-server"]
    with ReleaseHost() as host:
        host.publish(pin.repo, pin.tag, pin.assets[KEY].name, zip_asset())
        got = ReleaseFetcher(home / "engines", api=host.url).fetch(pin, key=KEY)
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    with running_server(home, models, "--runtime", "bin") as server:
        client = openai.OpenAI(base_url=server.api, api_key="none")
        whole = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert whole.choices[0].message.content == STANDIN_TEXT
        pieces = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in pieces if c.choices) == STANDIN_TEXT
        with urllib.request.urlopen(f"{server.url}/api/lanes/tiny") as resp:
            lane = json.loads(resp.read())
        assert lane["runtime"] == "bin" and lane["state"] == "ready", lane
        log = (home / "logs" / "lanes" / "tiny.log").read_text()
        argv = json.loads(log.split("standin argv: ", 1)[1].splitlines()[0])
        assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--alias") + 1] == "tiny"
        assert "--- switchyard: starting tiny with bin" in log
    assert got.binary.is_file()
