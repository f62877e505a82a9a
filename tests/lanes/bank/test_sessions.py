"""Session banking on real engines: two generated models swapping in one lane, llama.cpp's slots saved
at each stop and restored when a conversation comes back (app/lanes/bank/sessions.py, bank_slots.py).

One server (and one restart of it in the same home) carries the whole story; the store's budget, its
supersede rule and its identity check are also tried on a real SQLite file without engines.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.core.units import fmt_bytes
from app.lanes.bank.sessions import (
    MIB,
    BankStore,
    Checkpoint,
    Identity,
    bank_dir,
    fingerprints,
    new_checkpoint_id,
)
from app.lanes.engines.plan import StartContext
from tests.conftest import REPO, ServerProcess, link_models, wait_gone
from tests.support.tinymodels import TinySpec, write_tiny_gguf

PINNED = {"grammar": 'root ::= "the answer is 42"'}
SYSTEM = {"role": "system", "content": "You keep long notes. " * 12}


def _first_turn(topic: str) -> list[dict[str, Any]]:
    return [SYSTEM, {"role": "user", "content": f"Tell me about {topic}. " * 10}]


def _ask(client: openai.OpenAI, model: str, messages: list[dict[str, Any]], **extra: Any) -> Any:
    return client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, extra_body={**PINNED, **extra}
    )


def _cached(answer: Any) -> int:
    details = answer.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details is not None else 0


def _bank(server: ServerProcess) -> dict[str, Any]:
    r = httpx.get(server.url + "/api/bank", timeout=10)
    r.raise_for_status()
    return r.json()


def _start(home: Path, models: Path) -> ServerProcess:
    return ServerProcess(home, models).wait_ready()


def _stop(server: ServerProcess) -> None:
    pids = server.engine_pids()
    assert server.stop() == 0, server.stderr_text()[-2000:]
    wait_gone(pids, 5)


@pytest.fixture(scope="module")
def banked(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[tuple[Path, Path]]:
    """(home, models dir): one lane at a time, two slots per engine."""
    root = tmp_path_factory.mktemp("bank")
    models = root / "models"
    models.mkdir()
    write_tiny_gguf(models / "tiny.gguf", TinySpec(seed=11))
    link_models(models, model_store / "tiny2.gguf")
    home = root / "home"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"max_loaded_lanes": 1, "parallel": 2}))
    yield home, models


def test_a_conversation_stays_warm_across_swaps_restarts_and_refuses_what_it_cannot_trust(
    banked: tuple[Path, Path],
) -> None:
    home, models = banked
    server = _start(home, models)
    try:
        client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
        convo = _first_turn("rivers")
        first = _ask(client, "tiny", convo)
        assert first.choices[0].message.content == "the answer is 42"
        convo += [{"role": "assistant", "content": "the answer is 42"}, {"role": "user", "content": "More."}]

        # another model in the one lane: tiny is swapped out, its slot saved into the bank
        other = _first_turn("mountains")
        _ask(client, "tiny2", other, cache_prompt=False)
        bank = _bank(server)
        tiny_rows = [c for c in bank["checkpoints"] if c["model"] == "tiny"]
        assert len(tiny_rows) == 1 and tiny_rows[0]["tokens"] >= first.usage.prompt_tokens
        assert tiny_rows[0]["messages"] == 2 and bank["bytes"] == tiny_rows[0]["bytes"]

        # tiny comes back (tiny2 swapped out: its cache_prompt:false slot is not banked)
        second = _ask(client, "tiny", convo)
        assert _cached(second) >= first.usage.prompt_tokens - 1, second.usage
        bank = _bank(server)
        assert not [c for c in bank["checkpoints"] if c["model"] == "tiny2"], bank
        assert bank["counters"]["restores"] == 1 and bank["counters"]["hits"] == 1
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        assert "switchyard_session_bank_restores_total 1" in metrics
        assert "switchyard_session_bank_saves_total 1" in metrics
        convo += [{"role": "assistant", "content": "the answer is 42"}, {"role": "user", "content": "Go on."}]

        # the same slot choice serves the translated surfaces: a Responses conversation, swapped out and back
        said = [{"role": "user", "content": "Describe a harbour at dawn. " * 8}]
        r1 = client.responses.create(model="tiny", input=said, max_output_tokens=8)  # type: ignore[arg-type]
        _ask(client, "tiny2", other)
        said += [{"role": "assistant", "content": r1.output_text}, {"role": "user", "content": "Then?"}]
        r2 = client.responses.create(model="tiny", input=said, max_output_tokens=8)  # type: ignore[arg-type]
        assert r2.usage is not None and r1.usage is not None
        assert r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens - 1, r2.usage
    finally:
        _stop(server)  # shutdown saves the grown Responses conversation (superseding its first checkpoint)

    rows = BankStore(home, budget_bytes=1 << 30).checkpoints("tiny")
    assert sorted(len(r.fingerprints) for r in rows) == [3, 4], rows

    # a new server process: the bank is on disk, the engine fresh
    server = _start(home, models)
    try:
        client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
        third = _ask(client, "tiny", convo)
        assert _cached(third) >= second.usage.prompt_tokens - 1, third.usage
        convo += [{"role": "assistant", "content": "the answer is 42"}, {"role": "user", "content": "And?"}]
        _ask(client, "tiny2", _first_turn("lakes"))  # swap: tiny's slot saved again
        cp = BankStore(home, budget_bytes=1 << 30).checkpoints("tiny")[0]
        slot_file = bank_dir(home) / "slots" / cp.filename
        misses = _bank(server)["counters"]["misses"]
        with slot_file.open("r+b") as f:
            f.truncate(cp.size - 1)  # llama.cpp would abort on this file: it must never see it
        fourth = _ask(client, "tiny", convo)
        assert fourth.choices[0].message.content == "the answer is 42"
        assert _cached(fourth) == 0, fourth.usage
        assert not slot_file.exists()
        assert "damaged" in server.stderr_text() and cp.id in server.stderr_text()
        assert _bank(server)["counters"]["misses"] == misses + 1
    finally:
        _stop(server)

    # the same name, another file: what the bank holds for "tiny" can no longer be trusted
    assert BankStore(home, budget_bytes=1 << 30).checkpoints("tiny")
    time.sleep(0.01)  # a new mtime even on a coarse clock
    write_tiny_gguf(models / "tiny.gguf", TinySpec(seed=12))
    server = _start(home, models)
    try:
        client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
        fifth = _ask(client, "tiny", [*convo[:-2], {"role": "user", "content": "Again."}])
        assert _cached(fifth) == 0, fifth.usage
        assert not [c for c in _bank(server)["checkpoints"] if c["model"] == "tiny"]
        assert "another model file" in server.stderr_text()
        cleared = httpx.delete(server.url + "/api/bank", timeout=10).json()
        assert cleared["dropped"] >= 1 and _bank(server)["checkpoints"] == []
    finally:
        _stop(server)


# four KiB of KV cache per token (4 layers x 256 K and V values x f16): a conversation of a few hundred
# tokens is a slot file of about 3 MiB, so a budget of 8 MiB holds two of them (grown a turn or two)
# and not three
WIDE = TinySpec(n_embd=256, n_layer=4, n_head=4, n_head_kv=4, n_ff=256, seed=21)
BUDGET_MIB = 8


def _held(server: ServerProcess, home: Path) -> dict[str, dict[str, Any]]:
    """The bank's checkpoints by id, after checking that /api/bank and the files in its folder agree and
    that both stay within the budget."""
    bank = _bank(server)
    budget = BUDGET_MIB * MIB
    assert bank["budget_bytes"] == budget
    rows = {c["id"]: c for c in bank["checkpoints"]}
    on_disk = {p.name: p.stat().st_size for p in (bank_dir(home) / "slots").iterdir()}
    assert on_disk == {f"{cid}.bin": c["bytes"] for cid, c in rows.items()}, (on_disk, rows)
    assert bank["bytes"] == sum(on_disk.values()) <= budget, bank
    return rows


def test_the_bank_never_exceeds_its_budget_and_evicts_the_least_recently_used_conversation(
    tmp_path: Path, model_store: Path
) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny2.gguf")
    write_tiny_gguf(models / "wide.gguf", WIDE)
    home = tmp_path / "home"
    home.mkdir()
    settings = {"max_loaded_lanes": 1, "parallel": 2, "session_bank_budget_mib": BUDGET_MIB}
    (home / "settings.json").write_text(json.dumps(settings))
    server = _start(home, models)
    try:
        client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)

        def turn(convo: list[dict[str, Any]]) -> Any:
            """One turn of `convo` on the wide model, then a swap to tiny2 (its own slot not banked), so
            the wide model's engine stops and saves what its slots hold."""
            answer = _ask(client, "wide", convo)
            assert answer.choices[0].message.content == "the answer is 42"
            _ask(client, "tiny2", [{"role": "user", "content": "Hi."}], cache_prompt=False)
            convo += [
                {"role": "assistant", "content": "the answer is 42"},
                {"role": "user", "content": "More."},
            ]
            return answer

        def opening(topic: str) -> list[dict[str, Any]]:
            """A conversation sharing no message with the others (a shared system prompt alone would
            restore another's checkpoint for its prefix)."""
            return [
                {"role": "system", "content": f"You keep long notes on {topic}. " * 12},
                {"role": "user", "content": f"Tell me about {topic}. " * 12},
            ]

        a, b, c = opening("rivers"), opening("mountains"), opening("lakes")
        a_first = turn(a)
        (a_id,) = _held(server, home)
        turn(b)
        held = _held(server, home)
        (b_id,) = set(held) - {a_id}
        size = max(cp["bytes"] for cp in held.values())
        # the story needs two conversations (grown a turn or two) to fit, and no three
        assert 3 * min(cp["bytes"] for cp in held.values()) > BUDGET_MIB * MIB >= 2 * size + size // 2, held

        # A comes back (restored from the bank, then saved again grown: its old checkpoint superseded)
        a_again = turn(a)
        assert _cached(a_again) >= a_first.usage.prompt_tokens - 1, a_again.usage
        held = _held(server, home)
        (a2_id,) = set(held) - {b_id}
        assert held[a2_id]["messages"] == 4 and held[b_id]["last_used"] < held[a2_id]["last_used"]

        # a third conversation does not fit beside them: B, the least recently used, goes
        turn(c)
        held = _held(server, home)
        assert len(held) == 2 and b_id not in held and a2_id in held, held
        (c_id,) = set(held) - {a2_id}
        assert not (bank_dir(home) / "slots" / f"{b_id}.bin").exists()
        assert f"dropped checkpoint {b_id} (over the session bank's budget)" in server.stderr_text()

        # B's next turn finds nothing in the bank; A's is still restored
        before = _bank(server)["counters"]
        b_again = _ask(client, "wide", b)
        assert b_again.choices[0].message.content == "the answer is 42"
        assert _cached(b_again) == 0, b_again.usage
        counters = _bank(server)["counters"]
        assert counters["restores"] == before["restores"] and counters["misses"] == before["misses"] + 1
        a_third = _ask(client, "wide", a)
        assert _cached(a_third) >= a_again.usage.prompt_tokens - 1, a_third.usage
        counters = _bank(server)["counters"]
        assert counters["restores"] == counters["hits"] == before["restores"] + 1, counters
        assert counters["misses"] == before["misses"] + 1
        held = _held(server, home)
        assert held[c_id]["last_used"] < held[a2_id]["last_used"]  # the restore counts as a use
    finally:
        _stop(server)  # shutdown saves B's and A's grown conversations: C, used least recently, goes

    store = BankStore(home, budget_bytes=BUDGET_MIB * MIB)
    rows = store.checkpoints()
    on_disk = {p.name: p.stat().st_size for p in store.slots.iterdir()}
    assert on_disk == {cp.filename: cp.size for cp in rows}
    assert store.total_bytes() == sum(on_disk.values()) <= BUDGET_MIB * MIB
    assert sorted(len(cp.fingerprints) for cp in rows) == [4, 6] and all(cp.tokens for cp in rows), rows
    assert c_id not in {cp.id for cp in rows}


def _cli(home: Path, *args: str) -> str:
    """`switchyard ARGS` as a user runs it beside the server of `home`; its output, after success."""
    env = dict(os.environ, SWITCHYARD_HOME=str(home))
    done = subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _lane(server: ServerProcess, model: str) -> dict[str, Any]:
    r = httpx.get(server.url + "/api/lanes", timeout=10)
    r.raise_for_status()
    return next(ln for ln in r.json()["lanes"] if ln["model"] == model)


def _wait(check: Any, what: str, within: float = 30) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_an_idle_stop_banks_the_conversation_and_the_cli_shows_it(tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"idle_ttl_s": 4, "parallel": 2}))
    server = _start(home, models)
    try:
        client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
        convo = _first_turn("forests")
        first = _ask(client, "tiny", convo)
        convo += [{"role": "assistant", "content": "the answer is 42"}, {"role": "user", "content": "More."}]

        # both footprints, in /api/lanes and in `switchyard ps`: the prediction and the settle measurement
        row = _wait(lambda: (ln := _lane(server, "tiny"))["footprint_measured"] and ln, "a settle footprint")
        measured, predicted = row["footprint_measured"], row["footprint_predicted"]
        assert measured["source"] == "measured" and measured["total"] == measured["devices"]["CPU"] > 0
        assert predicted["source"] == "predicted" and predicted["total"] > 0
        assert row["footprint"] == measured  # residency plans with the measurement once there is one
        ps = _cli(home, "ps")
        head, line = ps.splitlines()[0], next(x for x in ps.splitlines() if x.startswith("tiny "))
        assert "MEASURED" in head and "PREDICTED" in head
        assert fmt_bytes(measured["total"]) in line and fmt_bytes(predicted["total"]) in line, ps
        assert "session bank" not in ps  # nothing saved yet

        # idle past its TTL: the lane stops, and its conversation is saved into the bank on the way
        _wait(lambda: _lane(server, "tiny")["state"] == "stopped", "the idle stop")
        rows = [c for c in _bank(server)["checkpoints"] if c["model"] == "tiny"]
        assert len(rows) == 1 and rows[0]["tokens"] >= first.usage.prompt_tokens, rows
        assert "idle for 4 s" in server.stderr_text()
        ps = _cli(home, "ps")
        assert f"session bank: 1 saved conversation(s), {fmt_bytes(rows[0]['bytes'])} of " in ps, ps
        listed = _cli(home, "bank", "ls")
        assert listed.startswith("session bank: 1 saved conversation(s)"), listed
        assert any(x.split()[:3] == ["tiny", str(rows[0]["tokens"]), "2"] for x in listed.splitlines()), (
            listed
        )

        # the conversation comes back: the lane starts again and the banked prefix is restored, not re-read
        again = _ask(client, "tiny", convo)
        assert _cached(again) >= first.usage.prompt_tokens - 1, again.usage
        assert _bank(server)["counters"]["restores"] == 1

        cleared = _cli(home, "bank", "clear")
        assert cleared.startswith("dropped 1 of every saved conversations"), cleared
        assert _cli(home, "bank", "ls").startswith("session bank: 0 saved conversation(s)")
        assert "session bank" not in _cli(home, "ps")
    finally:
        _stop(server)


def _saved(store: BankStore, identity: Identity, messages: list[dict[str, Any]], size: int) -> Checkpoint:
    cid = new_checkpoint_id()
    (store.slots / f"{cid}.bin").write_bytes(b"x" * size)
    from app.lanes.bank.sessions import file_sha256

    now = time.time()
    cp = Checkpoint(
        id=cid,
        model_id="m",
        identity=identity,
        n_ctx=1024,
        tokens=size // 16,
        fingerprints=fingerprints(messages),
        size=size,
        sha256=file_sha256(store.slots / f"{cid}.bin"),
        created=now,
        last_used=now,
    )
    store.add(cp)
    return cp


def test_the_store_keeps_its_budget_the_longest_prefix_and_only_its_own_identity(tmp_path: Path) -> None:
    store = BankStore(tmp_path, budget_bytes=10_000)
    store.slots.mkdir(parents=True)
    ident = Identity("abc", "xllamacpp 1 b0", "slot_ctx=1024 kv=f16 fa=auto")
    a = [{"role": "user", "content": "a"}]
    short = _saved(store, ident, a, 3000)
    grown = [*a, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    longer = _saved(store, ident, grown, 3000)
    assert [c.id for c in store.checkpoints()] == [longer.id]  # the shorter one is superseded
    assert not (store.slots / short.filename).exists()

    asked = fingerprints([*grown, {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}])
    found = store.best("m", ident, asked)
    assert found is not None and found[0].id == longer.id and found[1] == 3
    assert store.best("m", ident, fingerprints([{"role": "user", "content": "z"}])) is None

    for i in range(4):  # four more conversations of 3000 bytes: only three fit the 10 000-byte budget
        _saved(store, ident, [{"role": "user", "content": f"other {i}"}], 3000)
    assert store.total_bytes() <= 10_000 and len(store.checkpoints()) == 3
    assert longer.id not in {c.id for c in store.checkpoints()}  # the least recently used went first

    other_engine = Identity("abc", "xllamacpp 2 b0", ident.ctx)
    assert store.best("m", other_engine, fingerprints([{"role": "user", "content": "other 3"}])) is None
    assert store.checkpoints() == []  # made by another engine build: dropped, never restored
    with sqlite3.connect(tmp_path / "bank" / "bank.db") as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    for leftover in (tmp_path / "bank").glob("bank.db-*"):
        leftover.unlink()
    (tmp_path / "bank" / "bank.db").write_bytes(b"not a database at all" * 100)
    assert store.checkpoints() == []  # a damaged index is moved aside and the bank starts empty
    assert list((tmp_path / "bank").glob("bank.db.corrupt-*"))


def test_a_container_runtime_says_why_it_does_not_bank(
    tmp_path: Path, model_store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from app.core.settings import Settings
    from app.lanes.engines.llamacpp.server import plan_for
    from app.lanes.install.runtimes import RuntimeChoice
    from app.library.catalog import Catalog

    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    settings = Settings.flat(models_dirs=(models,))
    assert settings.models.session_bank  # on by default: only the container turns it off
    entry = Catalog([models]).get("tiny")
    choice = RuntimeChoice(
        "docker", "cpu", "chosen for the test", (), image="ghcr.io/ggml-org/llama.cpp:server"
    )
    with caplog.at_level("INFO", logger="switchyard.llamaserver"):
        plan = plan_for(choice, entry, settings, StartContext(ppid=os.getpid(), port=1, hardware=None))
    said = [r.getMessage() for r in caplog.records if "session bank off" in r.getMessage()]
    assert said == [
        "session bank off for tiny: llama-server runs in a docker container, which cannot write the bank's "
        "folder on this machine (the bin or xllamacpp runtime banks)"
    ]
    assert said[0] in plan.notes and plan.params.slot_save_path == ""
    assert "--slot-save-path" not in plan.argv  # and the bank, which reads the plan, saves nothing
