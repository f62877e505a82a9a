"""Images in chat.db (app/chat/store.py, app/chat/attachments.py) with Qt's real codec: downscaling, the
bounds, undecodable data, an old-schema file, history parts and exports; and the stats figures of timings."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")

from PySide6.QtGui import QColor, QImage

from app.chat import store as store_mod
from app.chat.attachments import MAX_IMAGES_PER_MESSAGE, MAX_SIDE, Picture, prepare
from app.chat.deltas import timing_figures
from app.chat.store import ChatStore
from app.core.errors import BadRequestError, ImageTooLargeError, InvalidImageError
from app.ui.chat_images import QtImageCodec, _encode
from tests.support.visiongen import GIF_B64, png_bytes

CODEC = QtImageCodec()
# the schema chat.db had before images (user_version 0), as older versions wrote it
OLD_SCHEMA = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, model TEXT,
    system_prompt TEXT NOT NULL DEFAULT '', sampling TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL,
    updated REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY,
    conversation INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE, role TEXT NOT NULL,
    content TEXT NOT NULL, meta TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL);
CREATE INDEX messages_by_conversation ON messages(conversation, id);
INSERT INTO conversations VALUES (1, 'old chat', 'tiny', '', '{}', 1.0, 1.0);
INSERT INTO messages VALUES (1, 1, 'user', 'hello from before', '{}', 1.0);
INSERT INTO messages VALUES (2, 1, 'assistant', 'hi', '{"tokens": 1}', 2.0);
"""


def _jpeg(width: int, height: int) -> bytes:
    image = QImage(width, height, QImage.Format.Format_RGB888)
    image.fill(QColor(200, 80, 40))
    return _encode(image, "JPEG", 90)


def _noise_png(side: int) -> bytes:
    """Random pixels compress to nothing: a png that stays big after any re-encoding."""
    rows = np.random.default_rng(1).integers(0, 256, (side, side * 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + rows[y].tobytes() for y in range(side))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    idat = zlib.compress(raw, 1)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _decoded(url: str) -> bytes:
    head, b64 = url.split(",", 1)
    assert head.startswith("data:image/") and head.endswith(";base64")
    return base64.b64decode(b64)


def test_images_are_scaled_checked_and_bounded(qapp: Any, tmp_path: Path, monkeypatch: Any) -> None:
    big = prepare(_jpeg(4000, 1000), codec=CODEC, name="photo.jpg")
    assert (big.mime, big.width, big.height) == ("image/jpeg", MAX_SIDE, MAX_SIDE // 4)
    assert not QImage.fromData(big.data).isNull()
    small = prepare(png_bytes(32, 24), codec=CODEC)
    assert (small.mime, small.width, small.height) == ("image/png", 32, 24)  # a screenshot stays png
    gif = prepare(base64.b64decode(GIF_B64), codec=CODEC)
    assert gif.mime in ("image/png", "image/jpeg") and (gif.width, gif.height) == (8, 8)  # re-encoded
    for bad, why in ((b"", "empty"), (b"this is not an image at all", "could not be read")):
        with pytest.raises(InvalidImageError, match=why):
            prepare(bad, codec=CODEC, name="x.png")
    with pytest.raises(InvalidImageError, match="could not be read"):
        prepare(png_bytes(32, 32)[:20], codec=CODEC)  # cut off inside its header
    with pytest.raises(ImageTooLargeError, match="after scaling"):
        prepare(_noise_png(1400), codec=CODEC, name="noise.png")

    store = ChatStore(tmp_path / "chat.db")
    cid = store.create("pics")
    with pytest.raises(BadRequestError, match=f"at most {MAX_IMAGES_PER_MESSAGE} images"):
        store.add(cid, "user", "many", images=[small] * (MAX_IMAGES_PER_MESSAGE + 1))
    monkeypatch.setattr(store_mod, "MAX_DB_IMAGE_BYTES", len(big.data) + len(small.data))
    store.add(cid, "user", "first", images=[big, small])
    with pytest.raises(ImageTooLargeError, match="delete old conversations"):
        store.add(cid, "user", "one more", images=[small])
    assert [m.content for m in store.messages(cid)] == ["first"]  # the refused message was not kept
    store.close()


def test_old_schema_file_opens_and_takes_images(qapp: Any, tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    con = sqlite3.connect(db)
    con.executescript(OLD_SCHEMA)
    con.close()
    store = ChatStore(db)
    assert [(m.content, m.images) for m in store.messages(1)] == [("hello from before", ()), ("hi", ())]
    assert store.history(1) == [
        {"role": "user", "content": "hello from before"},
        {"role": "assistant", "content": "hi"},
    ]
    pic = prepare(png_bytes(16, 16, seed=4), codec=CODEC)
    mid = store.add(1, "user", "what is this?", images=[pic])
    store.add(1, "user", "", images=[pic])  # an image alone is a message too
    store.close()

    store = ChatStore(db)  # reopened: migrated once, nothing lost
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == len(store_mod.MIGRATIONS)
    msgs = store.messages(1)
    att = msgs[2].images[0]
    assert (att.message, att.mime, att.width, att.height, att.size) == (
        mid,
        "image/png",
        16,
        16,
        len(pic.data),
    )
    assert store.image(att.id) == pic
    history = store.history(1)
    assert history[2]["content"][0] == {"type": "text", "text": "what is this?"}
    assert _decoded(history[2]["content"][1]["image_url"]["url"]) == pic.data
    assert [p["type"] for p in history[3]["content"]] == ["image_url"]

    doc = json.loads(store.export_json(1))
    exported = doc["messages"][2]["images"][0]
    assert (exported["width"], exported["mime"]) == (16, "image/png")
    assert _decoded(exported["url"]) == pic.data
    assert "images" not in doc["messages"][0]
    md = store.export_markdown(1)
    assert md.count("![image 1](data:image/png;base64,") == 2 and "what is this?" in md

    store.truncate_after(1, 2)  # the messages go, and their images with them
    with pytest.raises(BadRequestError, match="no image"):
        store.image(att.id)
    assert store.messages(1)[-1].images == ()
    store.close()


def test_timing_figures_for_the_stats_line() -> None:
    plain = {"prompt_per_second": 812.345, "predicted_per_second": 41.26, "predicted_n": 8}
    assert timing_figures(plain) == {"prompt_per_s": 812.3, "gen_per_s": 41.3}
    drafted = {**plain, "draft_n": 12, "draft_n_accepted": 9}
    assert timing_figures(drafted) == {
        "prompt_per_s": 812.3,
        "gen_per_s": 41.3,
        "draft_n": 12,
        "draft_accepted": 9,
    }
    assert timing_figures({"draft_n": 0, "draft_n_accepted": 0}) == {}  # nothing drafted: nothing said
    assert timing_figures(None) == {} and timing_figures({"prompt_per_second": "fast"}) == {}


def test_picture_data_url_round_trips() -> None:
    pic = Picture("image/png", b"\x89PNG-ish", 1, 1)
    assert _decoded(pic.data_url()) == b"\x89PNG-ish"
