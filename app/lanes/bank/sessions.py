"""The session bank: llama.cpp slot checkpoints on disk, indexed in SQLite, bounded by a byte budget.

`$SWITCHYARD_HOME/bank/bank.db` (WAL) holds one row per checkpoint: the model id and the identity a
restore must match (the model file's sha256, the engine version, the context settings), the tokens it
holds, the conversation's message-prefix fingerprints, and the slot file's size and sha256 taken at save
time. The slot files sit in `bank/slots/`, the folder the engine is told to save into. llama.cpp aborts
on a short slot file and silently accepts a wrong one, so `verified()` checks size and sha256 before any
restore; a damaged file is dropped and logged. The least recently used checkpoints go first when the
bank is over its budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.settings import Settings

log = logging.getLogger("switchyard.bank")
MIB = 1024 * 1024
STRAY_AGE_S = 600.0  # a slot file the index does not hold, this old, is no save in progress
_HASH_CHUNK = 4 * MIB

_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    id TEXT PRIMARY KEY,
    model_id TEXT NOT NULL,
    model_sha256 TEXT NOT NULL,
    engine TEXT NOT NULL,
    ctx TEXT NOT NULL,
    n_ctx INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    messages INTEGER NOT NULL,
    fingerprints TEXT NOT NULL,
    last_fp TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS prefixes (
    checkpoint TEXT NOT NULL REFERENCES checkpoints(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    fp TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS prefixes_fp ON prefixes(fp);
CREATE TABLE IF NOT EXISTS model_hashes (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    sha256 TEXT NOT NULL
);
"""


def bank_dir(home: Path) -> Path:
    return home / "bank"


def slots_dir(home: Path) -> Path:
    """Where the engine saves and restores slot files (llama.cpp's slot_save_path)."""
    return bank_dir(home) / "slots"


def bank_enabled(model_id: str, settings: Settings) -> bool:
    """`session_bank`, or the model's own `model_overrides[id].session_bank`."""
    return bool(settings.override(model_id, "session_bank", settings.models.session_bank))


def fingerprints(messages: Sequence[Any], *, seed: Any = None) -> tuple[str, ...]:
    """One rolling sha256 per message boundary: fingerprint i covers `seed` (tools, template options) and
    messages 0..i, so a conversation that extends another shares all of the other's fingerprints."""
    h = hashlib.sha256(json.dumps(seed, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    out: list[str] = []
    for m in messages:
        canonical = json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        h = hashlib.sha256((h + canonical).encode()).hexdigest()
        out.append(h)
    return tuple(out)


@dataclass(frozen=True)
class Identity:
    """What a restore must match exactly: the same model file, engine build and context settings."""

    model_sha256: str
    engine: str
    ctx: str  # e.g. "slot_ctx=1024 kv=f16 fa=auto"


@dataclass(frozen=True)
class Checkpoint:
    id: str
    model_id: str
    identity: Identity
    n_ctx: int
    tokens: int
    fingerprints: tuple[str, ...]
    size: int
    sha256: str
    created: float
    last_used: float

    @property
    def filename(self) -> str:
        return f"{self.id}.bin"

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model_id,
            "model_sha256": self.identity.model_sha256,
            "engine": self.identity.engine,
            "ctx": self.identity.ctx,
            "n_ctx": self.n_ctx,
            "tokens": self.tokens,
            "messages": len(self.fingerprints),
            "bytes": self.size,
            "created": self.created,
            "last_used": self.last_used,
        }


def new_checkpoint_id() -> str:
    return uuid.uuid4().hex


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class BankStore:
    """The bank's index and files. Blocking (SQLite, hashing): call it from a worker thread. Each call
    opens its own connection, so the store has no lifetime to manage and two servers may share it."""

    def __init__(self, home: Path, *, budget_bytes: int) -> None:
        self.dir = bank_dir(home)
        self.slots = slots_dir(home)
        self.budget_bytes = budget_bytes

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        self.slots.mkdir(parents=True, exist_ok=True)
        con = _open(self.dir / "bank.db")
        try:
            with con:
                yield con
        finally:
            con.close()

    # ---- model identity ------------------------------------------------------------------------------
    def model_sha256(self, path: Path, *, known: str | None = None) -> str:
        """The model file's sha256: `known` (the catalog's), else hashed once and kept by (path, size,
        mtime), so a multi-GB file is not read again at every stop."""
        if known:
            return known
        st = path.stat()
        with self._db() as con:
            row = con.execute("SELECT size, mtime_ns, sha256 FROM model_hashes WHERE path = ?", (str(path),))
            hit = row.fetchone()
            if hit is not None and hit["size"] == st.st_size and hit["mtime_ns"] == st.st_mtime_ns:
                return str(hit["sha256"])
        digest = file_sha256(path)
        with self._db() as con:
            con.execute(
                "INSERT OR REPLACE INTO model_hashes(path, size, mtime_ns, sha256) VALUES (?,?,?,?)",
                (str(path), st.st_size, st.st_mtime_ns, digest),
            )
        return digest

    # ---- checkpoints ---------------------------------------------------------------------------------
    def add(self, cp: Checkpoint) -> list[str]:
        """Record a saved checkpoint; drop the ones it supersedes (same identity, a prefix of it), then
        evict the least recently used over the budget. Returns the ids dropped."""
        with self._db() as con:
            con.execute(
                "INSERT INTO checkpoints VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    cp.id,
                    cp.model_id,
                    cp.identity.model_sha256,
                    cp.identity.engine,
                    cp.identity.ctx,
                    cp.n_ctx,
                    cp.tokens,
                    len(cp.fingerprints),
                    json.dumps(cp.fingerprints),
                    cp.fingerprints[-1],
                    cp.size,
                    cp.sha256,
                    cp.created,
                    cp.last_used,
                ),
            )
            con.executemany(
                "INSERT INTO prefixes(checkpoint, idx, fp) VALUES (?,?,?)",
                [(cp.id, i, fp) for i, fp in enumerate(cp.fingerprints)],
            )
            superseded = [
                str(r["id"])
                for r in con.execute(
                    "SELECT c.id FROM checkpoints c JOIN prefixes p ON p.checkpoint = ? "
                    "AND p.idx = c.messages - 1 AND p.fp = c.last_fp "
                    "WHERE c.id != ? AND c.model_id = ? AND c.model_sha256 = ? AND c.engine = ? "
                    "AND c.ctx = ?",
                    (
                        cp.id,
                        cp.id,
                        cp.model_id,
                        cp.identity.model_sha256,
                        cp.identity.engine,
                        cp.identity.ctx,
                    ),
                )
            ]
        for old in superseded:
            self.drop(old, reason=f"superseded by {cp.id}")
        return superseded + self.evict()

    def evict(self) -> list[str]:
        """Drop least recently used checkpoints until the bank fits its budget (stray files first)."""
        self.sweep()
        dropped: list[str] = []
        with self._db() as con:
            rows = con.execute("SELECT id, size FROM checkpoints ORDER BY last_used DESC").fetchall()
        total = 0
        for r in rows:
            total += int(r["size"])
            if total > self.budget_bytes:
                dropped.append(str(r["id"]))
        for cid in dropped:
            self.drop(cid, reason="over the session bank's budget")
        return dropped

    def best(self, model_id: str, identity: Identity, fps: Sequence[str]) -> tuple[Checkpoint, int] | None:
        """The checkpoint of `model_id` sharing the longest message prefix with `fps`, and that length.
        Checkpoints of the same model id with another identity (a re-generated file, another engine build
        or context) can never be restored: they are dropped here."""
        if not fps:
            return None
        with self._db() as con:
            stale = [
                str(r["id"])
                for r in con.execute(
                    "SELECT id FROM checkpoints WHERE model_id = ? AND "
                    "(model_sha256 != ? OR engine != ? OR ctx != ?)",
                    (model_id, identity.model_sha256, identity.engine, identity.ctx),
                )
            ]
            marks = ",".join("?" * len(fps))
            row = con.execute(
                f"SELECT c.*, p.idx FROM prefixes p JOIN checkpoints c ON c.id = p.checkpoint "
                f"WHERE p.fp IN ({marks}) AND c.model_id = ? AND c.model_sha256 = ? AND c.engine = ? "
                "AND c.ctx = ? ORDER BY p.idx DESC, c.last_used DESC LIMIT 1",
                (*fps, model_id, identity.model_sha256, identity.engine, identity.ctx),
            ).fetchone()
        for cid in stale:
            log.warning(
                "session bank: checkpoint %s of %s was made with another model file, engine version or "
                "context setting; dropped, never restored",
                cid,
                model_id,
            )
            self.drop(cid, reason="stale")
        if row is None or fps[int(row["idx"])] != json.loads(row["fingerprints"])[int(row["idx"])]:
            return None
        return _checkpoint(row), int(row["idx"]) + 1

    def verified(self, cp: Checkpoint) -> bool:
        """Whether the slot file is exactly what was saved (size, then sha256); a damaged or missing file
        is dropped and logged, since llama.cpp would abort on a short one and accept a wrong one."""
        path = self.slots / cp.filename
        try:
            size = path.stat().st_size
            ok = size == cp.size and file_sha256(path) == cp.sha256
            why = f"{size} bytes, expected {cp.size}" if size != cp.size else "its sha256 differs"
        except OSError as exc:
            ok, why = False, f"unreadable ({exc.strerror or exc})"
        if not ok:
            log.warning("session bank: checkpoint %s of %s is damaged (%s); dropped", cp.id, cp.model_id, why)
            self.drop(cp.id, reason="damaged")
        return ok

    def touch(self, cid: str) -> bool:
        """Mark a checkpoint used now; False when it is gone (dropped or cleared)."""
        with self._db() as con:
            cur = con.execute("UPDATE checkpoints SET last_used = ? WHERE id = ?", (time.time(), cid))
            return cur.rowcount > 0

    def holds(self, model_id: str) -> bool:
        """Whether any checkpoint of `model_id` is banked (a cheap look before any hashing)."""
        with self._db() as con:
            q = "SELECT 1 FROM checkpoints WHERE model_id = ? LIMIT 1"
            return con.execute(q, (model_id,)).fetchone() is not None

    def drop(self, cid: str, *, reason: str) -> None:
        with self._db() as con:
            con.execute("DELETE FROM checkpoints WHERE id = ?", (cid,))
        with contextlib.suppress(FileNotFoundError):
            (self.slots / f"{cid}.bin").unlink()
        log.info("session bank: dropped checkpoint %s (%s)", cid, reason)

    def checkpoints(self, model_id: str | None = None) -> list[Checkpoint]:
        with self._db() as con:
            if model_id is None:
                rows = con.execute("SELECT * FROM checkpoints ORDER BY last_used DESC").fetchall()
            else:
                q = "SELECT * FROM checkpoints WHERE model_id = ? ORDER BY last_used DESC"
                rows = con.execute(q, (model_id,)).fetchall()
        return [_checkpoint(r) for r in rows]

    def clear(self, model_id: str | None = None) -> tuple[int, int]:
        """Drop every checkpoint (of one model): (how many, bytes freed). Stray slot files go too (every
        one when the whole bank is cleared, else those no save can still be writing)."""
        gone = self.checkpoints(model_id)
        for cp in gone:
            self.drop(cp.id, reason="cleared")
        n, freed = self.sweep(min_age_s=0 if model_id is None else STRAY_AGE_S)
        return len(gone) + n, sum(cp.size for cp in gone) + freed

    def sweep(self, *, min_age_s: float = STRAY_AGE_S) -> tuple[int, int]:
        """Remove slot files the index does not hold (a save that failed half way, a crash between the
        engine's write and the index): (how many, bytes). Files younger than `min_age_s` may be a save
        still being written, and stay."""
        if not self.slots.is_dir():
            return 0, 0
        with self._db() as con:
            known = {str(r[0]) for r in con.execute("SELECT id FROM checkpoints")}
        n = freed = 0
        now = time.time()
        for f in self.slots.glob("*.bin"):
            with contextlib.suppress(OSError):
                st = f.stat()
                if f.stem not in known and now - st.st_mtime >= min_age_s:
                    f.unlink()
                    n, freed = n + 1, freed + st.st_size
        return n, freed

    def total_bytes(self) -> int:
        with self._db() as con:
            return int(con.execute("SELECT COALESCE(SUM(size), 0) FROM checkpoints").fetchone()[0])


def _open(path: Path) -> sqlite3.Connection:
    """The index, its schema made; a file that is not a database is moved aside (logged) and started
    afresh, since the checkpoints can always be made again."""
    if path.exists() and not path.is_file():  # a folder (or other) where the index belongs: not ours
        aside = path.with_name(f"{path.name}.not-a-file-{int(time.time())}")
        path.replace(aside)
        log.warning("session bank: %s is not a file; moved to %s, starting empty", path, aside)
    for attempt in (1, 2):
        con = sqlite3.connect(path, timeout=10)
        try:
            con.row_factory = sqlite3.Row
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA foreign_keys=ON")
            con.executescript(_SCHEMA)
            return con
        except sqlite3.DatabaseError as exc:
            con.close()
            if attempt == 2 or isinstance(exc, sqlite3.OperationalError):
                raise  # locked or unwritable: not ours to replace
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            path.replace(aside)
            log.warning(
                "session bank: %s is not a database (%s); moved to %s, starting empty", path, exc, aside
            )
    raise AssertionError("unreachable")


def _checkpoint(row: sqlite3.Row) -> Checkpoint:
    return Checkpoint(
        id=str(row["id"]),
        model_id=str(row["model_id"]),
        identity=Identity(str(row["model_sha256"]), str(row["engine"]), str(row["ctx"])),
        n_ctx=int(row["n_ctx"]),
        tokens=int(row["tokens"]),
        fingerprints=tuple(json.loads(row["fingerprints"])),
        size=int(row["size"]),
        sha256=str(row["sha256"]),
        created=float(row["created"]),
        last_used=float(row["last_used"]),
    )


def bank_summary(home: Path, *, budget_bytes: int) -> dict[str, Any]:
    """The bank as `GET /api/bank` and `switchyard bank ls` show it: totals, then one row per checkpoint."""
    store = BankStore(home, budget_bytes=budget_bytes)
    rows = store.checkpoints()
    return {
        "bytes": sum(cp.size for cp in rows),
        "budget_bytes": budget_bytes,
        "checkpoints": [cp.public() for cp in rows],
    }


def bank_clear(home: Path, *, model_id: str | None = None) -> dict[str, int]:
    """Empty the bank (or one model's part of it): `DELETE /api/bank` and `switchyard bank clear`."""
    n, freed = BankStore(home, budget_bytes=0).clear(model_id)
    return {"dropped": n, "bytes": freed}
