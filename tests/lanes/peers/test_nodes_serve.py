"""Multi-node vLLM/SGLang launched through peers (issue 34), across three real `switchyard serve --tls`
processes with their own homes and libraries, on 127.0.0.1.

No GPU here: each serve's NVML is tests/support/fake_nvidia (a card as NVML reports it, its free memory
read from a file at every query), and SGLang counts as installed through an engine record in each home
whose Python is this one, which has no SGLang: a part that does start fails at once, as it would on a
machine where the install broke. Nothing pretends to run the engine; what is checked is what runs where
before it: the head's plan over its peers' own probes and libraries, each peer's own checks and the exact
program, environment and budget it would launch (`dry_run`), the routes' refusals, and a refused part
stopping the parts already started. Running the engines waits for lent GPU machines (docs/peers.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.advice.explain import render
from tests.conftest import REPO, ServerProcess, wait_gone
from tests.lanes.peers.test_peers_serve import address, api, cli, invite, wait_for
from tests.support.modelgen import LlamaDims, llama_tensors, write_hf_dir

FAKE_NVIDIA = REPO / "tests" / "support" / "fake_nvidia"
DIMS = LlamaDims(n_layer=4, hidden=64, heads=4, kv_heads=2, ff=128, vocab=100)
CARD = "24564:24000:8.9"  # an RTX 4090 as NVML reports it: total and free MiB, compute capability
MiB = 1 << 20
# what the autouse isolation gives a test, for servers that outlive one test
ISOLATION = {
    "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
    "SWITCHYARD_NO_STARTER": "1",
    "SWITCHYARD_NO_FIRST_RUN": "1",
    "HF_HUB_OFFLINE": "1",
}


@dataclass(frozen=True)
class Trio:
    a: ServerProcess  # the head: pairs with b as "bee" and c as "cee", trusts both links
    b: ServerProcess  # trusts its link to a
    c: ServerProcess  # does not trust its link to a
    a_on_b: str  # a's name in b's peers.json
    a_on_c: str


def sglang_record(home: Path) -> Path:
    """An SGLang engine environment in `home` whose Python is this one (which has no SGLang)."""
    venv = home / "engines" / "sglang" / "0.5.4"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    state = {"current": {"version": "0.5.4", "dir": "0.5.4", "installed_at": 0}}
    (venv.parent / "state.json").write_text(json.dumps(state))
    return venv / "bin" / "python"


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trio]:
    base = tmp_path_factory.mktemp("nodes")
    started: list[ServerProcess] = []
    with pytest.MonkeyPatch.context() as mp:
        for name, value in ISOLATION.items():
            mp.setenv(name, value)
        mp.setenv("PYTHONPATH", str(FAKE_NVIDIA))
        for name in ("a", "b", "c"):
            home, models = base / f"home-{name}", base / f"{name}-models"
            write_hf_dir(models / "llama", DIMS.config(), llama_tensors(DIMS))  # each machine's own copy
            sglang_record(home)
            (home / "nvidia.txt").write_text(CARD)
            mp.setenv("SWITCHYARD_TEST_NVIDIA_FILE", str(home / "nvidia.txt"))
            mp.setenv("HF_HOME", str(base / f"hf-{name}"))
            started.append(ServerProcess(home, models, "--tls"))
    try:
        a, b, c = (s.wait_ready(90) for s in started)
        for server, name in ((b, "bee"), (c, "cee")):
            code = invite(server)
            done = cli(a, "add", address(server), "--code", code["code"], "--name", name, "--json")
            assert done.returncode == 0, done.stderr
            assert cli(a, "trust", name, "--network").returncode == 0
        names = [api(s, "GET", "/api/peers").json()["peers"][0]["name"] for s in (b, c)]
        assert cli(b, "trust", names[0], "--network").returncode == 0  # c leaves its link untrusted
        assert wait_for(
            lambda: [p["state"] for p in api(a, "GET", "/api/peers").json()["peers"]] == ["ready"] * 2, 30
        )
        yield Trio(a, b, c, names[0], names[1])
    finally:
        pids = [p for s in started for p in s.engine_pids()]
        for s in started:
            s.stop()
        assert wait_gone(pids, 10) == []


def explain_across(server: ServerProcess, peers: str) -> dict[str, Any]:
    """`explain llama --across PEERS` as JSON (its `multinode`), and its text said the same way."""
    r = api(server, "GET", f"/api/models/llama/explain?across={peers}")
    assert r.status_code == 200, r.text
    return {**r.json()["multinode"], "text": render(r.json())}


def test_the_node_routes_want_a_paired_peer(trio: Trio) -> None:
    for method, path in (("POST", "/peer/node"), ("GET", "/peer/node/x"), ("DELETE", "/peer/node/x")):
        r = api(trio.b, method, path, {"launch": {}} if method == "POST" else None)
        assert r.status_code == 403 and r.json()["error"]["code"] == "peer_not_trusted", (path, r.text)


def test_a_dry_run_over_two_machines(trio: Trio) -> None:
    """explain --across bee: the head plans from b's own probe and library, and b checks its part itself
    and says the exact program, environment and budget it would start, starting nothing."""
    doc = explain_across(trio.a, "bee")
    assert "refused" not in doc, doc
    assert doc["engine"] == "sglang" and doc["pipeline_parallel"] == 2 and doc["layer_partition"] == [2, 2]
    head, part = doc["nodes"]
    assert (head["node"], part["node"]) == ("this machine", "bee")
    b_llama = str(trio.b.models_dir / "llama")
    assert head["model_path"] == str(trio.a.models_dir / "llama") and part["model_path"] == b_llama
    assert head["env"]["SGLANG_HOST_IP"] == part["env"]["SGLANG_HOST_IP"] == "127.0.0.1"
    (dry,) = doc["peers"]
    assert dry["peer"] == "bee" and dry["dry_run"] is True, dry
    python = str(trio.b.home / "engines" / "sglang" / "0.5.4" / "bin" / "python")
    argv = dry["argv"]
    guard = argv.index("--")
    assert argv[guard - 2 : guard] == ["app.lanes.guard", str(trio.b.proc.pid)]  # dies with b's server
    assert argv[guard + 1 : guard + 5] == [python, "-m", "sglang.launch_server", "--model-path"]
    assert argv[guard + 5] == b_llama  # b's own copy, as b's /peer/info listed it
    assert argv[guard + 2 : guard + 2 + len(part["args"])] == part["args"]  # the head's words, unchanged
    assert argv[-4:-1] == ["--host", "127.0.0.1", "--port"] and dry["port"] == int(argv[-1])
    assert ["--nnodes", "2", "--node-rank", "1"] == argv[argv.index("--nnodes") : argv.index("--nnodes") + 4]
    assert argv[argv.index("--dist-init-addr") + 1] == "127.0.0.1:29500"
    env = dry["env"]
    assert {k: env[k] for k in part["env"]} == part["env"]  # the plan's variables, as planned
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["SGLANG_PP_LAYER_PARTITION"] == "2,2"
    assert env["NCCL_SOCKET_IFNAME"] == "lo"  # b found its own interface toward the others
    budget = dry["budget"]
    assert budget["card_bytes"] == part["card_bytes"] > 0 and budget["total"] == part["budget"]
    assert budget["fraction"] == part["fraction"] and budget["free"] == {"0": 24000 * MiB}
    assert api(trio.b, "GET", "/api/nodes").json()["parts"] == []  # nothing started
    text = doc["text"]
    assert "sglang across this machine and bee: tensor parallel 1 x pipeline parallel 2" in text, text
    assert f"  bee: would start {' '.join(argv)}" in text, text
    assert trio.b.engine_pids() == []


def test_a_peer_refuses_what_it_does_not_trust_or_hold(trio: Trio) -> None:
    """c checks for itself: the link to a is not trusted on its end, and (its card taken since its probe)
    the part's memory is not free; both reasons, each with what to do."""
    card = trio.c.home / "nvidia.txt"
    card.write_text("24564:100:8.9")  # another program took the card since c reported it
    try:
        doc = explain_across(trio.a, "cee")
    finally:
        card.write_text(CARD)
    assert "refused" not in doc, doc  # the head's plan, from c's report, fits
    (said,) = doc["peers"]
    why = said["refused"]
    assert f"the network to {trio.a_on_c!r} is not marked as trusted on the machine asked" in why, why
    assert f"run `switchyard peers trust {trio.a_on_c} --network` on that machine too" in why, why
    assert "GPU 0 (NVIDIA GeForce RTX 4090) has 100 MiB free" in why, why
    assert f"  cee: {why}" in doc["text"]


def test_a_refused_part_stops_the_parts_already_started(trio: Trio) -> None:
    """Loading over bee and cee: b starts its part (under its guard), c refuses; the head stops b's part,
    names c's reason and what it stopped, and starts nothing of its own."""
    r = api(trio.a, "POST", "/api/models/llama/load", {"nodes": ["bee", "cee"]})
    assert r.status_code == 503, r.text
    message = r.json()["error"]["message"]
    assert "peer 'cee' did not start rank 2" in message and "as trusted" in message, message
    assert "stopped the parts already started on bee" in message, message
    logs = list((trio.b.home / "logs" / "lanes").glob("node-*-rank1.log"))
    assert logs, "b never started its part"  # it did start, before c refused
    assert wait_for(lambda: api(trio.b, "GET", "/api/nodes").json()["parts"] == [], 10)
    assert wait_for(lambda: trio.b.engine_pids() == [], 10)
    assert trio.a.engine_pids() == []
    saved = trio.a.home / "settings.json"  # the load body was not kept
    assert not saved.exists() or "nodes" not in json.loads(saved.read_text()).get("model_overrides", {})


def test_every_part_stops_with_the_head(trio: Trio) -> None:
    """With c trusting its link too, loading over bee and cee starts both peers' parts and then the head's
    own process; the head cannot run here (this Python has no SGLang), its lane fails, and both parts are
    stopped with it."""
    assert cli(trio.c, "trust", trio.a_on_c, "--network").returncode == 0
    r = api(trio.a, "POST", "/api/models/llama/load", {"nodes": ["bee", "cee"]})
    assert r.status_code >= 500, r.text
    assert "sglang" in r.json()["error"]["message"], r.text  # the head's own failure, from its log
    for peer in (trio.b, trio.c):
        assert list((peer.home / "logs" / "lanes").glob("node-*-rank*.log")), "a part never started"
    for peer in (trio.b, trio.c):
        assert wait_for(lambda p=peer: api(p, "GET", "/api/nodes").json()["parts"] == [], 15)
        assert wait_for(lambda p=peer: p.engine_pids() == [], 10)
    assert api(trio.a, "GET", "/api/nodes").json()["heads"] == []
