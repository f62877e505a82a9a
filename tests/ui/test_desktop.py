"""The desktop window end to end, offscreen, on the real Runtime and the local fake hub:
search → model page → fit verdict and Why → download → Library → load → chat (streamed, stopped,
regenerated) → API key → close to tray while the server answers → quit with no engine left."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
qasync = pytest.importorskip("qasync")

from PySide6.QtCore import QUrl  # noqa: E402
from PySide6.QtGui import QGuiApplication  # noqa: E402
from PySide6.QtWidgets import QLabel  # noqa: E402

from app.core.paths import Paths  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from app.ui.pages.library import COLUMNS  # noqa: E402
from tests.conftest import wait_gone  # noqa: E402
from tests.support.asyncwait import until  # noqa: E402
from tests.support.fakehub import FakeHub  # noqa: E402
from tests.support.tinymodels import CHAT, write_tiny_gguf  # noqa: E402

REPO = "acme/tiny-chat-GGUF"


async def event(desk: Any, kind: str, *, limit: float = 60) -> dict[str, Any]:
    """A future the bridge's signal resolves: the next event of `kind`."""
    fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    def on(k: str, data: Any) -> None:
        if k == kind and not fut.done():
            fut.set_result(data)

    desk.bridge.received.connect(on)
    try:
        return await asyncio.wait_for(fut, limit)
    finally:
        desk.bridge.received.disconnect(on)


def test_discover_download_chat_keys_tray_quit(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, fake_hub: FakeHub, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    gguf = write_tiny_gguf(tmp_path / "src" / "tiny-chat-Q8_0.gguf", CHAT)
    fake_hub.add_repo(
        REPO,
        {
            "tiny-chat-Q8_0.gguf": gguf,
            "README.md": b"---\nlicense: mit\n---\n# Tiny chat\n\nA **test** model.\n",
        },
        tags=["gguf"],
        downloads=1234,
        likes=5,
    )
    paths = Paths(home=isolated_env)
    settings = Settings.flat(port=0, models_dirs=(tmp_path / "models",), idle_ttl_s=0)

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            w = desk.window
            assert desk.server.running and desk.server.url
            # --- Discover: search, open, verdict, why
            disc = w.show_page("Discover")
            disc.query.setText("tiny")
            disc.search_btn.click()
            await desk.tasks.settle()
            assert disc.results.rowCount() == 1 and disc.results.item(0, 0).text() == REPO
            assert disc.results.item(0, 1).text() == "1.2k"
            disc.results.selectRow(0)
            await desk.tasks.settle()
            assert disc.quants.item(0, 0).text() == "Q8_0"
            verdict = disc.quants.item(0, 2).text()
            assert verdict in ("CPU only", "fits on the GPU", "partial GPU offload") or verdict.startswith(
                "CPU only"
            )
            assert "license: mit" in disc.model_meta.text().lower()
            assert "test" in disc.card.toPlainText()
            dlg = disc.why("Q8_0")
            assert dlg is not None
            texts = " ".join(lab.text() for lab in dlg.view.findChildren(type(w.server_label)))
            assert "Lane chosen: llama.cpp" in texts and "Lanes turned down" in texts and "weights" in texts
            # --- download through the panel
            done = asyncio.ensure_future(event(desk, "download.completed"))
            disc.download("Q8_0")
            await desk.tasks.settle()
            data = await done
            assert data["repo"] == REPO
            await until(
                lambda: any(disc.job_state(j) == "completed" for j in disc._jobs), what="completed row"
            )
            # --- Library: it is there; load it
            lib = w.show_page("Library")
            await desk.tasks.settle()
            ids = [r["id"] for r in lib.rows]
            mid = next(i for i in ids if "tiny-chat" in i)
            assert lib.select(mid)
            lib.load()
            await desk.tasks.settle(limit=90)
            lane = desk.runtime.supervisor.lanes[mid]
            assert str(lane.state) == "ready"
            loaded, lane_col = COLUMNS.index("Loaded"), COLUMNS.index("Lane")
            await until(
                lambda: any(lib.table.item(r, loaded).text() == "ready" for r in range(lib.table.rowCount())),
                what="loaded column",
            )
            # every row names the lane it runs (or would run) on: here all are GGUF, so llama.cpp
            assert {lib.table.item(r, lane_col).text() for r in range(lib.table.rowCount())} == {"llama.cpp"}
            pid = lane.proc.pid
            # Explain of the loaded model: its predicted against measured memory
            dlg = await lib.explain(mid)
            assert "predicted / measured" in " ".join(lab.text() for lab in dlg.view.findChildren(QLabel))
            # per-model settings: the fit is recomputed as they change; what does not fit is refused
            tune = lib.tune
            assert tune.model == mid
            tune.kv.setCurrentText("f32")
            tune.ctx.setValue(200_000_000)
            await tune._task
            assert (
                "Does not fit" in tune.verdict.text()
                and "largest context that fits is" in tune.verdict.text()
            )
            assert tune.save() is False and "Not saved" in tune.verdict.text()
            tune.ctx.setValue(4096)
            await tune._task
            assert (
                tune.verdict.text().startswith("<span style='color:")
                and ">Fits</span>: " in tune.verdict.text()
            )
            assert tune.save() is True and tune.applying is not None
            await tune.applying  # the loaded lane restarts with the new values (issue 16)
            pid = lane.proc.pid
            saved = json.loads(paths.settings_file.read_text())["model_overrides"][mid]
            assert saved == {"ctx_size": 4096, "kv_type": "f32"}  # only the values changed
            # pin a lane: one that cannot run the model is refused with why; llama.cpp is kept in pins.json
            await tune.pin("mlx")
            assert "Not pinned to mlx" in tune.verdict.text() and not (paths.home / "pins.json").exists()
            await tune.pin("llama.cpp")
            assert json.loads((paths.home / "pins.json").read_text()) == {mid: "llama.cpp"}
            await tune.pin(None)
            assert json.loads((paths.home / "pins.json").read_text()) == {}
            # update check: a new commit on the hub is fetched; then it is up to date
            fake_hub.commit(REPO, {"README.md": b"# Tiny chat v2\n"})
            done = asyncio.ensure_future(event(desk, "download.completed"))
            job = await lib.check_update(mid)
            assert job is not None and job.kind == "update"
            await done
            assert await lib.check_update(mid) is None
            assert desk.notices[-1][0] == "Up to date"
            # Delete is refused while loaded; an imported copy can be deleted
            assert lib.delete(mid, confirm=False) is None and "unload it first" in lib.status.text()
            assert any(r["id"] == mid for r in lib.rows)
            await lib.import_path(gguf)
            imported = next(r["id"] for r in lib.rows if r.get("source") == "import_copy")
            await lib.delete(imported, confirm=False)
            assert all(r["id"] != imported for r in lib.rows)
            # the Lanes page shows the lane and its pid
            lanes = w.show_page("Lanes")
            row = lanes.ids.index(mid)
            assert lanes.table.item(row, 1).text() == "ready" and lanes.table.item(row, 3).text() == str(pid)
            # --- Chat: streamed reply, stop mid-stream, regenerate
            chat = w.show_page("Chat")
            cid = chat.new_conversation(model=mid)
            chat.max_tokens.setValue(12)
            # random weights may pick end-of-text or half a UTF-8 character first: ask for all 12 tokens
            desk.chats.configure(cid, sampling={"ignore_eos": True})
            task = chat.send("hello there")
            await asyncio.gather(task, return_exceptions=True)
            msgs = desk.chats.messages(cid)
            assert [m.role for m in msgs] == ["user", "assistant"], [(m.role, m.content) for m in msgs]
            assert msgs[1].content and msgs[1].meta["ttft_s"] is not None and msgs[1].meta["tokens"] > 0
            assert "first token" in chat.view.toPlainText()
            assert desk.chats.get(cid).title == "hello there"
            desk.chats.configure(cid, sampling={"ignore_eos": True})  # kept beside the page's own fields
            chat.max_tokens.setValue(3000)
            task = chat.send("and a long one")
            await until(
                lambda: (chat.live and len(chat.live["text"]) > 0) or task.done(), what="first streamed token"
            )
            assert not task.done(), [(m.role, m.content[:200]) for m in desk.chats.messages(cid)]
            chat.stop()
            await asyncio.gather(task, return_exceptions=True)
            stopped = desk.chats.messages(cid)[-1]
            assert stopped.role == "assistant" and stopped.meta["stopped"] is True
            assert stopped.meta["tokens"] < 3000
            desk.chats.configure(cid, sampling={})
            chat.open(cid)
            chat.max_tokens.setValue(8)
            task = chat.regenerate()
            assert task is not None
            await asyncio.gather(task, return_exceptions=True)
            after = desk.chats.messages(cid)
            assert [m.role for m in after] == ["user", "assistant", "user", "assistant"]
            assert after[-1].content and after[-1].meta["stopped"] is False
            assert 0 < after[-1].meta["tokens"] <= 8  # Regenerate takes the page's Max tokens
            assert desk.chats.get(cid).sampling["max_tokens"] == 8
            assert after[-1].meta["context_size"] and after[-1].meta["context_used"] > 0
            assert "context" in chat.view.toPlainText()
            assert chat.copy_last_reply() == after[-1].content
            # a code block in a reply gets its own Copy link
            reply = "Try:\n\n```python\nprint('hi')\n```\n\nor\n\n```\nls -l\n```\n"
            desk.chats.add(cid, "assistant", reply)
            chat.open(cid)
            assert chat.view.toPlainText().count("Copy code") == 2
            chat.view.anchorClicked.emit(QUrl("copy:1"))
            assert QGuiApplication.clipboard().text() == "ls -l"
            assert chat.copy_code(0) == "print('hi')" and chat.copy_code(7) is None
            desk.chats.truncate_after(cid, after[-1].id)
            # edit the last question and resend: it is replaced, the old reply goes
            chat.edit_last()
            assert chat.input.toPlainText() == "and a long one"
            task = chat.send("a different question")
            await asyncio.gather(task, return_exceptions=True)
            edited = desk.chats.messages(cid)
            assert [m.role for m in edited] == ["user", "assistant", "user", "assistant"]
            assert edited[2].content == "a different question" and edited[2].id == after[2].id
            # a crashed engine is announced (tray/status bar) and the lane says so
            os.kill(pid, signal.SIGKILL)
            await until(lambda: any("stopped" in t for t, _ in desk.notices), what="crash notice")
            assert str(lane.state) == "failed"
            lib.load(mid)
            await desk.tasks.settle(limit=90)
            assert str(desk.runtime.supervisor.lanes[mid].state) == "ready"
            # a chat with a model that is not running says the lane's phase while it starts
            await desk.runtime.supervisor.unload(mid)
            phases: list[str] = []
            desk.bridge.received.connect(lambda kind, _d: phases.append(chat.phase.text()))
            task = chat.send("are you there?")
            await asyncio.gather(task, return_exceptions=True)
            assert any(p.startswith("Starting ") for p in phases), phases
            assert any("is ready; waiting for the first token" in p for p in phases), phases
            last = desk.chats.messages(cid)[-1]
            assert chat.phase.text() == "" and last.role == "assistant", (
                last.role,
                last.content,
                [(m.role, len(m.content), m.meta.get("tokens")) for m in desk.chats.messages(cid)],
            )
            pid = desk.runtime.supervisor.lanes[mid].proc.pid
            # --- Server page: a key, and the server takes it (and refuses a wrong one)
            srv = w.show_page("Server")
            srv.lan.click()  # refused: no key yet
            assert not srv.lan.isChecked() and "Create an API key first" in srv.status.text()
            assert not paths.settings_file.exists() or '"host"' not in paths.settings_file.read_text()
            key = srv.create_key("test-client")
            assert key and srv.keys.rowCount() == 1
            async with aiohttp.ClientSession() as s:
                ok = await s.get(f"{desk.server.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
                assert ok.status == 200
            # the live request log names the client by its key: the server recognised it
            await until(
                lambda: any(srv.log.item(r, 1).text() == "test-client" for r in range(srv.log.rowCount())),
                what="request log row for the key",
            )
            srv.lan.click()  # now allowed: a key exists, and it applies at once (HTTPS on every address)
            assert json.loads(paths.settings_file.read_text())["host"] == "0.0.0.0"
            await desk.tasks.settle()
            assert desk.server.host == "0.0.0.0" and desk.server.url.startswith("https://")
            srv.create_key("spare")
            srv.revoke("spare")
            assert [srv.keys.item(r, 0).text() for r in range(srv.keys.rowCount())] == ["test-client"]
            # a chat while the server is stopped: the conversation says what to do
            await desk.server.stop()
            await asyncio.gather(chat.send("anyone there?"), return_exceptions=True)
            last = desk.chats.messages(cid)[-1]
            assert last.role == "error" and "server is stopped" in last.content
            assert "server is stopped" in chat.view.toPlainText()
            await desk.server.start()
            # Settings: a value the server would refuse is refused, with the reason; a good one is saved
            sp = w.show_page("Settings")
            sp.proxy.setText("ftp://proxy")
            assert sp.save() is False and "hf_proxy" in sp.status.text()
            sp.proxy.setText("http://proxy.example:3128")
            assert sp.save() is True
            saved_settings = json.loads(paths.settings_file.read_text())
            assert (
                saved_settings["hf_proxy"] == "http://proxy.example:3128"
                and saved_settings["host"] == "0.0.0.0"
            )
            # export a conversation as Markdown
            chat.export(cid, tmp_path / "chat.md")
            assert (tmp_path / "chat.md").read_text().startswith("# hello there")
            # --- close to the tray: the window hides, the server still answers
            w.close()
            await asyncio.sleep(0.1)
            assert not w.isVisible()
            assert any("still running" in t for t, _ in desk.notices)
            async with aiohttp.ClientSession() as s:  # its own self-signed certificate: not checked here
                r = await s.get(f"{desk.server.url}/health", ssl=False)
                assert r.status == 200
            desk.bring_forward()
            assert w.isVisible()
            # the Hardware page draws the monitor's 1 Hz samples (it never samples itself)
            hw = w.pages["Hardware"]
            await until(lambda: len(hw.ram.values) >= 2, what="hardware samples")
            assert "RAM" in hw.summary.text() and "of" in hw.ram.caption
            await until(lambda: mid in hw.shares.text(), what="the loaded lane on the Hardware page")
            # the tray lists the loaded model with Unload
            menu = next(a.menu() for a in desk.tray.menu.actions() if a.menu() and mid in a.text())
            next(a for a in menu.actions() if a.text() == "Unload").trigger()
            await desk.tasks.settle()
            assert str(desk.runtime.supervisor.lanes[mid].state) == "stopped"
            assert any(a.text() == "No model loaded" for a in desk.tray.menu.actions())
            lib.load(mid)
            await desk.tasks.settle(limit=90)
            pid = desk.runtime.supervisor.lanes[mid].proc.pid
            # --- Quit
            desk.quit()
            await desk.run()
        assert wait_gone([pid], 15) == []
        kids = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
        assert not kids, kids

    qloop.run_until_complete(asyncio.wait_for(scenario(), 150))
    state = (paths.home / "ui.json").read_text()
    assert '"page": "Settings"' in state and "geometry" in state
