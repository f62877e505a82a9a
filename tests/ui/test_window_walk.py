"""The window, round two (issue 32): each defect driven through the real widgets, offscreen, with a real
Desktop over a models folder of tiny generated models."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from PySide6.QtCore import Qt

from app.core.paths import Paths
from app.core.settings import Settings
from tests.support.modelgen import write_piper_voice, write_whisper_ggml
from tests.support.tinymodels import CHAT, write_tiny_gguf


def run_desk(
    qloop: asyncio.AbstractEventLoop,
    qapp: Any,
    home: Path,
    models: Path,
    body: Callable[[Any], Awaitable[None]],
    *,
    size: tuple[int, int] = (1024, 640),
    timeout: float = 90,
) -> None:
    from app.ui.desktop import Desktop

    settings = Settings(port=0, models_dirs=(models,), idle_ttl_s=0, monitor_interval_s=0)

    async def scenario() -> None:
        async with Desktop(Paths(home=home), settings, qapp=qapp) as desk:
            desk.window.resize(*size)
            desk.window.show()
            await body(desk)
            await desk.tasks.settle()

    qloop.run_until_complete(asyncio.wait_for(scenario(), timeout))


def selected_id(lib: Any) -> str | None:
    rows = lib.table.selectionModel().selectedRows()
    item = lib.table.item(rows[0].row(), 0) if rows else None
    return str(item.data(Qt.ItemDataRole.UserRole)) if item else None


# ---- 1. only models that can chat are offered for chat ---------------------------------------------------
def test_speech_models_are_not_offered_for_chat(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    models = tmp_path / "models"
    # named so that they sort before the chat model: the old default was the first id
    write_whisper_ggml(models / "aaa-whisper-tiny.bin")
    write_piper_voice(models / "aab-voice", "aab-en_US-test-medium")
    write_tiny_gguf(models / "zz-chat.gguf", CHAT)

    async def body(desk: Any) -> None:
        kinds = {e.id: e.kind for e in desk.runtime.catalog.servable()}
        assert sorted(kinds.values()) == ["chat", "speech", "transcription"], kinds
        chat = desk.window.show_page("Chat")
        offered = [chat.model.itemData(i) for i in range(chat.model.count())]
        assert offered == ["zz-chat"], offered
        cid = chat.new_conversation()
        assert desk.chats.get(cid).model == "zz-chat"
        srv = desk.window.show_page("Server")
        srv.refresh_state()
        text = srv.snippet.toPlainText()
        assert 'model="zz-chat"' in text and "whisper" not in text and "voice" not in text
        # an old conversation that names the whisper model says it cannot chat, and sends nothing
        old = desk.chats.create("old", model="aaa-whisper-tiny", system_prompt="")
        chat = desk.window.show_page("Chat")
        chat.open(old)
        assert chat.model.currentText() == "aaa-whisper-tiny (cannot chat)"
        task = chat.send("hello")
        assert task is not None
        await asyncio.gather(task, return_exceptions=True)
        last = desk.chats.messages(old)[-1]
        assert last.role == "error" and "cannot chat" in last.content, last

    run_desk(qloop, qapp, isolated_env, models, body)


# ---- 2. the Library's selection follows the model; a to z ----------------------------------------------
def test_library_selection_follows_the_model_through_refresh_and_delete(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    models = tmp_path / "models"
    for name in ("m-model", "p-model", "t-model"):
        write_tiny_gguf(models / f"{name}.gguf", CHAT)

    async def body(desk: Any) -> None:
        lib = desk.window.show_page("Library")
        await lib.refresh()
        names = [lib.table.item(r, 0).text() for r in range(lib.table.rowCount())]
        assert names == ["m-model", "p-model", "t-model"], names  # a to z, not z to a
        assert lib.select("p-model")
        await desk.tasks.settle()
        assert lib.tune.model == "p-model" and "p-model" in lib.tune.title()
        # two more models arrive (one sorts before, one after): the row index of p-model moves
        for name in ("b-model", "z-model"):
            write_tiny_gguf(models / f"{name}.gguf", CHAT)
        await lib.refresh()
        await desk.tasks.settle()
        assert lib.table.rowCount() == 5
        assert selected_id(lib) == "p-model", selected_id(lib)
        assert lib.tune.model == "p-model"
        assert "p-model" in lib.detail.text()
        assert lib.buttons["Delete"].toolTip() == "Delete p-model"
        # the delete acts on the highlighted model, and afterwards nothing of it is shown
        task = lib.delete(confirm=False)
        assert task is not None
        await task
        await desk.tasks.settle()
        assert not (models / "p-model.gguf").exists()
        assert "p-model" not in [lib.table.item(r, 0).text() for r in range(lib.table.rowCount())]
        assert selected_id(lib) is None
        assert lib.tune.model is None and "p-model" not in lib.tune.title()
        assert "p-model" not in lib.detail.text() and "p-model" not in lib.tune.verdict.text()
        assert not lib.buttons["Delete"].isEnabled()

    run_desk(qloop, qapp, isolated_env, models, body)


# ---- 3. the draft picker offers only smaller drafts, says their effect, in plain words --------------------
def test_draft_picker_offers_only_smaller_drafts_with_their_effect(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    import json

    from tests.support.tinymodels import MEDIUM

    models = tmp_path / "models"
    write_tiny_gguf(models / "small.gguf", CHAT)
    write_tiny_gguf(models / "big.gguf", MEDIUM)  # the same tokenizer, many times the size

    async def body(desk: Any) -> None:
        lib = desk.window.show_page("Library")
        tune = lib.tune
        labels = [tune.spec.itemText(i) for i in range(tune.spec.count())]
        assert not [t for t in labels if "_" in t or t in ("ngram", "draft")], labels  # no engine names
        tune.show_model("small")
        await tune.pairing
        tune.spec.setCurrentIndex(tune.spec.findData("draft"))
        await asyncio.sleep(0)
        box = tune.pages["draft"].draft
        offered = [box.itemData(i) for i in range(box.count())]
        assert "big" not in offered, [box.itemText(i) for i in range(box.count())]
        assert [box.itemText(i) for i in range(box.count())] == ["none qualifies"]
        # the big model tuned: the small one is proposed, with how much smaller it is and what to expect
        tune.show_model("big")
        await tune.pairing
        tune.spec.setCurrentIndex(tune.spec.findData("draft"))
        await asyncio.sleep(0)
        assert box.itemText(0).startswith("small (proposed, ") and "x smaller" in box.itemText(0)
        note = tune.pages["draft"].note.text()
        assert "of one of this model's steps" in note and "faster" in note, note
        # a larger draft named in settings.json is shown refused, saying why, and cannot be saved
        raw = json.loads(desk.paths.settings_file.read_text()) if desk.paths.settings_file.exists() else {}
        raw.setdefault("model_overrides", {})["small"] = {"speculative": {"type": "draft", "draft": "big"}}
        desk.paths.settings_file.write_text(json.dumps(raw))
        tune.show_model("small")
        await tune.pairing
        await tune._task
        assert box.currentText() == "big (refused)", box.currentText()
        assert "the size of the model" in tune.pages["draft"].note.text()
        assert "Cannot be applied" in tune.verdict.text() and tune.save() is False

    run_desk(qloop, qapp, isolated_env, models, body)


# ---- keyboard only: search -> download -> chat ---------------------------------------------------------
def test_keyboard_only_walk_from_search_to_download_to_chat(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path, fake_hub: Any
) -> None:
    """No mouse and no method calls on the pages: keys go to the focused widget, as a person's would."""
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication, QPushButton

    repo = "acme/Keyboard-Tiny-GGUF"
    gguf = write_tiny_gguf(tmp_path / "src" / "kb-tiny-Q8_0.gguf", CHAT)
    fake_hub.add_repo(repo, {"kb-tiny-Q8_0.gguf": gguf.read_bytes()}, tags=["gguf", "text-generation"])

    def focused() -> Any:
        return QApplication.focusWidget()

    def key(k: Any, mod: Any = Qt.KeyboardModifier.NoModifier) -> None:
        target = focused() or QApplication.activeWindow()
        assert target is not None, "nothing has the keyboard focus"
        QTest.keyClick(target, k, mod)

    async def tab_to(match: Callable[[Any], bool], what: str, *, limit: int = 60) -> Any:
        reached = []
        for _ in range(limit):
            key(Qt.Key.Key_Tab)
            await asyncio.sleep(0)
            w = focused()
            if isinstance(w, QPushButton):  # every button Tab reaches says what it does
                name = w.accessibleName() or w.text()
                assert name.strip(), f"a button with no accessible name: {w!r}"
                reached.append(name)
            if w is not None and match(w):
                return w
        raise AssertionError(f"Tab never reached {what}; buttons reached: {reached}")

    async def body(desk: Any) -> None:
        w = desk.window
        w.activateWindow()
        await asyncio.sleep(0.1)
        done = asyncio.get_running_loop().create_future()
        desk.bridge.received.connect(
            lambda kind, _d: done.done() or kind != "download.completed" or done.set_result(None)
        )
        QTest.keyClick(w, Qt.Key.Key_1, Qt.KeyboardModifier.ControlModifier)  # Discover
        QTest.keyClick(w, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)  # its search box
        disc = desk.window.pages["Discover"]
        assert focused() is disc.query
        QTest.keyClicks(focused(), "Keyboard")
        key(Qt.Key.Key_Return)
        await desk.tasks.settle()
        assert disc.results.rowCount() == 1
        await tab_to(lambda x: x is disc.results, "the results table")
        key(Qt.Key.Key_Down)  # arrows move inside the table: the first result opens
        await desk.tasks.settle()
        assert disc.detail is not None and disc.detail["id"] == repo
        button = await tab_to(
            lambda x: isinstance(x, QPushButton) and x.text() == "Download" and disc.quants.isAncestorOf(x),
            "the Download button in the files table",
        )
        assert button.accessibleName() == "Download Q8_0", button.accessibleName()
        key(Qt.Key.Key_Space)
        await asyncio.wait_for(done, 60)
        await desk.tasks.settle()
        # Why? in the same table is reached the same way
        why = await tab_to(
            lambda x: isinstance(x, QPushButton) and x.text() == "Why?" and disc.quants.isAncestorOf(x),
            "the Why? button",
        )
        assert why.accessibleName() == "Why Q8_0 fits or not"
        # the chat: Ctrl+3, Ctrl+N, type, Ctrl+Enter
        QTest.keyClick(w, Qt.Key.Key_3, Qt.KeyboardModifier.ControlModifier)
        chat = desk.window.pages["Chat"]
        QTest.keyClick(w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
        assert focused() is chat.input
        assert chat.model.currentData() is not None and "kb-tiny" in str(chat.model.currentData()).lower()
        chat.max_tokens.setValue(8)
        QTest.keyClicks(focused(), "Hello")
        key(Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
        for _ in range(600):
            await asyncio.sleep(0.1)
            if chat.stream_task is None:
                break
        messages = desk.chats.messages(chat.current)
        assert [m.role for m in messages] == ["user", "assistant"], [(m.role, m.content) for m in messages]
        assert messages[0].content == "Hello" and messages[1].meta.get("tokens"), messages[1]

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body, timeout=150)


# ---- 5, 14, 15, 17: long titles, small sizes, sentences, Ctrl+N, the About box ---------------------------
def test_long_titles_small_files_plain_sentences_and_one_empty_chat(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from PySide6.QtTest import QTest

    from app.ui import fmt
    from app.ui.explain_view import _speed

    models = tmp_path / "models"
    write_tiny_gguf(models / "tiny.gguf", CHAT)
    small = write_whisper_ggml(models / "small-whisper.bin")  # a model of some KiB
    assert 1024 < small < 1024 * 1024

    async def body(desk: Any) -> None:
        w = desk.window
        w.activateWindow()  # shortcuts go to the active window
        await asyncio.sleep(0.1)
        # 17: Ctrl+N twice leaves one empty chat, not two
        QTest.keyClick(w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
        QTest.keyClick(w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
        chat = w.pages["Chat"]
        assert len(desk.chats.conversations()) == 1
        assert "F9" in w.about_text()
        # 5: a long title and a long loading line do not widen the window past a 1024-px screen
        chat.rename(chat.current, "How do I write a Python decorator that caches results per argument")
        chat.phase.setText(
            "Loading acme/Some-Long-Model-Name-Instruct-Q4_K_M… the first reply waits for the model to start"
        )
        await asyncio.sleep(0.1)
        assert w.width() == 1024 and w.minimumSizeHint().width() <= 1024, w.minimumSizeHint()
        # 14: a model of some KiB is not "0.0 MiB"
        lib = w.show_page("Library")
        await lib.refresh()
        row = next(r for r in range(lib.table.rowCount()) if "small" in lib.table.item(r, 0).text())
        size = lib.table.item(row, 3).text()
        assert size.endswith("KiB") and not size.startswith("0.0"), size
        # 15: the Settings page says what it applied in its own words
        settings = w.show_page("Settings")
        settings.endpoint.setText("http://127.0.0.1:9")
        assert settings.save()
        await settings.applying
        said = settings.saved.text()
        assert "Hugging Face mirror" in said and "hf_endpoint" not in said, said

    run_desk(qloop, qapp, isolated_env, models, body)
    # 15: numbers and sentences that read whole
    assert fmt.tps(0.04) == "0.04" and fmt.tps(0.43) == "0.43" and fmt.tps(3.42) == "3.4"
    assert fmt.verdict({"verdict": "cpu", "tokens_per_s_range": [0.04, 0.4]}).endswith("(0.04-0.4 tok/s)")
    assert fmt.size(4608) == "4.5 KiB" and fmt.size(512) == "512 B"
    none = _speed({"speed_note": ""}, None, True)
    assert "predicted not" not in none and "measured not" not in none, none
    assert _speed({"tokens_per_s": 12.0}, 9.5, True).endswith("measured 9.5 tok/s")


# ---- 7. voice buttons without the audio package are off, saying why -------------------------------------
def test_voice_buttons_are_off_with_the_reason_when_audio_is_missing(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path, monkeypatch: Any
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "sounddevice", None)  # as a `make run` without the gui extra has it

    async def body(desk: Any) -> None:
        chat = desk.window.show_page("Chat")
        await asyncio.sleep(0.05)
        voice = chat.voice
        assert not voice.talk_btn.isEnabled() and not voice.read_btn.isEnabled()
        assert "sounddevice" in voice.talk_btn.toolTip() and "pip install" not in voice.talk_btn.toolTip()
        assert "sounddevice" in voice.missing.text()
        # audio the caller brings (a test's source, another sink) needs no package: the buttons come back
        voice.source_factory = lambda: None  # type: ignore[assignment,return-value]
        voice.sink = object()  # type: ignore[assignment]
        voice.refresh_devices()
        assert voice.talk_btn.isEnabled() and voice.read_btn.isEnabled()

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)


# ---- 12. a gated repository's page does not say "no file fits" when nothing could be read ----------------
def test_gated_repository_says_fit_unknown_not_none_fits(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path, fake_hub: Any
) -> None:
    from app.ui.pages.discover import NONE_FITS

    repo = "acme/Gated-Tiny-GGUF"
    gguf = write_tiny_gguf(tmp_path / "src" / "gated-Q8_0.gguf", CHAT).read_bytes()
    fake_hub.add_repo(
        repo, {"gated-Q8_0.gguf": gguf, "gated-Q4_K_M.gguf": gguf}, tags=["gguf"], gated="manual"
    )

    async def body(desk: Any) -> None:
        disc = desk.window.show_page("Discover")
        disc.query.setText("Gated")
        disc.search()
        await desk.tasks.settle()
        disc.results.selectRow(0)
        await desk.tasks.settle()
        assert disc.detail is not None and disc.detail["id"] == repo
        verdicts = {disc.quants.item(r, 2).text() for r in range(disc.quants.rowCount())}
        assert verdicts == {"unknown"}, verdicts
        meta = disc.model_meta.text()
        assert NONE_FITS not in meta, meta
        assert "unknown" in meta and "gated" in meta, meta

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)


# ---- 9. the newest download on top, jobs in the downloads' units, no jump when a job comes and goes -------
def test_downloads_newest_on_top_and_the_jobs_panel_does_not_move_the_page(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path, fake_hub: Any
) -> None:
    gguf = write_tiny_gguf(tmp_path / "src" / "one-Q8_0.gguf", CHAT).read_bytes()
    for repo in ("acme/First-GGUF", "acme/Second-GGUF"):
        fake_hub.add_repo(repo, {"m-Q8_0.gguf": gguf}, tags=["gguf"])

    async def body(desk: Any) -> None:
        disc = desk.window.show_page("Discover")
        for repo in ("acme/First-GGUF", "acme/Second-GGUF"):
            done = asyncio.get_running_loop().create_future()

            def seen(kind: str, _d: Any, fut: asyncio.Future[None] = done) -> None:
                if kind == "download.completed" and not fut.done():
                    fut.set_result(None)

            desk.bridge.received.connect(seen)
            disc.query.setText(repo.split("/")[1])
            disc.search()
            await desk.tasks.settle()
            disc.results.selectRow(0)
            await desk.tasks.settle()
            disc.download("Q8_0")
            await asyncio.wait_for(done, 30)
            desk.bridge.received.disconnect(seen)
        await desk.tasks.settle()
        top = disc.downloads.item(0, 0).text()
        assert "Second" in top, [disc.downloads.item(r, 0).text() for r in range(disc.downloads.rowCount())]
        # a job appears and goes: the page above keeps its place and height
        jobs = disc.panel.jobs_panel
        await asyncio.sleep(0.05)
        before = disc.views.geometry()
        job = {
            "id": "job-1",
            "kind": "download",
            "title": "acme/Third-GGUF",
            "state": "running",
            "steps": [{"name": "download", "done": 4608, "total": 3 * 1024 * 1024}],
            "progress": 0.001,
        }
        jobs.update_job(job)
        await asyncio.sleep(0.05)
        assert jobs.table.item(0, 2).text() == "download 4.5 KiB of 3.0 MiB"
        assert disc.views.geometry() == before
        jobs.on_event("job.completed", {**job, "state": "completed"})
        await asyncio.sleep(0.05)
        assert disc.views.geometry() == before

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)


# ---- 11. a LoRA import is refused in the window's words; dropped files show when the window comes back ---
def test_lora_import_words_and_models_seen_when_the_window_comes_back(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from PySide6.QtWidgets import QWidget

    from tests.support.loragen import write_tiny_lora

    models = tmp_path / "models"
    write_tiny_gguf(models / "base.gguf", CHAT)
    lora = write_tiny_lora(tmp_path / "elsewhere" / "style-lora.gguf", CHAT)

    async def body(desk: Any) -> None:
        w = desk.window
        lib = w.show_page("Library")
        await lib.refresh()
        task = lib.import_path(Path(lora))
        await asyncio.gather(task, return_exceptions=True)
        said = lib.status.text()
        assert "LoRA adapter" in said and "LoRA adapters" in said, said
        assert "model_overrides" not in said and "{" not in said and "[" not in said, said
        # a model copied into the folder while another window is in front: seen when this one is back
        other = QWidget()
        other.show()
        other.activateWindow()
        await asyncio.sleep(0.1)
        write_tiny_gguf(models / "dropped.gguf", CHAT)
        await asyncio.sleep(RESCAN_PAUSE)
        w.activateWindow()
        await asyncio.sleep(0.2)
        await desk.tasks.settle()
        names = [lib.table.item(r, 0).text() for r in range(lib.table.rowCount())]
        assert "dropped" in names, names
        chat = w.pages["Chat"]
        assert "dropped" in [chat.model.itemData(i) for i in range(chat.model.count())]
        other.close()

    run_desk(qloop, qapp, isolated_env, models, body)


RESCAN_PAUSE = 2.1  # the window reads the folders at most every 2 s


# ---- 10. the Lanes page: short health cells, no Install of an engine this machine cannot run -------------
def test_engines_table_is_brief_and_refuses_cuda_installs_without_a_gpu(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    async def body(desk: Any) -> None:
        assert not [g for g in (desk.runtime.hardware.gpus or ()) if g.vendor == "nvidia"], (
            "needs no GPU here"
        )
        lanes = desk.window.show_page("Lanes")
        panel = lanes.engines
        table = panel.table
        for r in range(table.rowCount()):
            cell = table.item(r, 5)
            assert len(cell.text()) <= 70 and "pip install" not in cell.text(), cell.text()
            assert cell.toolTip().startswith(cell.text().rstrip("…"))  # the whole text is in the tooltip
        row = next(i for i, r in enumerate(panel.rows) if r["engine"] == "vllm")
        table.selectRow(row)
        await asyncio.sleep(0)
        assert not panel.install_btn.isEnabled()
        assert "NVIDIA GPU" in panel.install_btn.toolTip(), panel.install_btn.toolTip()

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)


# ---- last round: a new API key does not stay on screen; buttons are off when they cannot act -------------
def test_new_key_leaves_the_screen_and_idle_buttons_are_off(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    async def body(desk: Any) -> None:
        w = desk.window
        srv = w.show_page("Server")
        assert not srv.revoke_btn.isEnabled()  # no key selected
        key = srv.create_key("laptop")
        assert key and srv.new_key.text() == key
        srv.keys.selectRow(0)
        assert srv.revoke_btn.isEnabled()
        w.show_page("Chat")
        assert srv.new_key.text() == "", "the key stayed on the Server page after leaving it"
        chat = w.pages["Chat"]
        chat.new_conversation()
        assert not chat.regen_btn.isEnabled() and not chat.edit_btn.isEnabled()
        assert not chat.copy_btn.isEnabled()

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)
