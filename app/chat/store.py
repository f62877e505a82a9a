"""Conversations and their messages in SQLite (SWITCHYARD_HOME/chat.db).

The desktop Chat page reads and writes through this; it survives restarts, and a conversation exports as
Markdown or JSON (its images as data: URLs). Each call is one short transaction, so a crash loses at most the
message being written. Images attached to a message live in `attachments` (bounds: app/chat/attachments.py);
`PRAGMA user_version` says which migrations a file has had, so a chat.db from an older version opens as is.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.chat.attachments import (
    MAX_DB_IMAGE_BYTES,
    MAX_IMAGES_PER_MESSAGE,
    MIB,
    Attachment,
    Picture,
)
from app.core.errors import BadRequestError, ImageTooLargeError

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    model TEXT,
    system_prompt TEXT NOT NULL DEFAULT '',
    sampling TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation, id);
"""
# one entry per schema version after the first; a file's `user_version` says how many it has had
MIGRATIONS = (
    """
    CREATE TABLE IF NOT EXISTS attachments (
        id INTEGER PRIMARY KEY,
        message INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        mime TEXT NOT NULL,
        width INTEGER NOT NULL,
        height INTEGER NOT NULL,
        data BLOB NOT NULL
    );
    CREATE INDEX IF NOT EXISTS attachments_by_message ON attachments(message, id);
    """,
)
ROLES = ("system", "user", "assistant", "error")


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    model: str | None
    system_prompt: str
    sampling: dict[str, Any]
    created: float
    updated: float


@dataclass(frozen=True)
class Message:
    id: int
    conversation: int
    role: str
    content: str
    meta: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0
    images: tuple[Attachment, ...] = ()


class ChatStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # the window's event loop thread and to_thread workers both use it; each call is one statement or
        # one transaction, so a shared connection is safe with SQLite's own serialisation
        self._db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.executescript(SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        for n, script in enumerate(MIGRATIONS[version:], start=version + 1):
            with self._db:
                self._db.execute("BEGIN")
                for statement in filter(str.strip, script.split(";")):
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {n}")

    def close(self) -> None:
        self._db.close()

    # ---- conversations -----------------------------------------------------------------------------
    def create(self, title: str = "New chat", *, model: str | None = None, system_prompt: str = "") -> int:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO conversations (title, model, system_prompt, created, updated) "
            "VALUES (?, ?, ?, ?, ?)",
            (_title(title), model, system_prompt, now, now),
        )
        return int(cur.lastrowid or 0)

    def get(self, conversation_id: int) -> Conversation:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise BadRequestError(f"no conversation {conversation_id}; it may have been deleted")
        return _conversation(row)

    def conversations(self, *, search: str | None = None) -> list[Conversation]:
        """Newest first; `search` matches the title or any message's text (case-insensitive)."""
        if search:
            like = f"%{_escape(search)}%"
            rows = self._db.execute(
                "SELECT * FROM conversations WHERE title LIKE ?1 ESCAPE '\\' OR id IN "
                "(SELECT conversation FROM messages WHERE content LIKE ?1 ESCAPE '\\') "
                "ORDER BY updated DESC, id DESC",
                (like,),
            ).fetchall()
        else:
            rows = self._db.execute("SELECT * FROM conversations ORDER BY updated DESC, id DESC").fetchall()
        return [_conversation(r) for r in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        self.get(conversation_id)
        self._db.execute("UPDATE conversations SET title = ? WHERE id = ?", (_title(title), conversation_id))

    def configure(
        self,
        conversation_id: int,
        *,
        model: str | None = None,
        system_prompt: str | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> None:
        conv = self.get(conversation_id)
        self._db.execute(
            "UPDATE conversations SET model = ?, system_prompt = ?, sampling = ? WHERE id = ?",
            (
                model if model is not None else conv.model,
                system_prompt if system_prompt is not None else conv.system_prompt,
                json.dumps(sampling if sampling is not None else conv.sampling),
                conversation_id,
            ),
        )

    def delete(self, conversation_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # ---- messages ----------------------------------------------------------------------------------
    def add(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        meta: dict[str, Any] | None = None,
        images: Sequence[Picture] = (),
    ) -> int:
        """A new message (with its images, made by attachments.prepare) in one transaction."""
        if role not in ROLES:
            raise BadRequestError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if len(images) > MAX_IMAGES_PER_MESSAGE:
            raise BadRequestError(
                f"a message takes at most {MAX_IMAGES_PER_MESSAGE} images, got {len(images)}; "
                "remove some from the message",
                param="image",
            )
        now = time.time()
        with self._db:
            self._db.execute("BEGIN")
            if images:
                self._check_room(sum(len(p.data) for p in images))
            cur = self._db.execute(
                "INSERT INTO messages (conversation, role, content, meta, created) VALUES (?, ?, ?, ?, ?)",
                (conversation_id, role, content, json.dumps(meta or {}), now),
            )
            mid = int(cur.lastrowid or 0)
            self._db.executemany(
                "INSERT INTO attachments (message, mime, width, height, data) VALUES (?, ?, ?, ?, ?)",
                [(mid, p.mime, p.width, p.height, p.data) for p in images],
            )
            self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        return mid

    def _check_room(self, adding: int) -> None:
        used = int(self._db.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM attachments").fetchone()[0])
        if used + adding > MAX_DB_IMAGE_BYTES:
            raise ImageTooLargeError(
                f"chat.db already keeps {used / MIB:.0f} MiB of images (at most {MAX_DB_IMAGE_BYTES // MIB} "
                "MiB); delete old conversations with images, then attach again",
                param="image",
            )

    def image(self, attachment_id: int) -> Picture:
        row = self._db.execute("SELECT * FROM attachments WHERE id = ?", (attachment_id,)).fetchone()
        if row is None:
            raise BadRequestError(f"no image {attachment_id}; its message may have been deleted")
        return Picture(row["mime"], bytes(row["data"]), row["width"], row["height"])

    def _images(self, conversation_id: int) -> dict[int, list[Attachment]]:
        rows = self._db.execute(
            "SELECT a.id, a.message, a.mime, a.width, a.height, LENGTH(a.data) AS size FROM attachments a "
            "JOIN messages m ON m.id = a.message WHERE m.conversation = ? ORDER BY a.id",
            (conversation_id,),
        ).fetchall()
        out: dict[int, list[Attachment]] = {}
        for r in rows:
            out.setdefault(r["message"], []).append(
                Attachment(r["id"], r["message"], r["mime"], r["width"], r["height"], r["size"])
            )
        return out

    def update(self, message_id: int, *, content: str, meta: dict[str, Any] | None = None) -> None:
        self._db.execute(
            "UPDATE messages SET content = ?, meta = ? WHERE id = ?",
            (content, json.dumps(meta or {}), message_id),
        )

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation = ? ORDER BY id", (conversation_id,)
        ).fetchall()
        images = self._images(conversation_id)
        return [
            Message(
                r["id"],
                r["conversation"],
                r["role"],
                r["content"],
                json.loads(r["meta"]),
                r["created"],
                tuple(images.get(r["id"], ())),
            )
            for r in rows
        ]

    def truncate_after(self, conversation_id: int, message_id: int) -> None:
        """Drop every message after `message_id` (regenerate, edit and resend)."""
        self._db.execute(
            "DELETE FROM messages WHERE conversation = ? AND id > ?", (conversation_id, message_id)
        )

    def history(self, conversation_id: int) -> list[dict[str, Any]]:
        """The OpenAI `messages` list: the system prompt, then user and assistant turns (errors left out);
        a message with images is a list of parts, its text then an `image_url` part (data: URL) each."""
        conv = self.get(conversation_id)
        out: list[dict[str, Any]] = (
            [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        )
        for m in self.messages(conversation_id):
            if m.role not in ("user", "assistant") or not (m.content or m.images):
                continue
            if not m.images:
                out.append({"role": m.role, "content": m.content})
                continue
            parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
            parts += [
                {"type": "image_url", "image_url": {"url": self.image(a.id).data_url()}} for a in m.images
            ]
            out.append({"role": m.role, "content": parts})
        return out

    # ---- export ------------------------------------------------------------------------------------
    def export_json(self, conversation_id: int) -> str:
        conv = self.get(conversation_id)
        doc = {
            "title": conv.title,
            "model": conv.model,
            "system_prompt": conv.system_prompt,
            "sampling": conv.sampling,
            "created": conv.created,
            "messages": [
                {
                    "role": m.role,
                    "content": m.content,
                    "meta": m.meta,
                    "created": m.created,
                    **({"images": [self._exported(a) for a in m.images]} if m.images else {}),
                }
                for m in self.messages(conversation_id)
            ],
        }
        return json.dumps(doc, indent=2, ensure_ascii=False)

    def export_markdown(self, conversation_id: int) -> str:
        conv = self.get(conversation_id)
        out = [f"# {conv.title}", ""]
        if conv.model:
            out += [f"Model: `{conv.model}`", ""]
        if conv.system_prompt:
            out += ["**System:**", "", conv.system_prompt, ""]
        names = {"user": "You", "assistant": "Assistant", "error": "Error"}
        for m in self.messages(conversation_id):
            out += [f"**{names.get(m.role, m.role)}:**", "", m.content, ""]
            out += [f"![image {i}]({self.image(a.id).data_url()})" for i, a in enumerate(m.images, 1)]
            out += [""] if m.images else []
        return "\n".join(out)

    def _exported(self, a: Attachment) -> dict[str, Any]:
        return {"mime": a.mime, "width": a.width, "height": a.height, "url": self.image(a.id).data_url()}


def _title(title: str) -> str:
    title = " ".join(title.split())
    if not title:
        raise BadRequestError("a conversation needs a title; type a few words")
    return title[:200]


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _conversation(row: sqlite3.Row) -> Conversation:
    return Conversation(
        row["id"],
        row["title"],
        row["model"],
        row["system_prompt"],
        json.loads(row["sampling"]),
        row["created"],
        row["updated"],
    )
