"""Chat: conversations in SQLite (app/chat/store.py), replies streamed through the local gateway — the
same /v1/chat/completions path editors use — rendered as Markdown, with Stop, Regenerate, TTFT and tok/s.
Images come by the Attach button, a drop or a paste, are kept in chat.db and sent as `image_url` parts.
A conversation with MCP servers (the Tools menu) goes through /v1/responses' `mcp` tool instead: its calls
show as cards, and a call that asks is answered inline (app/ui/chat_tools.py, app/chat/tool_turns.py).
A reply can be continued (its text is sent back as the start of the answer)."""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QMimeData, QSize, Qt, QUrl
from PySide6.QtGui import (
    QDesktopServices,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QIcon,
    QImage,
    QPixmap,
)
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.attachments import MAX_IMAGES_PER_MESSAGE, Picture, prepare
from app.chat.client import ChatError, stream_chat
from app.chat.deltas import Reasoning, Text, Usage, timing_figures
from app.chat.tool_turns import (
    SERVERS_KEY,
    TOOLS_META,
    ToolItem,
    Turn,
    chat_sampling,
    responses_body,
    servers_of,
    stream_reply,
)
from app.core.errors import SwitchyardError
from app.library.pairing import projector_for
from app.server.surfaces.thinking import template_has_switch
from app.ui.chat_images import QtImageCodec, carries_images, images_in, thumbnail
from app.ui.chat_models import chat_model_ids, why_not_chat
from app.ui.chat_thinking import SCHEME as THINK_SCHEME
from app.ui.chat_thinking import ThinkingToggle, folded
from app.ui.chat_tools import ANSWERS, FOLD, ToolsButton, cards
from app.ui.pages import Page
from app.ui.voice import VoiceBar
from app.ui.window_access import window_access
from app.ui.wording import for_window

if TYPE_CHECKING:
    from app.ui.context import Desk


class ChatPage(Page):
    title = "Chat"
    hint = ""

    def __init__(self, desk: Desk) -> None:
        super().__init__(desk)
        self.store = desk.chats
        self.current: int | None = None
        self.stream_task: asyncio.Task[Any] | None = None
        self.live: dict[str, Any] | None = None  # the reply being streamed
        split = QSplitter(Qt.Orientation.Horizontal)
        left = QWidget()
        left.setMaximumWidth(340)
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations")
        self.search.textChanged.connect(lambda _: self.reload_list())
        self.list = QListWidget()
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.currentItemChanged.connect(self._picked)
        row = QGridLayout()  # two by two: the list stays narrow on a 1024-px screen
        for i, (name, slot) in enumerate(
            (
                ("New", self.new_conversation),
                ("Rename", self.rename_dialog),
                ("Delete", self.delete_current),
                ("Export", self.export_dialog),
            )
        ):
            b = QPushButton(name)
            b.clicked.connect(lambda _=False, s=slot: s())
            row.addWidget(b, i // 2, i % 2)
        ll.addWidget(self.search)
        ll.addWidget(self.list, 1)
        ll.addLayout(row)
        split.addWidget(left)

        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(8, 0, 0, 0)
        opts = QHBoxLayout()
        self.model = QComboBox()
        self.model.setMinimumWidth(200)
        self.model.currentIndexChanged.connect(lambda _: self._save_options())
        self.model.currentIndexChanged.connect(lambda _: self._vision_changed())
        self.system = QLineEdit()
        self.system.setPlaceholderText("System prompt (optional)")
        self.system.editingFinished.connect(self._save_options)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0, 2)
        self.temperature.setSingleStep(0.1)
        self.temperature.setValue(0.7)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 32768)
        self.max_tokens.setValue(512)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.01, 1)
        self.top_p.setSingleStep(0.05)
        self.top_p.setValue(1.0)
        self.seed = QSpinBox()
        self.seed.setRange(-1, 2**31 - 1)
        self.seed.setSpecialValueText("random")
        self.seed.setValue(-1)
        self.seed.setMinimumWidth(100)
        # a changed value belongs to the open conversation at once: Regenerate and a reopened chat use it
        for box in (self.temperature, self.max_tokens, self.top_p, self.seed):
            box.valueChanged.connect(lambda _v: self._save_options())
        opts.addWidget(QLabel("Model"))
        opts.addWidget(self.model, 1)
        self.thinking = ThinkingToggle()  # per conversation: its sampling's reasoning_effort
        self.thinking.toggled.connect(lambda _on: self._save_thinking())
        self.unfolded: set[int] = set()  # replies whose reasoning is shown open
        opts.addWidget(self.thinking)
        self.tools_btn = ToolsButton(registered=self._registered_servers, changed=self._save_servers)
        self.tool_unfolded: set[str] = set()  # tool cards shown open, by item id
        opts.addWidget(self.tools_btn)
        rl.addLayout(opts)
        rl.addWidget(self.system)
        sampling = QGridLayout()  # two rows of two, so the page fits a 1024-px screen beside the list
        for i, (label, w) in enumerate(
            (
                ("Temperature", self.temperature),
                ("Top-p", self.top_p),
                ("Max tokens", self.max_tokens),
                ("Seed", self.seed),
            )
        ):
            sampling.addWidget(QLabel(label), i // 2, 2 * (i % 2))
            sampling.addWidget(w, i // 2, 2 * (i % 2) + 1)
        sampling.setColumnStretch(4, 1)
        rl.addLayout(sampling)
        self.view = HistoryView(self)
        # links are ours to follow: `copy:N` copies code block N of the shown conversation
        self.view.setOpenLinks(False)
        self.view.anchorClicked.connect(self._link)
        self.code_blocks: list[str] = []
        rl.addWidget(self.view, 1)
        self.phase = QLabel("")
        # wrapped: a long model name or failure reason on one line made the window wider than the screen
        self.phase.setWordWrap(True)
        rl.addWidget(self.phase)
        rl.addWidget(self.status)
        send_row = QHBoxLayout()
        self.input = Composer(self)
        self.input.setPlaceholderText("Message (Ctrl+Enter sends; paste or drop images)")
        self.input.setMaximumHeight(90)
        self.send_btn = QPushButton("Send")
        self.send_btn.setShortcut("Ctrl+Return")
        self.send_btn.clicked.connect(lambda: self.send())
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.clicked.connect(self.stop)
        self.stop_btn.setEnabled(False)
        self.regen_btn = QPushButton("Regenerate")
        self.regen_btn.clicked.connect(lambda: self.regenerate())
        self.edit_btn = QPushButton("Edit last")
        self.edit_btn.setToolTip("Put your last message back in the box; Send replaces it and what followed")
        self.edit_btn.clicked.connect(self.edit_last)
        self.copy_btn = QPushButton("Copy reply")
        self.copy_btn.clicked.connect(self.copy_last_reply)
        self.editing: int | None = None  # the user message Send will replace
        self.attach_btn = QPushButton("Attach image…")
        self.attach_btn.clicked.connect(self.attach_dialog)
        self.pending: list[Picture] = []  # images the next Send carries
        self.pending_row = QHBoxLayout()
        self.pending_row.setContentsMargins(0, 0, 0, 0)
        self.pending_row.addStretch(1)
        rl.addLayout(self.pending_row)
        self.setAcceptDrops(True)
        send_row.addWidget(self.input, 1)
        buttons = QGridLayout()
        for i, b in enumerate(
            (self.send_btn, self.edit_btn, self.stop_btn, self.copy_btn, self.regen_btn, self.attach_btn)
        ):
            buttons.addWidget(b, i // 2, i % 2)
        send_row.addLayout(buttons)
        rl.addLayout(send_row)
        self.voice = VoiceBar(self, parent=self)  # hold-to-talk and read aloud (app/ui/voice.py)
        rl.addWidget(self.voice)
        split.addWidget(right)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 4)
        split.setSizes([260, 900])
        self.root.addWidget(split, 1)
        desk.bridge.received.connect(self._on_event)
        self.reload_models()  # and the Attach button's state for the model shown
        self.reload_list()
        self._buttons()

    def theme_changed(self) -> None:
        # the document's links took the palette's link colour when it was made: draw it again
        if self.current is not None:
            self.show_messages()

    def focus_search(self) -> None:
        self.search.setFocus()

    # ---- models and conversations -----------------------------------------------------------------
    def reload_models(self) -> None:
        keep = self.model.currentData()
        self.model.blockSignals(True)
        self.model.clear()
        for mid in chat_model_ids(self.desk.runtime.catalog):  # speech and embedding models cannot chat
            self.model.addItem(mid, mid)
        if self.model.count() == 0:
            self.model.addItem("no model: download one on Discover", None)
        idx = self.model.findData(keep)
        self.model.setCurrentIndex(max(idx, 0))
        self.model.blockSignals(False)
        self._vision_changed()

    def reload_list(self) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        for c in self.store.conversations(search=self.search.text().strip() or None):
            item = QListWidgetItem(c.title)  # elided at the list's width (its tooltip has it whole)
            item.setData(Qt.ItemDataRole.UserRole, c.id)
            item.setToolTip(f"{c.title}\n{c.model}" if c.model else c.title)
            self.list.addItem(item)
            if c.id == self.current:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        if self.list.count() == 0:
            self.view.setMarkdown(
                "*No conversations yet.* Pick a model above, type a message and press Send."
            )

    def new_conversation(self, *, model: str | None = None) -> int:
        """A new chat; an empty one already there (nothing sent in it yet) is reused, so pressing Ctrl+N
        again does not pile up empty "New chat" rows."""
        self.reload_models()
        if model is not None:  # the new chat's model, not a change to the one open now
            self.model.blockSignals(True)
            self.model.setCurrentIndex(max(self.model.findData(model), 0))
            self.model.blockSignals(False)
            self._vision_changed()
        empty = next((c.id for c in self.store.conversations() if not self.store.messages(c.id)), None)
        if empty is not None:
            cid = empty
            self.store.configure(cid, model=self.model.currentData(), system_prompt=self.system.text())
        else:
            cid = self.store.create(
                "New chat", model=self.model.currentData(), system_prompt=self.system.text()
            )
        self.current = cid
        self.thinking.show_sampling(self.store.get(cid).sampling)  # its own setting, not the last one shown
        self.tools_btn.show_servers(servers_of(self.store.get(cid).sampling))
        self.reload_list()
        self.show_messages()
        self.input.setFocus()
        return cid

    def _picked(self, item: QListWidgetItem | None, _prev: Any = None) -> None:
        if item is None:
            return
        self.open(int(item.data(Qt.ItemDataRole.UserRole)))

    def open(self, cid: int) -> None:
        self.current = cid
        conv = self.store.get(cid)
        controls = (self.model, self.temperature, self.max_tokens, self.top_p, self.seed)
        for w in controls:  # showing a conversation's values is not a change to save
            w.blockSignals(True)
        idx = self.model.findData(conv.model)
        if idx < 0 and conv.model:  # an old conversation's model that is gone (or cannot chat): said so
            cannot = why_not_chat(self.desk.runtime.catalog, conv.model)
            self.model.addItem(f"{conv.model} (cannot chat)" if cannot else conv.model, conv.model)
            idx = self.model.count() - 1
        self.model.setCurrentIndex(max(idx, 0))
        self.system.setText(conv.system_prompt)
        self.temperature.setValue(float(conv.sampling.get("temperature", 0.7)))
        self.max_tokens.setValue(int(conv.sampling.get("max_tokens", 512)))
        self.top_p.setValue(float(conv.sampling.get("top_p", 1.0)))
        self.seed.setValue(int(conv.sampling.get("seed", -1)))
        self.thinking.show_sampling(conv.sampling)
        self.tools_btn.show_servers(servers_of(conv.sampling))
        for w in controls:
            w.blockSignals(False)
        self._vision_changed()
        self.show_messages()

    def _save_options(self) -> None:
        if self.current is not None:
            self.store.configure(
                self.current,
                model=self.model.currentData(),
                system_prompt=self.system.text(),
                sampling=self._sampling(),
            )

    def _save_thinking(self) -> None:
        if self.current is not None:
            self.store.configure(
                self.current,
                model=self.model.currentData(),
                system_prompt=self.system.text(),
                sampling=self.thinking.into(self._sampling()),
            )

    def _registered_servers(self) -> list[str]:
        from app.mcp.registry import McpRegistry

        try:
            return McpRegistry.of(self.desk.paths).names()
        except SwitchyardError as exc:  # mcp.json damaged: said, and no server offered
            self.report(exc.message)
            return []

    def _save_servers(self, names: list[str]) -> None:
        if self.current is None:
            self.new_conversation()
        assert self.current is not None
        conv = self.store.get(self.current)
        self.store.configure(
            self.current,
            model=conv.model,
            system_prompt=conv.system_prompt,
            sampling={**conv.sampling, SERVERS_KEY: names},
        )
        self.tools_btn.show_servers(names)

    def _sampling(self) -> dict[str, Any]:
        # keys the page has no control for (stop, ignore_eos, … set in chat.db) are kept
        kept = self.store.get(self.current).sampling if self.current is not None else {}
        out = {
            **kept,
            "temperature": round(self.temperature.value(), 2),
            "top_p": round(self.top_p.value(), 2),
            "max_tokens": self.max_tokens.value(),
            "seed": self.seed.value(),
        }
        if out["seed"] < 0:  # random: leave it to the engine
            del out["seed"]
        return out

    def rename(self, cid: int, title: str) -> None:
        try:
            self.store.rename(cid, title)
        except Exception as exc:
            self.report(getattr(exc, "message", str(exc)))
        self.reload_list()

    def rename_dialog(self) -> None:
        if self.current is None:
            return
        title, ok = QInputDialog.getText(self, "Rename", "Title", text=self.store.get(self.current).title)
        if ok:
            self.rename(self.current, title)

    def delete_current(self) -> None:
        if self.current is not None:
            self.store.delete(self.current)
            self.current = None
            self.view.clear()
            self.reload_list()
            self._buttons()

    def export_dialog(self) -> None:
        if self.current is None:
            return
        path, _ = QFileDialog.getSaveFileName(
            self, "Export conversation", str(Path.home() / "chat.md"), "Markdown (*.md);;JSON (*.json)"
        )
        if path:
            self.export(self.current, Path(path))

    def export(self, cid: int, path: Path) -> None:
        text = self.store.export_json(cid) if path.suffix == ".json" else self.store.export_markdown(cid)
        path.write_text(text, encoding="utf-8")

    # ---- images -----------------------------------------------------------------------------------
    def model_has_vision(self) -> bool:
        """Whether the chosen model loads with a vision projector (the pairing, or its mmproj override)."""
        mid = self.model.currentData()
        entry = self.desk.runtime.catalog.find(mid) if mid else None
        if entry is None:
            return False
        override = self.desk.runtime.settings.override(entry.id, "mmproj", None)
        return projector_for(entry.path, entry.mmproj, override=override) is not None

    def _vision_changed(self) -> None:
        mid = self.model.currentData()
        entry = self.desk.runtime.catalog.find(mid) if mid else None
        template = entry.facts.chat_template if entry is not None and entry.facts is not None else None
        self.thinking.show_model(mid, has_switch=template_has_switch(template) if entry is not None else None)
        ok = self.model_has_vision()
        self.attach_btn.setEnabled(ok)
        if ok:
            self.attach_btn.setToolTip("Attach an image (or paste or drop one into the message box)")
        elif not mid:
            self.attach_btn.setToolTip("Pick a model first: images need a model with vision")
        else:
            self.attach_btn.setToolTip(
                f"{mid} has no vision: it has no projector (mmproj) beside it. Pick a vision model, or "
                "download one with its mmproj file"
            )

    def attach_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Attach images", str(Path.home()), "Images (*.png *.jpg *.jpeg *.gif *.webp *.bmp)"
        )
        for path in paths:
            self.attach_file(Path(path))

    def attach_file(self, path: Path) -> bool:
        try:
            data = path.read_bytes()
        except OSError as exc:
            self.report(f"{path.name} could not be read ({exc.strerror}); check the file and attach it again")
            return False
        return self.attach_bytes(data, name=path.name)

    def attach_bytes(self, data: bytes, *, name: str = "the image") -> bool:
        """Adds an image to the composer (scaled and checked now, so a bad file is named at once)."""
        if not self.model_has_vision():
            self.report(self.attach_btn.toolTip())
            return False
        if len(self.pending) >= MAX_IMAGES_PER_MESSAGE:
            self.report(f"A message takes at most {MAX_IMAGES_PER_MESSAGE} images; send these first")
            return False
        try:
            pic = prepare(data, codec=QtImageCodec(), name=name)
        except SwitchyardError as exc:
            self.report(exc.message)
            return False
        self.clear_report()
        self.pending.append(pic)
        self._refresh_pending()
        return True

    def attach_mime(self, mime: QMimeData) -> int:
        """Attaches the images a paste or drop carries; how many were taken."""
        return sum(self.attach_bytes(data, name=name) for name, data in images_in(mime))

    def paste_image(self) -> int:
        return self.attach_mime(QGuiApplication.clipboard().mimeData())

    def remove_pending(self, index: int) -> None:
        if 0 <= index < len(self.pending):
            del self.pending[index]
            self._refresh_pending()

    def _clear_pending(self) -> None:
        self.pending.clear()
        self._refresh_pending()

    def _refresh_pending(self) -> None:
        while self.pending_row.count() > 1:  # the stretch stays last
            item = self.pending_row.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        for i, pic in enumerate(self.pending):
            b = QToolButton()
            b.setIcon(QIcon(QPixmap.fromImage(thumbnail(pic.data, 64))))
            b.setIconSize(QSize(64, 64))
            b.setText("Remove")
            b.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextUnderIcon)
            b.setToolTip(f"{pic.width}x{pic.height} {pic.mime}; click to remove it from the message")
            b.clicked.connect(lambda _=False, n=i: self.remove_pending(n))
            self.pending_row.insertWidget(i, b)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if carries_images(event.mimeData()) and self.attach_btn.isEnabled():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        if self.attach_mime(event.mimeData()):
            event.acceptProposedAction()

    # ---- rendering --------------------------------------------------------------------------------
    def show_messages(self) -> None:
        if self.current is None:
            return
        parts: list[str] = []
        self.code_blocks = []
        live_id = self.live["id"] if self.live is not None else None
        messages = self.store.messages(self.current)
        last_reply = next((m.id for m in reversed(messages) if m.role == "assistant"), None)
        for m in messages:
            content = m.content
            meta = m.meta
            live = self.live is not None and m.id == self.live["id"]
            if self.live is not None and live:
                content, meta = self.live["text"], self.live
            if m.role == "user":
                pics = " ".join(f"![image {a.width}x{a.height}](chatimg:{a.id})" for a in m.images)
                parts.append(f"**You**\n\n{content}\n" + (f"\n{pics}\n" if pics else ""))
            elif m.role == "assistant":
                tools = meta.get(TOOLS_META) or []
                body = with_copy_links(content or ("" if tools else "…"), self.code_blocks)
                thought = folded(m.id, meta.get("reasoning") or "", unfolded=m.id in self.unfolded, live=live)
                calls = cards(tools, unfolded=self.tool_unfolded, latest=m.id == last_reply and not live)
                # the reasoning, folded, above the tool cards and the answer (chat_thinking.py, chat_tools.py)
                body = thought + calls + body
                # each finished reply can be read aloud on its own (app/ui/voice.py)
                read = f"[Read aloud](speak:{m.id})" if content and m.id != live_id else ""
                more = (
                    f"[Continue](continue:{m.id})"
                    if content and m.id == last_reply and live_id is None
                    else ""
                )
                foot = " · ".join(x for x in (_stats(meta), read, more) if x)
                parts.append(f"**Assistant**\n\n{body}\n\n{foot}\n")
            elif m.role == "error":
                parts.append(f"> **Error:** {html.escape(content)}\n")
        self.view.setMarkdown("\n---\n".join(parts) or "*Type a message below and press Send.*")
        self._buttons()
        bar = self.view.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _buttons(self) -> None:
        """Regenerate, Edit last and Copy reply are on only where there is something for them to act on."""
        msgs = self.store.messages(self.current) if self.current is not None else []
        idle = self.stream_task is None
        asked = any(m.role == "user" for m in msgs)
        self.regen_btn.setEnabled(idle and asked)
        self.edit_btn.setEnabled(idle and asked)
        self.copy_btn.setEnabled(any(m.role == "assistant" and m.content for m in msgs))

    # ---- sending ----------------------------------------------------------------------------------
    def send(self, text: str | None = None) -> asyncio.Task[Any] | None:
        text = (text if text is not None else self.input.toPlainText()).strip()
        if not (text or self.pending) or self.stream_task is not None:
            return None
        if self.pending and not self.model_has_vision():
            self.report(self.attach_btn.toolTip())
            return None
        if self.current is None:
            self.new_conversation()
        assert self.current is not None
        self._save_options()
        msgs = self.store.messages(self.current)
        if not any(m.role == "user" for m in msgs):  # name the conversation after its first question
            self.store.rename(self.current, text[:60] or "An image")
            self.reload_list()
        try:
            if self.editing is not None:  # edit and resend: the old question and everything after it go
                # the edited message keeps its own images; attached ones wait for the next message
                self.store.update(self.editing, content=text)
                self.store.truncate_after(self.current, self.editing)
                self.editing = None
            else:
                self.store.add(self.current, "user", text, images=self.pending)
                self._clear_pending()
        except SwitchyardError as exc:  # over the image bounds: nothing was sent, the composer keeps it
            self.report(exc.message)
            return None
        self.input.clear()
        return self._start_stream(self.current)

    def regenerate(self) -> asyncio.Task[Any] | None:
        if self.current is None or self.stream_task is not None:
            return None
        users = [m for m in self.store.messages(self.current) if m.role == "user"]
        if not users:
            self.report("Nothing to regenerate yet: send a message first.")
            return None
        self._save_options()
        self.store.truncate_after(self.current, users[-1].id)
        return self._start_stream(self.current)

    def edit_last(self) -> None:
        if self.current is None or self.stream_task is not None:
            return
        users = [m for m in self.store.messages(self.current) if m.role == "user"]
        if users:
            self.editing = users[-1].id
            self.input.setPlainText(users[-1].content)
            self.input.setFocus()

    def _link(self, url: QUrl) -> None:
        if url.scheme() == "copy":
            self.copy_code(int(url.path()) if url.path().isdigit() else -1)
        elif url.scheme() == "speak" and url.path().isdigit():
            self.voice.read_aloud(int(url.path()))
        elif url.scheme() == THINK_SCHEME and url.path().isdigit():
            self.unfolded ^= {int(url.path())}  # open or close that reply's reasoning
            self.show_messages()
        elif url.scheme() == FOLD:
            self.tool_unfolded ^= {url.path()}  # open or close that tool call's card
            self.show_messages()
        elif url.scheme() in ANSWERS:
            self.answer_tool(url.path(), url.scheme())
        elif url.scheme() == "continue":
            self.continue_reply()
        elif url.scheme() in ("http", "https"):
            QDesktopServices.openUrl(url)  # a link in a model card or a reply: the user's browser

    def copy_code(self, index: int) -> str | None:
        """Copies code block `index` of the shown conversation (the `Copy code` link under it)."""
        if not 0 <= index < len(self.code_blocks):
            return None
        QGuiApplication.clipboard().setText(self.code_blocks[index])
        self.status.setText("Code copied")
        return self.code_blocks[index]

    def copy_last_reply(self) -> str | None:
        if self.current is None:
            return None
        replies = [m for m in self.store.messages(self.current) if m.role == "assistant" and m.content]
        if not replies:
            return None
        QGuiApplication.clipboard().setText(replies[-1].content)
        return replies[-1].content

    def continue_reply(self) -> asyncio.Task[Any] | None:
        """Go on with the last reply: its text goes back as the start of the answer, and what the model
        writes next is added to it."""
        if self.current is None or self.stream_task is not None:
            return None
        msgs = self.store.messages(self.current)
        if not msgs or msgs[-1].role != "assistant" or not msgs[-1].content:
            return None
        self._save_options()
        return self._start_stream(self.current, resume=msgs[-1].id)

    def answer_tool(self, item_id: str, scheme: str) -> asyncio.Task[Any] | None:
        """Answer a tool call that asked (Allow once, Always allow, Deny, Always deny), and let the model go
        on: the server runs (or declines) the call in the next reply. "Always" writes the tool's permission
        into the MCP registry first, for every later request."""
        if self.current is None or self.stream_task is not None:
            return None
        msgs = self.store.messages(self.current)
        last = next((m for m in reversed(msgs) if m.role == "assistant"), None)
        items = (last.meta.get(TOOLS_META) or []) if last is not None else []
        item = next((i for i in items if i.get("id") == item_id), None)
        if last is None or item is None or item.get("type") != "mcp_approval_request" or item.get("answer"):
            self.report("That tool call is no longer waiting for an answer.")
            return None
        answer, permission, _, words = ANSWERS[scheme]
        if permission is not None:
            from app.mcp.registry import McpRegistry

            try:
                McpRegistry.of(self.desk.paths).set_permission(
                    str(item["server_label"]), tool=str(item["name"]), permission=permission
                )
            except SwitchyardError as exc:
                self.report(exc.message)
                return None
        item["answer"], item["said"] = answer, words
        self.store.update(last.id, content=last.content, meta={**last.meta, TOOLS_META: items})
        return self._start_stream(self.current)

    def stop(self) -> None:
        if self.stream_task is not None:
            self.stream_task.cancel()

    def _start_stream(self, cid: int, *, resume: int | None = None) -> asyncio.Task[Any]:
        self.clear_report()
        task = self.desk.spawn(
            self._stream(cid, resume=resume), disable=[self.send_btn, self.regen_btn], report=self.report
        )
        self.stream_task = task
        self.stop_btn.setEnabled(True)

        def done(_: Any) -> None:
            self.stream_task = None
            self.stop_btn.setEnabled(False)
            self.phase.setText("")
            self._buttons()

        task.add_done_callback(done)
        return task

    def _turns(self, cid: int) -> list[Turn]:
        """The conversation as tool_turns reads it (errors and empty replies left out)."""
        return [
            Turn(
                role=m.role,
                content=m.content,
                tools=list(m.meta.get(TOOLS_META) or []),
                images=[self.store.image(a.id).data_url() for a in m.images],
            )
            for m in self.store.messages(cid)
            if m.role == "user" or (m.role == "assistant" and (m.content or m.meta.get(TOOLS_META)))
        ]

    def _tool_item(self, item: dict[str, Any]) -> None:
        assert self.live is not None
        items: list[dict[str, Any]] = self.live[TOOLS_META]
        at = next((i for i, old in enumerate(items) if old.get("id") == item.get("id")), None)
        if at is None:
            items.append(item)
        else:
            items[at] = item

    async def _stream(self, cid: int, *, resume: int | None = None) -> None:
        conv = self.store.get(cid)
        srv = self.desk.server
        if not conv.model:
            self.store.add(cid, "error", "No model chosen: pick one above (or download one on Discover).")
            self.show_messages()
            return
        cannot = why_not_chat(self.desk.runtime.catalog, conv.model)
        if cannot is not None:
            self.store.add(cid, "error", cannot)
            self.show_messages()
            return
        if not srv.running or not srv.url:
            self.store.add(
                cid,
                "error",
                "The local server is stopped: start it on the Server page or from "
                "the tray, then press Regenerate.",
            )
            self.show_messages()
            return
        body = {
            "model": conv.model,
            "messages": self.store.history(cid),
            "stream": True,
            "stream_options": {"include_usage": True},
            **chat_sampling(conv.sampling),
        }
        servers = servers_of(conv.sampling)
        # with MCP servers the reply is asked on /v1/responses, whose mcp tool runs the calls (tool_turns.py)
        tool_body = (
            responses_body(
                model=conv.model,
                system_prompt=conv.system_prompt,
                sampling=conv.sampling,
                turns=self._turns(cid),
            )
            if servers
            else None
        )
        old = next((m for m in self.store.messages(cid) if m.id == resume), None)
        aid = old.id if old is not None else self.store.add(cid, "assistant", "")
        self.live = {
            "id": aid,
            "text": old.content if old is not None else "",  # a continued reply grows
            "reasoning": old.meta.get("reasoning", "") if old is not None else "",
            "model": conv.model,
            TOOLS_META: list(old.meta.get(TOOLS_META) or []) if old is not None else [],
        }
        lane = self.desk.runtime.lane_of(conv.model)
        if lane is None or str(lane.state) != "ready":
            self.phase.setText(f"Loading {conv.model}… the first reply waits for the model to start")
        self.show_messages()
        t0 = time.monotonic()
        ttft: float | None = None
        chunks, usage_tokens = 0, None
        last_paint = 0.0
        context_used: int | None = None
        figures: dict[str, float | int] = {}
        error: str | None = None
        stopped = False
        try:
            access = await window_access(self.desk)  # the server's key and certificate, where it has them
            async with access.session() as http:
                source = (
                    stream_reply(access.url, tool_body, session=http)
                    if tool_body is not None
                    else stream_chat(access.url, body, session=http)
                )
                async with contextlib.aclosing(source) as deltas:
                    async for delta in deltas:
                        if isinstance(delta, Usage):
                            usage_tokens = delta.completion_tokens
                            figures = timing_figures(delta.timings) or figures
                            if delta.prompt_tokens is not None and delta.completion_tokens is not None:
                                context_used = delta.prompt_tokens + delta.completion_tokens
                        elif isinstance(delta, Reasoning):
                            if ttft is None:
                                ttft = time.monotonic() - t0
                                self.phase.setText("")
                            self.live["reasoning"] += delta.text
                            now = time.monotonic()
                            if now - last_paint > 0.05:
                                self.show_messages()
                                last_paint = now
                        elif isinstance(delta, Text):
                            if ttft is None:
                                ttft = time.monotonic() - t0
                                self.phase.setText("")
                            chunks += 1
                            self.live["text"] += delta.text
                            now = time.monotonic()
                            if now - last_paint > 0.05:  # redraw at most 20 times a second
                                self.show_messages()
                                last_paint = now
                        elif isinstance(delta, ToolItem):  # a call ran, or asks: its card now
                            self._tool_item(delta.item)
                            self.show_messages()
                        # let Qt run between pieces (Stop, typing, resizing stay live)
                        await asyncio.sleep(0)
        except ChatError as exc:
            error = str(exc)
        except SwitchyardError as exc:  # the window's key could not be made (keys.json damaged, ...)
            error = exc.message
        except asyncio.CancelledError:
            stopped = True
        finally:
            took = time.monotonic() - t0
            tokens = usage_tokens or chunks
            gen_time = took - (ttft or 0)
            meta = {
                "ttft_s": round(ttft, 3) if ttft is not None else None,
                "tokens": tokens,
                "tok_per_s": round(tokens / gen_time, 1) if tokens and gen_time > 0 else None,
                "stopped": stopped,
                "model": conv.model,
                "context_used": context_used,
                "context_size": _context_size(self.desk, conv.model),
                **figures,
            }
            if self.live and self.live.get("reasoning"):
                meta["reasoning"] = self.live["reasoning"]  # shown folded; never sent back to the model
            if self.live and self.live.get(TOOLS_META):
                meta[TOOLS_META] = self.live[TOOLS_META]  # the cards, and the input of later turns
            text = self.live["text"] if self.live else ""
            self.store.update(aid, content=text, meta=meta)
            self.live = None
            if error:  # the engine's or gateway's words, with the window's buttons for its commands
                self.store.add(cid, "error", for_window(error))
            self.show_messages()
        if stopped:
            raise asyncio.CancelledError

    def _on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "library.refreshed":
            self.reload_models()
        if kind == "lane.state" and self.live is not None and data.get("model") == self.live.get("model"):
            state = data.get("state")
            if state == "starting":
                self.phase.setText(f"Starting {data['model']}…")
            elif state == "failed":
                self.phase.setText(
                    f"{data['model']} failed to start: {data.get('reason') or 'see the Lanes page'}"
                )
            elif state == "ready":
                self.phase.setText(f"{data['model']} is ready; waiting for the first token…")


class Composer(QPlainTextEdit):
    """The message box: a pasted or dropped image (or image file) becomes an attachment, not text."""

    def __init__(self, page: ChatPage) -> None:
        super().__init__()
        self.page = page

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return carries_images(source) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        if carries_images(source):
            self.page.attach_mime(source)
            if not source.hasText() or source.hasUrls():
                return  # a file URL's text is its path: not part of the message
        super().insertFromMimeData(source)


class HistoryView(QTextBrowser):
    """The conversation; `chatimg:ID` images are thumbnails of chat.db's attachments, made once each."""

    def __init__(self, page: ChatPage) -> None:
        super().__init__()
        self.page = page
        self.thumbs: dict[int, QImage] = {}

    def loadResource(self, kind: int, name: QUrl | str) -> Any:
        name = QUrl(name)
        if name.scheme() == "chatimg" and name.path().isdigit():
            aid = int(name.path())
            if aid not in self.thumbs:
                try:
                    self.thumbs[aid] = thumbnail(self.page.store.image(aid).data, 160)
                except SwitchyardError:
                    self.thumbs[aid] = QImage()  # deleted meanwhile: an empty picture, not an error
            return self.thumbs[aid]
        return super().loadResource(kind, name)


_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def with_copy_links(markdown: str, blocks: list[str]) -> str:
    """The reply with a `Copy code` link after each fenced code block; the code is appended to `blocks`
    and the link's target `copy:N` is its index there. An unclosed fence (mid-stream) gets no link yet."""

    def link(m: re.Match[str]) -> str:
        blocks.append(m.group(1).rstrip("\n"))
        return f"{m.group(0)}\n\n[Copy code](copy:{len(blocks) - 1})\n"

    return _FENCE.sub(link, markdown)


def _stats(meta: dict[str, Any]) -> str:
    """The line under a reply: first token, prompt and generation speed (the engine's own figures where it
    sent `timings`, else measured here), speculative decoding's acceptance, the context used."""
    bits = []
    if meta.get("ttft_s") is not None:
        bits.append(f"first token {meta['ttft_s']:.2f} s")
    if meta.get("prompt_per_s"):
        bits.append(f"prompt {meta['prompt_per_s']:.1f} tok/s")
    if meta.get("gen_per_s"):
        bits.append(f"generation {meta['gen_per_s']:.1f} tok/s")
    elif meta.get("tok_per_s"):
        bits.append(f"{meta['tok_per_s']:.1f} tok/s")
    if meta.get("draft_n"):
        n, a = int(meta["draft_n"]), int(meta.get("draft_accepted") or 0)
        bits.append(f"draft: accepted {a} of {n} ({100 * a / n:.0f} %)")
    if meta.get("context_used") and meta.get("context_size"):
        bits.append(f"context {meta['context_used']} of {meta['context_size']} tokens per request")
    if meta.get("stopped"):
        bits.append("stopped")
    return f"*{' · '.join(bits)}*" if bits else ""


def _context_size(desk: Desk, model: str) -> int | None:
    """One slot's context: what a single conversation can use on that lane."""
    lane = desk.runtime.lane_of(model)
    params = (lane.snapshot().get("params") or {}) if lane is not None else {}
    total, slots = params.get("ctx_size"), params.get("parallel") or 1
    return int(total) // int(slots) if total else None
