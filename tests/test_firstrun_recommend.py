"""First run (issue 20): the curated list ranked for this machine, by `switchyard recommend` and by
Discover's Recommended view on an empty library (with a Download from it), and Discover's vision mark with
the projector counted in a quantization's size (issue 15). Against the fake hub, whose repositories are
named like the list's entries and hold tiny files; a RAM budget makes the big one not fit."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from app.advice.recommend import load_candidates
from tests.fakehub import FakeHub
from tests.tinymodels import CHAT, write_tiny_gguf
from tests.visiongen import write_tiny_mmproj

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before pytest-qt makes its QApplication
SMALL = "Qwen/Qwen2.5-0.5B-Instruct-GGUF"  # a tiny file: fits
BIG = "Qwen/Qwen3-8B-GGUF"  # a larger file than the budget: does not fit
VISION = "unsloth/gemma-3-4b-it-GGUF"  # a tiny file with an mmproj beside it
WHISPER = "ggerganov/whisper.cpp"
BUDGET_MIB = 660  # the tiny chat model fits in it (about 560 MiB with the engine), the large one does not


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, large_model: Path) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("firstrun")
    return {
        "small": write_tiny_gguf(d / "small.gguf", CHAT),
        "big": large_model,  # the session's 135 MB model, shared with other tests
        "mmproj": write_tiny_mmproj(d / "mmproj.gguf"),
    }


@pytest.fixture
def hub(fake_hub: FakeHub, files: dict[str, Path]) -> FakeHub:
    fake_hub.add_repo(SMALL, {"qwen2.5-0.5b-instruct-q4_k_m.gguf": files["small"]}, tags=["gguf"])
    fake_hub.add_repo(BIG, {"Qwen3-8B-Q4_K_M.gguf": files["big"]}, tags=["gguf"])
    fake_hub.add_repo(
        VISION,
        {"gemma-3-4b-it-Q4_K_M.gguf": files["small"], "mmproj-F16.gguf": files["mmproj"]},
        tags=["gguf"],
        pipeline_tag="image-text-to-text",
    )
    fake_hub.add_repo(WHISPER, {"ggml-base.en.bin": b"\0" * 4096})
    return fake_hub


@pytest.fixture
def measured(isolated_env: Path) -> Path:
    """This machine's memory bandwidth as already measured (the cache the probe reads): 20 GB/s, so the
    speeds are the same on every machine and no test waits for a measurement."""
    from app.hardware.bandwidth import machine_fingerprint, write_cache
    from app.hardware.model import Bandwidth

    bw = Bandwidth(single_core=10 * 10**9, all_cores=20 * 10**9, threads=2, measured_at=time.time())
    write_cache(isolated_env / "hardware.json", bw, fingerprint=machine_fingerprint())
    return isolated_env


def sy(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The command in this process (its parser is the installed one's): exit code and stdout."""
    from app.__main__ import main

    code = main(list(args))
    return code, capsys.readouterr().out


def test_the_list_is_packaged_and_well_formed() -> None:
    found = load_candidates()
    assert {c.task for c in found} == {"chat", "coding", "embeddings", "speech"}
    assert all("/" in c.repo and c.size > 0 and c.why and (c.quant or c.files) for c in found)
    assert any(c.vision for c in found)


def test_recommend_cli_ranks_what_fits(
    hub: FakeHub,
    measured: Path,
    isolated_env: Path,
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    isolated_env.mkdir(parents=True, exist_ok=True)
    (isolated_env / "settings.json").write_text(json.dumps({"ram_budget_mib": BUDGET_MIB}))
    code, out = sy(capsys, "recommend", "--json", "--local")
    assert code == 0
    doc = json.loads(out)
    assert doc["hub_problem"] is None
    chat = {e["repo"]: e for e in doc["tasks"]["chat"]}
    order = [e["repo"] for e in doc["tasks"]["chat"]]
    # the hub answered for these three: their verdicts come from the remote headers
    assert chat[SMALL]["source"] == "hub" and chat[SMALL]["fits"] is True
    assert chat[BIG]["source"] == "hub" and chat[BIG]["verdict"] == "too_large"
    assert chat[VISION]["vision"] and chat[VISION]["projector"] == "mmproj-F16.gguf"
    assert chat[VISION]["size"] == files["small"].stat().st_size + files["mmproj"].stat().st_size
    # fits first (the list's quality order among them), the big one after every fitting one
    fitting = [e["repo"] for e in doc["tasks"]["chat"] if e["fits"]]
    assert fitting and order[: len(fitting)] == fitting and SMALL in fitting
    assert order.index(BIG) >= len(fitting)
    # entries the hub does not have are judged from the list's sizes, and say so
    missing = chat["bartowski/Llama-3.2-1B-Instruct-GGUF"]
    assert missing["source"] == "list" and "list's size" in missing["note"] and missing["fits"] is False
    speech = {e["files"][0]: e for e in doc["tasks"]["speech"]}
    assert speech["ggml-base.en.bin"]["source"] == "hub" and speech["ggml-base.en.bin"]["size"] == 4096
    # offline: every verdict from the list, said once at the top; text output names the pull command
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out = sy(capsys, "recommend", "--task", "embeddings", "--local")
    assert code == 0
    assert out.startswith("note: ") and "offline" in out.splitlines()[0].lower()
    assert "embeddings" in out and "chat" not in out
    # the largest does not fit the budget, so the next one is the pick
    assert "pull it: switchyard pull nomic-ai/nomic-embed-text-v1.5-GGUF:Q8_0" in out


def test_first_run_opens_on_recommendations(
    qloop: asyncio.AbstractEventLoop,
    qapp: Any,
    tmp_path: Path,
    hub: FakeHub,
    measured: Path,
    isolated_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("qasync")
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.ui.desktop import Desktop
    from tests.asyncwait import until
    from tests.test_desktop_defects import shown

    monkeypatch.delenv("SWITCHYARD_NO_FIRST_RUN")
    paths = Paths(home=isolated_env)
    settings = Settings(
        port=0, models_dirs=(tmp_path / "models",), monitor_interval_s=0, ram_budget_mib=BUDGET_MIB
    )

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            w = desk.window
            w.resize(1024, 640)
            disc = w.show_page("Discover")
            await desk.tasks.settle()
            view = disc.recommend
            assert disc.views.currentWidget() is view, "an empty library opens on the recommendations"
            t = view.table
            rows = view.rows
            first_chat = next(i for i, r in enumerate(rows) if r["task"] == "chat")
            assert rows[first_chat]["fits"] is True and t.item(first_chat, 0).text() == "Chat"
            big = next(i for i, r in enumerate(rows) if r["repo"] == BIG)
            assert t.item(big, 3).text() == "does not fit" and big > first_chat
            assert t.cellWidget(big, 5).text() == "Download anyway"
            vision = next(i for i, r in enumerate(rows) if r["repo"] == VISION)
            assert "[vision]" in t.item(vision, 1).text()
            # nothing numeric is cut at 1024 x 640
            await asyncio.sleep(0.05)
            for r in range(t.rowCount()):
                for c in (2, 3, 4):
                    assert shown(t, r, c) == t.item(r, c).text(), (r, c, t.item(r, c).text())
            # keyboard: Tab reaches the table, its Download buttons and Back to search
            w.activateWindow()
            disc.query.setFocus()
            seen = []
            for _ in range(30):
                QTest.keyClick(qapp.focusWidget(), Qt.Key.Key_Tab)
                seen.append(qapp.focusWidget())
            assert t in seen and view.back in seen and disc.recommended_btn in seen
            # one Download: the same download job the quantization table starts
            small = next(i for i, r in enumerate(rows) if r["repo"] == SMALL)
            task = view.download(small, t.cellWidget(small, 5))
            await desk.tasks.settle()
            (job,) = task.result()
            await until(lambda: disc.job_state(job.id) == "completed", what="the download to finish")
            assert job.repo == SMALL
            # back to search; the vision repository is marked, its projector counted in the size
            view.back.click()
            assert disc.views.currentWidget() is disc.split
            disc.query.setText("gemma")
            disc.search()
            await desk.tasks.settle()
            assert disc.results.item(0, 0).text() == f"{VISION}  (vision)"
            await disc.open_model(VISION)
            await desk.tasks.settle()
            assert "[vision]" in disc.model_title.text()
            size = disc.quants.item(0, 1)
            want = files_total(hub, VISION)
            assert size.text() == want[0] and "vision projector mmproj-F16.gguf" in size.toolTip()
            # reachable again later
            disc.recommended_btn.click()
            assert disc.views.currentWidget() is view

    qloop.run_until_complete(scenario())


def files_total(hub: FakeHub, repo: str) -> tuple[str]:
    from app.ui import fmt

    return (fmt.size(sum(hub.file(repo, p).size for p in ("gemma-3-4b-it-Q4_K_M.gguf", "mmproj-F16.gguf"))),)


def test_rank_puts_usable_speed_before_quality() -> None:
    from app.advice.recommend import Candidate, Verdict, rank
    from app.hardware.probe import probe

    def c(repo: str, quality: int) -> Candidate:
        return Candidate("chat", quality, repo, "Q4_K_M", (), 1 << 30, "why")

    def v(fits: bool, tps: float | None) -> Verdict:
        return Verdict("cpu" if fits else "too_large", fits, "", tps, 1 << 30, "hub")

    judged = [
        (c("a/best-but-slow", 0), v(True, 2.0)),
        (c("a/too-big", 1), v(False, None)),
        (c("a/unknown-speed", 2), v(True, None)),
        (c("a/fast", 3), v(True, 40.0)),
    ]
    found = rank(judged, hardware=probe(engine=False))
    order = [r.candidate.repo for r in found.tasks["chat"]]
    assert order == ["a/fast", "a/unknown-speed", "a/best-but-slow", "a/too-big"]
    assert found.best("chat") is not None and found.public()["tasks"]["chat"][2]["usable"] is False
