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
from tests.support.fakehub import FakeHub
from tests.support.tinymodels import CHAT, write_tiny_gguf
from tests.support.visiongen import write_tiny_mmproj

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before pytest-qt makes its QApplication
SMALL = "Qwen/Qwen2.5-0.5B-Instruct-GGUF"  # a tiny file: fits
BIG = "Qwen/Qwen3-8B-GGUF"  # a larger file than the budget: does not fit
VISION = "unsloth/gemma-3-4b-it-GGUF"  # a tiny file with an mmproj beside it
WHISPER = "ggerganov/whisper.cpp"
SHOTS = os.environ.get("SWITCHYARD_DESKTOP_SHOTS")  # a folder: save what the test sees, to look at
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
    from tests.support.asyncwait import until
    from tests.ui.test_new_user_window import shown

    monkeypatch.delenv("SWITCHYARD_NO_FIRST_RUN")
    paths = Paths(home=isolated_env)
    settings = Settings.flat(
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
            # nothing measured yet: the speed is the predicted range, never "-", for what fits on the CPU
            for i, r in enumerate(rows):
                if r["task"] == "chat" and r["verdict"] == "cpu":
                    assert r["tokens_per_s_range"] and t.item(i, 4).text().endswith("tok/s"), r
            assert t.horizontalHeaderItem(4).text() == "Speed (predicted)"
            # "Download anyway" warns first, naming the entry that fits; nothing is fetched
            t.cellWidget(big, 5).click()
            await desk.tasks.settle()
            said = disc.status.text()
            assert not desk.runtime.downloads.jobs, "it downloaded on the first press"
            fitting = rows[first_chat]["pull"][0]
            assert "does not fit" in said and f"A smaller model fits: {fitting}" in said, said
            assert "Press Download anyway again" in said and disc.status.isVisible()
            if SHOTS:
                from tests.ui.test_new_user_window import shot

                await asyncio.sleep(0.05)
                shot(w, "recommend-warned.png")
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
            # issue 32 item 13: the row says so, and cannot download it a second time
            await until(
                lambda: t.cellWidget(small, 5).text() == "In Library", what="the row to say In Library"
            )
            assert not t.cellWidget(small, 5).isEnabled()
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


def _machine(*, ram: int, bandwidth: int) -> Any:
    """This machine as probed, with `ram` free, no GPU and a measured all-cores `bandwidth` (bytes/s)."""
    import dataclasses

    from app.hardware.model import Bandwidth
    from app.hardware.probe import probe

    hw = probe(engine=False)
    memory = dataclasses.replace(hw.memory, total=ram, available=ram, cgroup_limit=None)
    bw = Bandwidth(single_core=bandwidth // 2, all_cores=bandwidth, threads=2, measured_at=time.time())
    return dataclasses.replace(hw, memory=memory, gpus=(), engine_devices=(), bandwidth=bw)


def test_first_run_ranks_by_predicted_speed_with_nothing_measured() -> None:
    """A genuine first run: no speed measured, the hub not asked. The ranking still follows the speed the
    bandwidth predicts (a range), and every entry that fits shows it, marked as predicted."""
    from app.advice.inputs import AdviceInputs
    from app.advice.recommend import Candidate, predicted_words, recommend
    from app.core.settings import Settings
    from app.fit.plan import SpeedCalibration

    mib = 1 << 20

    def c(repo: str, quality: int, size_mib: int) -> Candidate:
        return Candidate("chat", quality, repo, "Q4_K_M", (), size_mib * mib, "why")

    # 20 GB/s: the bound is 10 GB/s over the bytes read per token, the range a tenth of it up to it
    listed = [c("a/best-but-big", 0, 4096), c("a/middle", 1, 512), c("a/small", 2, 64)]
    hw = _machine(ram=32 << 30, bandwidth=20 * 10**9)
    inputs = AdviceInputs(settings=Settings(), hardware=hw, pins={})
    found = recommend(inputs, ask=None, candidates=listed).public()
    chat = found["tasks"]["chat"]
    assert [r["repo"] for r in chat] == ["a/small", "a/middle", "a/best-but-big"]
    assert all(r["fits"] for r in chat) and [r["usable"] for r in chat] == [True, None, False]
    for r in chat:  # nothing measured: a range, never a made-up single figure
        assert r["tokens_per_s"] is None and r["calibrated"] is False
        low, high = r["tokens_per_s_range"]
        assert high == round(10 * 10**9 / r["size"], 1) and low == round(high / 10, 1)
    words = [predicted_words(r) for r in chat]
    assert all("tok/s predicted" in w for w in words), words
    assert words[2].endswith("(slow)") and words[1].endswith("(may be slow)")
    # once this machine has measured answers, the calibrated figure is the prediction
    cal = {"CPU": SpeedCalibration(efficiency=0.5, models=2)}
    inputs = AdviceInputs(settings=Settings(), hardware=hw, pins={}, speed=cal)
    chat = recommend(inputs, ask=None, candidates=listed).public()["tasks"]["chat"]
    by = {r["repo"]: r for r in chat}
    assert by["a/middle"]["calibrated"] and by["a/middle"]["tokens_per_s_range"] is None
    assert by["a/middle"]["tokens_per_s"] == round(10 * 10**9 / (512 * mib) * 0.5, 1)
    assert by["a/middle"]["usable"] is True and by["a/best-but-big"]["usable"] is False
    assert predicted_words(by["a/middle"]).startswith("~") and "predicted" in predicted_words(by["a/middle"])


def test_recommend_cli_predicts_speed_and_loads_the_calibration(
    hub: FakeHub, measured: Path, isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`switchyard recommend --local`: with nothing measured, the hub's verdicts carry the predicted range;
    once library.db holds measured answers, the same command gives the calibrated figure."""
    from app.core.paths import Paths
    from app.library.speeds import LoadKey, SpeedStore
    from app.library.store import Library

    isolated_env.mkdir(parents=True, exist_ok=True)
    (isolated_env / "settings.json").write_text(json.dumps({"ram_budget_mib": BUDGET_MIB}))
    code, out = sy(capsys, "recommend", "--json", "--local", "--task", "chat")
    assert code == 0
    small = next(e for e in json.loads(out)["tasks"]["chat"] if e["repo"] == SMALL)
    assert small["source"] == "hub" and small["tokens_per_s"] is None and not small["calibrated"]
    low, high = small["tokens_per_s_range"]
    assert 0 < low < high
    code, text = sy(capsys, "recommend", "--local", "--task", "chat")
    line = next(x for x in text.splitlines() if SMALL in x)
    assert "tok/s predicted" in line and " - " not in line.split(SMALL, 1)[1][:60]
    # two measured models on this machine's CPU (64 MiB read per token each) calibrate the CPU path
    library = Library.open(Paths(home=isolated_env))
    try:
        store = SpeedStore(library)
        for i, tps in enumerate((30.0, 32.0)):
            key = LoadKey("llama.cpp", "CPU", 64 << 20, object())
            store.record(f"m{i}", key=key, prompt_tps=None, gen_tps=tps)
    finally:
        library.close()
    code, out = sy(capsys, "recommend", "--json", "--local", "--task", "chat")
    small = next(e for e in json.loads(out)["tasks"]["chat"] if e["repo"] == SMALL)
    assert small["calibrated"] is True and small["tokens_per_s"] and small["tokens_per_s_range"] is None
