"""The desktop window end to end, offscreen, on the real Runtime and the local fake hub:
search → model page → fit verdict and Why → download → Library → load → chat (streamed, stopped,
regenerated) → API key → close to tray while the server answers → quit with no engine left."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
qasync = pytest.importorskip("qasync")

from app.core.paths import Paths  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from tests.conftest import wait_gone  # noqa: E402
from tests.fakehub import FakeHub  # noqa: E402
from tests.tinymodels import CHAT, write_tiny_gguf  # noqa: E402

REPO = "acme/tiny-chat-GGUF"


@pytest.fixture
def qloop(qapp: Any) -> Iterator[asyncio.AbstractEventLoop]:
    from app.ui.main import make_qapp

    make_qapp()
    loop = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        asyncio.set_event_loop(None)
        loop.close()


async def until(check: Any, *, timeout: float = 60, what: str = "condition") -> Any:
    """Let the loop (Qt and asyncio both) run until check() is truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def event(desk: Any, kind: str, *, timeout: float = 60) -> dict[str, Any]:
    """A future the bridge's signal resolves: the next event of `kind`."""
    fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    def on(k: str, data: Any) -> None:
        if k == kind and not fut.done():
            fut.set_result(data)

    desk.bridge.event.connect(on)
    try:
        return await asyncio.wait_for(fut, timeout)
    finally:
        desk.bridge.event.disconnect(on)


def test_discover_download_chat_keys_tray_quit(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, fake_hub: FakeHub, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    gguf = write_tiny_gguf(tmp_path / "src" / "tiny-chat-Q8_0.gguf", CHAT)
    fake_hub.add_repo(
        REPO,
        {"tiny-chat-Q8_0.gguf": gguf, "README.md": b"---\nlicense: mit\n---\n# Tiny chat\n\nA **test** model.\n"},
        tags=["gguf"],
        downloads=1234,
        likes=5,
    )
    paths = Paths(home=isolated_env)
    settings = Settings(port=0, models_dirs=(tmp_path / "models",), idle_ttl_s=0)

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
            assert disc.results.item(0, 2).text() == "1.2k"
            disc.results.selectRow(0)
            await desk.tasks.settle()
            assert disc.quants.item(0, 0).text() == "Q8_0"
            verdict = disc.quants.item(0, 2).text()
            assert verdict in ("CPU only", "fits on the GPU", "partial GPU offload") or verdict.startswith("CPU only")
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
            await until(lambda: any(disc.job_state(j) == "completed" for j in disc._jobs), what="completed row")
            # --- Library: it is there; load it
            lib = w.show_page("Library")
            await desk.tasks.settle()
            ids = [r["id"] for r in lib.rows]
            mid = next(i for i in ids if "tiny-chat" in i)
            assert lib.select(mid)
            lib.load()
            await desk.tasks.settle(timeout=90)
            lane = desk.runtime.supervisor.lanes[mid]
            assert str(lane.state) == "ready"
            await until(lambda: any(lib.table.item(r, 5).text() == "ready" for r in range(lib.table.rowCount())),
                        what="loaded column")  # fmt: skip
            pid = lane.proc.pid
            # --- Chat: streamed reply, stop mid-stream, regenerate
            chat = w.show_page("Chat")
            cid = chat.new_conversation(model=mid)
            chat.max_tokens.setValue(12)
            task = chat.send("hello there")
            await asyncio.gather(task, return_exceptions=True)
            msgs = desk.chats.messages(cid)
            assert [m.role for m in msgs] == ["user", "assistant"], [(m.role, m.content) for m in msgs]
            assert msgs[1].content and msgs[1].meta["ttft_s"] is not None and msgs[1].meta["tokens"] > 0
            assert "first token" in chat.view.toPlainText()
            assert desk.chats.get(cid).title == "hello there"
            desk.chats.configure(cid, sampling={"max_tokens": 3000, "ignore_eos": True, "temperature": 0.7})
            task = chat.send("and a long one")
            await until(lambda: chat.live and len(chat.live["text"]) > 0, what="first streamed token")
            chat.stop()
            await asyncio.gather(task, return_exceptions=True)
            stopped = desk.chats.messages(cid)[-1]
            assert stopped.role == "assistant" and stopped.meta["stopped"] is True
            assert stopped.meta["tokens"] < 3000
            desk.chats.configure(cid, sampling={"max_tokens": 8})
            chat.open(cid)
            task = chat.regenerate()
            assert task is not None
            await asyncio.gather(task, return_exceptions=True)
            after = desk.chats.messages(cid)
            assert [m.role for m in after] == ["user", "assistant", "user", "assistant"]
            assert after[-1].content and after[-1].meta["stopped"] is False
            # --- Server page: a key, and the server takes it (and refuses a wrong one)
            srv = w.show_page("Server")
            key = srv.create_key("test-client")
            assert key and srv.keys.rowCount() == 1
            async with aiohttp.ClientSession() as s:
                ok = await s.get(f"{desk.server.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
                assert ok.status == 200
            # the live request log names the client by its key: the server recognised it
            await until(lambda: any(srv.log.item(r, 1).text() == "test-client" for r in range(srv.log.rowCount())),
                        what="request log row for the key")  # fmt: skip
            srv.lan.click()  # now allowed: a key exists
            assert "host" in (paths.settings_file.read_text())
            # --- close to the tray: the window hides, the server still answers
            w.close()
            await asyncio.sleep(0.1)
            assert not w.isVisible()
            assert any("still running" in t for t, _ in desk.notices)
            async with aiohttp.ClientSession() as s:
                r = await s.get(f"{desk.server.url}/health")
                assert r.status == 200
            desk.bring_forward()
            assert w.isVisible()
            # --- Quit
            desk.quit()
            await desk.run()
        assert wait_gone([pid], 15) == []
        kids = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
        assert not kids, kids

    qloop.run_until_complete(asyncio.wait_for(scenario(), 150))
    state = (paths.home / "ui.json").read_text()
    assert '"page": "Server"' in state and "geometry" in state
