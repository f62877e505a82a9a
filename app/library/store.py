"""Library: the catalog's rows in library.db — models, files, origin, pins, footprints, smoke tests, cached
headers.

`sync()` writes a whole scan in one transaction and only the rows that changed (each model row carries a
digest of what was found), so a scan that finds nothing new writes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.paths import Paths
from app.core.pins import PinStore
from app.formats.gguf_meta import GGUFFacts, GGUFProblem
from app.library.db import Database
from app.library.model import FileInfo, ModelEntry

# sources a scan re-discovers; rows of other sources (imports) stay until `rm`
SCANNED = ("models_dir", "hf_cache", "download", "starter", "app_store")
HeaderKey = tuple[str, int, int]
ALIAS = "alias:"  # meta key prefix of an alias row


def _digest(e: ModelEntry) -> str:
    doc = {
        **e.public(),
        "files": [dataclasses.astuple(f) for f in e.files],
        "facts": dataclasses.asdict(e.facts) if e.facts else None,
    }
    return hashlib.sha1(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class SmokeResult:
    """One smoke test: a short chat answer or one embedding through a freshly ready lane."""

    identity: str  # ModelEntry.identity() of the files it ran on
    ok: bool
    at: float  # when it ran (Unix seconds)
    seconds: float  # how long the request took
    lane: str  # the engine that answered (llama.cpp, mlx...)
    request: str  # "chat" or "embedding"
    detail: str  # what came back, or why it failed

    def public(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "at": self.at,
            "seconds": round(self.seconds, 3),
            "lane": self.lane,
            "request": self.request,
            "detail": self.detail,
        }


class Library:
    def __init__(self, db: Database, *, pins: PinStore | None = None, footprints_file: Path | None = None):
        self.db = db
        self.pin_store = pins  # pins.json's owner; the pins table mirrors it for queries
        if footprints_file is not None:
            self._import_footprints_json(footprints_file)

    @classmethod
    def open(cls, paths: Paths) -> Library:
        paths.home.mkdir(parents=True, exist_ok=True)
        return cls(
            Database(paths.library_db), pins=PinStore(paths.pins_file), footprints_file=paths.footprints_file
        )

    @property
    def path(self) -> Path:
        return self.db.path

    @property
    def notices(self) -> list[str]:
        return self.db.notices

    def close(self) -> None:
        self.db.close()

    # ---- headers: GGUF facts keyed by (path, size, mtime), so a new process does not re-read them ------
    def header(self, key: HeaderKey) -> GGUFFacts | GGUFProblem | None:
        rows = self.db.query("SELECT size, mtime_ns, facts, problem FROM headers WHERE path = ?", (key[0],))
        if not rows or (rows[0]["size"], rows[0]["mtime_ns"]) != key[1:]:
            return None
        if rows[0]["facts"]:
            with contextlib.suppress(TypeError, ValueError):
                return GGUFFacts(**json.loads(rows[0]["facts"]))
            return None  # written by another version: read the file again
        return GGUFProblem(rows[0]["problem"] or "unreadable")

    # ---- a scan ----------------------------------------------------------------------------------
    def sync(
        self,
        entries: Iterable[ModelEntry],
        *,
        headers: dict[HeaderKey, Any] | None = None,
        roots: Iterable[Path] | None = None,
    ) -> int:
        """Record a scan: changed models rewritten, vanished scanned models dropped. Returns rows written.

        `roots`: the folders this scan covered; a model stored under another root (another process
        scanning other models folders) is not dropped for being absent here. None: every root."""
        entries = list(entries)
        known = {
            r["id"]: (r["digest"], r["source"], r["location"])
            for r in self.db.query("SELECT id, digest, source, location FROM models")
        }
        changed = [(e, d) for e in entries if known.get(e.id, ("",))[0] != (d := _digest(e))]
        seen = {e.id for e in entries}
        covered = None if roots is None else tuple(Path(r) for r in roots)

        def ours(location: str) -> bool:
            return covered is None or any(Path(location).is_relative_to(r) for r in covered)

        gone = [
            mid
            for mid, (_, src, loc) in known.items()
            # the starter model's folder is no scanned root: it goes when a scan no longer lists it
            if mid not in seen and src in SCANNED and (src == "starter" or ours(loc))
        ]
        pins = self._pins_changed()
        if not (changed or gone or headers or pins is not None):
            return 0
        now = time.time()
        with self.db.transaction() as tx:
            for mid in gone:
                tx.execute("DELETE FROM models WHERE id = ?", (mid,))
            for e, digest in changed:
                self._write(tx, e, digest, now)
            for (path, size, mtime), got in (headers or {}).items():
                facts = json.dumps(dataclasses.asdict(got)) if isinstance(got, GGUFFacts) else None
                problem = got.reason if isinstance(got, GGUFProblem) else None
                tx.execute(
                    "INSERT OR REPLACE INTO headers(path, size, mtime_ns, facts, problem) VALUES (?,?,?,?,?)",
                    (path, size, mtime, facts, problem),
                )
            if pins is not None:
                tx.execute("DELETE FROM pins")
                tx.executemany("INSERT INTO pins(model_id, lane) VALUES (?, ?)", sorted(pins.items()))
        return len(changed) + len(gone)

    def _write(self, tx: Any, e: ModelEntry, digest: str, now: float) -> None:
        # sha256 computed earlier (a copied import) is kept while the file's size and mtime are unchanged
        old = {
            r["rel_path"]: r
            for r in tx.execute(
                "SELECT rel_path, size, mtime_ns, sha256 FROM files WHERE model_id = ?", (e.id,)
            )
        }
        files = []
        for f in e.files:
            prev = old.get(f.rel)
            sha = f.sha256
            if sha is None and prev is not None and (prev["size"], prev["mtime_ns"]) == (f.size, f.mtime_ns):
                sha = prev["sha256"]
            files.append((e.id, f.rel, f.size, sha, f.mtime_ns))
        tx.execute(
            """INSERT INTO models(id, format, kind, status, problem, facts, size, source, location, path,
                                  digest, added_at)
               VALUES (?,?,?,?,?,?,?,?,?,?,?,?)
               ON CONFLICT(id) DO UPDATE SET format=excluded.format, kind=excluded.kind,
                 status=excluded.status, problem=excluded.problem, facts=excluded.facts, size=excluded.size,
                 source=excluded.source, location=excluded.location, path=excluded.path,
                 digest=excluded.digest""",
            (
                e.id,
                e.format,
                e.kind,
                e.status,
                e.problem,
                json.dumps(e.facts.public()) if e.facts else None,
                e.size,
                e.source,
                str(e.location or e.path.parent),
                str(e.path),
                digest,
                now,
            ),
        )
        tx.execute("DELETE FROM files WHERE model_id = ?", (e.id,))
        tx.executemany(
            "INSERT INTO files(model_id, rel_path, size, sha256, mtime_ns) VALUES (?,?,?,?,?)", files
        )
        tx.execute("DELETE FROM origin WHERE model_id = ?", (e.id,))
        if e.origin is not None:
            o = e.origin
            tx.execute(
                "INSERT INTO origin(model_id, repo, revision, commit_hash, snapshot, history) "
                "VALUES (?,?,?,?,?,?)",
                (e.id, o.repo, o.revision, o.commit, o.snapshot, json.dumps(list(o.history))),
            )

    def _pins_changed(self) -> dict[str, str] | None:
        """pins.json (the source of truth `switchyard pin` writes) when it differs from the pins table."""
        if self.pin_store is None:
            return None
        try:
            pins = self.pin_store.all()
        except Exception:  # a broken pins.json is reported by doctor and the supervisor, not by a scan
            return None
        have = {r["model_id"]: r["lane"] for r in self.db.query("SELECT model_id, lane FROM pins")}
        return None if have == pins else pins

    # ---- imports -------------------------------------------------------------------------------------
    def imports(self) -> list[tuple[str, str, Path, Path]]:
        """(id, source, location, path) of each registered import."""
        rows = self.db.query(
            "SELECT id, source, location, path FROM models WHERE source IN ('import_copy', 'import_link')"
        )
        return [(r["id"], r["source"], Path(r["location"]), Path(r["path"])) for r in rows]

    def register(self, entry: ModelEntry) -> None:
        """Record an import (or any entry) now, in one transaction."""
        with self.db.transaction() as tx:
            self._write(tx, entry, _digest(entry), time.time())

    def forget(self, model_id: str) -> None:
        """Drop the model's row, and every alias naming it (an alias of a removed model names nothing)."""
        names = [f"{ALIAS}{n}" for n, doc in self.aliases().items() if doc["target"] == model_id]
        with self.db.transaction() as tx:
            tx.execute("DELETE FROM models WHERE id = ?", (model_id,))
            tx.executemany("DELETE FROM meta WHERE key = ?", [(k,) for k in names])

    def touch(self, model_id: str, *, at: float | None = None) -> None:
        """Remember that a lane was started for `model_id` (last_used_at)."""
        with self.db.transaction() as tx:
            tx.execute("UPDATE models SET last_used_at = ? WHERE id = ?", (at or time.time(), model_id))

    def mark_download(self, repo_id: str) -> None:
        """Called by `switchyard pull`: models of this repository in the HF cache are listed as `download`."""
        with self.db.transaction() as tx:
            tx.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (f"download:{repo_id}", "1"))

    def downloaded_repos(self) -> set[str]:
        return {r["key"][9:] for r in self.db.query("SELECT key FROM meta WHERE key LIKE 'download:%'")}

    # ---- aliases: more names for a model (Ollama's copy, create and pull), as meta rows `alias:NAME` -------
    def aliases(self) -> dict[str, dict[str, Any]]:
        """{name: {"target": model id, "by": "copy" | "create" | "pull", "created_at": unix time}}."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.db.query("SELECT key, value FROM meta WHERE key LIKE 'alias:%'"):
            with contextlib.suppress(TypeError, ValueError):
                doc = json.loads(r["value"])
                if isinstance(doc, dict) and isinstance(doc.get("target"), str):
                    out[r["key"][len(ALIAS) :]] = doc
        return out

    def add_alias(self, name: str, *, target: str, by: str) -> None:
        """Make `name` another name for the model `target` (replacing an alias of that name)."""
        doc = json.dumps({"target": target, "by": by, "created_at": time.time()})
        with self.db.transaction() as tx:
            tx.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (f"{ALIAS}{name}", doc))

    def drop_alias(self, name: str) -> bool:
        """Forget the alias `name`; False when there was none."""
        with self.db.transaction() as tx:
            return tx.execute("DELETE FROM meta WHERE key = ?", (f"{ALIAS}{name}",)).rowcount > 0

    # ---- reading ----------------------------------------------------------------------------------
    def rows(self, model_id: str | None = None) -> list[dict[str, Any]]:
        """Models as stored, each with its files and origin (for `ls`, the admin API and the GUI)."""
        where, args = ("WHERE id = ?", (model_id,)) if model_id is not None else ("", ())
        out = []
        for r in self.db.query(f"SELECT * FROM models {where} ORDER BY id", args):
            files = self.db.query(
                "SELECT rel_path, size, sha256, mtime_ns FROM files WHERE model_id = ? ORDER BY rel_path",
                (r["id"],),
            )
            org = self.db.query("SELECT * FROM origin WHERE model_id = ?", (r["id"],))
            out.append(
                {
                    "id": r["id"],
                    "format": r["format"],
                    "kind": r["kind"],
                    "status": r["status"],
                    "problem": r["problem"],
                    "size": r["size"],
                    "source": r["source"],
                    "location": r["location"],
                    "path": r["path"],
                    "added_at": r["added_at"],
                    "last_used_at": r["last_used_at"],
                    "facts": json.loads(r["facts"]) if r["facts"] else None,
                    "files": [FileInfo(f[0], f[1], f[3], f[2]).public() for f in files],
                    "origin": (
                        {
                            "repo": org[0]["repo"],
                            "revision": org[0]["revision"],
                            "commit": org[0]["commit_hash"],
                            "snapshot": org[0]["snapshot"],
                            "history": json.loads(org[0]["history"]),
                        }
                        if org
                        else None
                    ),
                }
            )
        return out

    def pins(self) -> dict[str, str]:
        return {r["model_id"]: r["lane"] for r in self.db.query("SELECT model_id, lane FROM pins")}

    # ---- smoke tests (app/lanes/smoke.py): one result per model, for the files it ran on ------------
    def put_smoke(self, model_id: str, result: SmokeResult) -> bool:
        """Keep `result` as the model's smoke test (replacing an older one); False when the model has no
        row (removed meanwhile): nothing is kept for a model the library no longer lists."""
        try:
            with self.db.transaction() as tx:
                tx.execute(
                    "INSERT OR REPLACE INTO smoke(model_id, identity, ok, at, seconds, lane, request, "
                    "detail) VALUES (?,?,?,?,?,?,?,?)",
                    (model_id, *dataclasses.astuple(result)),
                )
        except sqlite3.IntegrityError:
            return False
        return True

    def smoke(self, model_id: str | None = None) -> dict[str, SmokeResult]:
        """The kept smoke tests by model id (one model's with `model_id`), whatever files they ran on:
        compare `identity` with ModelEntry.identity() to know whether one still speaks for the model."""
        where, args = ("WHERE model_id = ?", (model_id,)) if model_id is not None else ("", ())
        rows = self.db.query(
            f"SELECT model_id, identity, ok, at, seconds, lane, request, detail FROM smoke {where}", args
        )
        return {r[0]: SmokeResult(r[1], bool(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in rows}

    def forget_smoke(self, model_id: str) -> None:
        """Drop the model's smoke test, so its next load runs one again."""
        with self.db.transaction() as tx:
            tx.execute("DELETE FROM smoke WHERE model_id = ?", (model_id,))

    # ---- footprints --------------------------------------------------------------------------------
    def put_footprint(self, model_id: str, entry: dict[str, Any]) -> None:
        with self.db.transaction() as tx:
            self._put_footprint(tx, model_id, entry)

    @staticmethod
    def _put_footprint(tx: Any, model_id: str, entry: dict[str, Any]) -> None:
        tx.execute(
            "INSERT OR REPLACE INTO footprints(model_id, file, size, mtime_ns, at, data) "
            "VALUES (?,?,?,?,?,?)",
            (
                model_id,
                str(entry.get("file", "")),
                int(entry.get("size", -1)),
                int(entry.get("mtime_ns", -1)),
                float(entry.get("at", 0.0)),
                json.dumps(entry),
            ),
        )

    def footprint(self, model_id: str) -> dict[str, Any] | None:
        rows = self.db.query("SELECT data FROM footprints WHERE model_id = ?", (model_id,))
        return dict(json.loads(rows[0]["data"])) if rows else None

    def _import_footprints_json(self, path: Path) -> None:
        """footprints.json (the store before library.db) is imported once, then renamed *.imported."""
        if not path.exists() or self.db.query("SELECT 1 FROM meta WHERE key = 'footprints_json_imported'"):
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # unreadable: left where it is for the user to look at
        with self.db.transaction() as tx:
            for mid, entry in data.items() if isinstance(data, dict) else ():
                if isinstance(entry, dict):
                    self._put_footprint(tx, str(mid), entry)
            tx.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('footprints_json_imported', ?)", (str(path),)
            )
        with contextlib.suppress(OSError):
            path.rename(path.with_name(path.name + ".imported"))
