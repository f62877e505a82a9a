"""Placement across machines, with two real `serve --tls` processes: a bare model id that does not fit
this machine (or that only a peer has) runs on the paired peer where it fits; `explain` says so; a
`PEER/MODEL` id and a model that fits here are never moved."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import psutil

from tests.conftest import ServerProcess, link_models
from tests.lanes.peers.test_peers_serve import address, api, cli, invite, trusting, wait_for

GRAMMAR = 'root ::= "placed"'


def engines(server: ServerProcess) -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process(server.proc.pid).children(recursive=True)
        if "app.lanes.guard" not in " ".join(p.cmdline())
    ]


def test_a_model_runs_on_the_peer_where_it_fits(
    tmp_path: Path, model_store: Path, start_server: Callable[..., ServerProcess]
) -> None:
    # a keeps so much memory in reserve that no model fits it; b fits them, and has one a lacks
    a_home = tmp_path / "home0"
    a_home.mkdir()
    (a_home / "settings.json").write_text(json.dumps({"memory_reserve_mib": 1 << 30}))
    a_models = link_models(tmp_path / "a-models", model_store / "tiny.gguf")
    b_models = link_models(tmp_path / "b-models", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    a = start_server(a_models, "--tls")
    b = start_server(b_models, "--tls")
    code = invite(b)
    done = cli(a, "add", address(b), "--code", code["code"], "--name", "bee", "--json")
    assert done.returncode == 0, done.stderr
    assert wait_for(lambda: "bee/tiny2" in [m["id"] for m in api(a, "GET", "/v1/models").json()["data"]])

    client = openai.OpenAI(
        base_url=a.api, api_key="unused", http_client=httpx.Client(verify=trusting(a), timeout=120)
    )
    for model in ("tiny", "tiny2"):  # too big here / not here at all: both answered by b
        said = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "where?"}],
            max_tokens=8,
            extra_body={"grammar": GRAMMAR},
        )
        assert said.choices[0].message.content == "placed"
    assert engines(a) == [], [p.cmdline() for p in engines(a)]  # nothing started here
    assert engines(b)  # b runs them

    explained = api(a, "GET", "/api/models/tiny/explain").json()
    assert explained["placed"]["peer"] == "bee" and explained["placed"]["model"] == "bee/tiny"
    assert explained["decision_text"].startswith("runs on peer 'bee': it does not fit this machine")
    only_there = api(a, "GET", "/api/models/tiny2/explain").json()
    assert only_there["placed"]["why"].startswith("this machine has no model of that id")
    assert only_there["machine"]["peer"] == "bee"

    # a PEER/MODEL id pins the machine: one that peer does not have is refused, not placed elsewhere
    r = api(
        a,
        "POST",
        "/v1/chat/completions",
        {"model": "bee/none", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 404
