"""The catalog: every model Switchyard can see, found on each scan and recorded in library.db.

Sources (see sources.py for ids): registered imports, the models folders, and (when given) the Hugging
Face cache. GGUF headers are read once per (path, size, mtime) — in this process, and across processes
through library.db — and a broken file is listed with its reason, never raised. Without a `library` the
catalog works in memory only (tests of the formats, `explain PATH`).

GGUF models, MLX and safetensors folders, Piper voices, whisper ggml models and diffusion models are
servable (`ok`, see model.LANE_FORMATS); other formats are listed with their format and kind, and `get()`
refuses them with "no lane for format X yet".
`org/repo:QUANT` resolves to the HF cache GGUF of that repository with that quantization, and `org/repo`
to its only GGUF model.
Aliases recorded in the library (Library.add_alias) resolve to their model and are listed beside it.
A LoRA adapter GGUF (`general.type = adapter`) is listed as an adapter (kind `adapter`, never servable on
its own), paired with the library models llama.cpp would load it on (`adapter()`, pairing.pair_adapter);
`get()` refuses it saying which model it loads with.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from functools import partial
from pathlib import Path

from app.core.errors import ModelBrokenError, ModelNotFoundError, NoLaneForFormatError
from app.formats.gguf_adapter import AdapterFacts, adapter_refusal, read_adapter
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, read_gguf
from app.library.app_stores import AppStore, scan_app_stores
from app.library.model import FileInfo, ModelEntry, Origin
from app.library.pairing import ADAPTER_KIND, AdapterPairing, pair_adapter
from app.library.sources import import_entry, scan_hf_cache, scan_models_dir, starter_entry
from app.library.starter import StarterModel
from app.library.store import HeaderKey, Library

__all__ = ["Catalog", "FileInfo", "ModelEntry", "Origin"]
# a name not found rescans the library, but not again within this long of the last such rescan while its
# folders are unchanged: a burst of unknown names must not rescan a thousand models once per request
MISS_RESCAN_S = 1.0
LISTED_IN_ERRORS = 20  # model ids a "does not exist" message names; GET /v1/models lists them all


class Catalog:
    def __init__(
        self,
        dirs: Iterable[Path],
        *,
        library: Library | None = None,
        hf_cache: Path | None = None,
        starter: StarterModel | None = None,
        stores: Iterable[AppStore] = (),
    ) -> None:
        self.dirs = tuple(Path(d) for d in dirs)
        # other apps' stores and shared folders, read in place (library/app_stores/)
        self.stores = tuple(stores)
        self.library = library
        self.hf_cache = hf_cache
        self.starter = starter  # the starter model (library/starter.py), listed after every other source
        self._cache: dict[HeaderKey, GGUFFacts | GGUFProblem] = {}
        self._new_headers: dict[HeaderKey, GGUFFacts | GGUFProblem] = {}
        # LoRA adapters: each GGUF without a layer count read once (None: not an adapter), each adapter
        # checked against each model of its architecture once, by (path, size, mtime) of both files
        self._adapter_facts: dict[HeaderKey, AdapterFacts | None] = {}
        self._refusals: dict[tuple[HeaderKey, HeaderKey], str | None] = {}
        self._adapters: dict[str, AdapterPairing] = {}
        self._entries: dict[str, ModelEntry] = {}
        self._aliases: dict[str, list[str]] = {}
        self._pulled: set[str] = set()  # models listed under the name a client pulled them by (listing())
        # one scan at a time (the gateway's run in a thread); when the last rescan for a miss began
        self._scan_lock = threading.Lock()
        self._miss_scan_at = float("-inf")
        self._miss_scan_of: tuple[int | None, ...] = ()  # the folders' mtimes at that rescan
        self._rescan: asyncio.Future[list[ModelEntry]] | None = None

    def _read(self, path: Path) -> GGUFFacts | GGUFProblem:
        try:
            key = _key(path)
        except OSError as exc:
            return GGUFProblem(f"cannot read the file: {exc.strerror or exc}")
        if key not in self._cache:
            stored = self.library.header(key) if self.library is not None else None
            if stored is None:
                stored = read_gguf(path)
                self._new_headers[key] = stored
            self._cache[key] = stored
        return self._cache[key]

    def header(self, path: Path) -> GGUFFacts | GGUFProblem:
        """The GGUF facts of `path`, read once per (path, size, mtime)."""
        return self._read(path)

    def _found(self) -> list[ModelEntry]:
        found: list[ModelEntry] = []
        claimed: set[Path] = set()
        if self.library is not None:
            for mid, source, location, path in self.library.imports():
                e = import_entry(mid, location, path, source=source, read=self._read)
                found.append(e)
                claimed |= {e.path, *e.parts, *(location / f.rel for f in e.files)}
        for root in self.dirs:
            if root.is_dir():
                found.extend(scan_models_dir(root, read=self._read, skip=claimed))
        if self.hf_cache is not None:
            downloaded = self.library.downloaded_repos() if self.library is not None else set()
            for e in scan_hf_cache(self.hf_cache, read=self._read):
                if e.origin is not None and e.origin.repo in downloaded:
                    e = _with_source(e, "download")
                found.append(e)
        found.extend(scan_app_stores(self.stores, read=self._read))
        if self.starter is not None:  # last: a model of the user's with the same id is served instead
            found.append(starter_entry(self.starter, read=self._read))
        return found

    def scan(self) -> list[ModelEntry]:
        with self._scan_lock:
            return self._scan()

    def _scan_for_miss(self) -> list[ModelEntry]:
        self._miss_scan_at, self._miss_scan_of = time.monotonic(), self._folders()
        return self.scan()

    def _folders(self) -> tuple[int | None, ...]:
        """The mtimes of the scanned folders: a file added to or removed from one changes its own."""
        out: list[int | None] = []
        for root in self._roots():
            try:
                out.append(root.stat().st_mtime_ns)
            except OSError:
                out.append(None)
        return tuple(out)

    def _scan(self) -> list[ModelEntry]:
        entries: dict[str, ModelEntry] = {}
        for e in self._found():
            if e.id in entries:
                first = entries[e.id].path
                e = ModelEntry(
                    e.id,
                    e.path,
                    None,
                    f"duplicate model id; {first} is served instead",
                    source=e.source,
                    location=e.location,
                )
                entries[f"{e.id}@{e.path}"] = e
                continue
            entries[e.id] = e
        self._adapters = self._mark_adapters(entries)
        aliases: dict[str, list[str]] = {}
        for e in entries.values():
            if e.origin is None or e.format != "gguf" or "@" in e.id or e.kind == ADAPTER_KIND:
                continue
            aliases.setdefault(e.origin.repo, []).append(e.id)
            if e.quant:
                aliases.setdefault(f"{e.origin.repo}:{e.quant}".lower(), []).append(e.id)
        views = self._alias_views(entries, aliases)
        self._entries, self._aliases = entries, aliases
        if self.library is not None:
            self.library.sync(
                (e for k, e in entries.items() if "@" not in k),
                headers=self._new_headers,
                roots=self._roots(),
            )
        self._new_headers = {}
        return [*entries.values(), *views]

    def _roots(self) -> list[Path]:
        """Every folder a scan covers: the models folders, the HF cache and the other apps' stores."""
        cache = [self.hf_cache] if self.hf_cache is not None else []
        return [*self.dirs, *cache, *(s.root for s in self.stores)]

    def _mark_adapters(self, entries: dict[str, ModelEntry]) -> dict[str, AdapterPairing]:
        """Turn each LoRA adapter GGUF in `entries` into an adapter entry (no facts, no problem: listed, not
        servable, never broken) and pair it with the servable GGUF models there."""
        found: dict[str, tuple[HeaderKey, AdapterFacts]] = {}
        for mid, e in entries.items():
            if mid == e.id and (got := self._adapter_of(e)) is not None:
                entries[mid] = replace(e, facts=None, problem=None, kind_name=ADAPTER_KIND, mmproj=None)
                found[mid] = got
        models = [e for e in entries.values() if e.ok and e.format == "gguf"]
        return {
            mid: pair_adapter(facts, models, refusal=partial(self._refusal, key))
            for mid, (key, facts) in found.items()
        }

    def _adapter_of(self, e: ModelEntry) -> tuple[HeaderKey, AdapterFacts] | None:
        """The file key and adapter facts of a one-file GGUF entry whose header has no layer count (a
        model's always has one, an adapter's never), else None."""
        if e.format != "gguf" or len(e.parts) > 1:
            return None
        got = self._read(e.path)
        if isinstance(got, GGUFFacts) and got.block_count is not None:
            return None
        try:
            key = _key(e.path)
        except OSError:
            return None
        if key not in self._adapter_facts:
            self._adapter_facts[key] = read_adapter(e.path)
        facts = self._adapter_facts[key]
        return (key, facts) if facts is not None else None

    def _refusal(self, key: HeaderKey, adapter: AdapterFacts, base: ModelEntry) -> str | None:
        """adapter_refusal, remembered per (adapter file, base file) as they are now."""
        try:
            pair = (key, _key(base.path))
        except OSError as exc:
            return f"the base model cannot be read: {exc.strerror or exc}"
        if pair not in self._refusals:
            self._refusals[pair] = adapter_refusal(adapter, base.path)
        return self._refusals[pair]

    def adapter(self, model_id: str) -> AdapterPairing | None:
        """The LoRA adapter `model_id` is (what it adapts, the models it pairs with, or why none), as of
        the last scan; None for a model."""
        return self._adapters.get(model_id)

    def _alias_views(self, entries: dict[str, ModelEntry], aliases: dict[str, list[str]]) -> list[ModelEntry]:
        """The library's aliases (Ollama's copy, create, pull), added to `aliases` so each resolves to its
        model, and listed as entries of their own name with source `alias`. An alias whose model is gone
        or broken is skipped until it is back; a model's own id or repo alias wins over an alias."""
        if self.library is None:
            return []
        views, pulled = [], set()
        for name, doc in sorted(self.library.aliases().items()):
            target = entries.get(doc["target"])
            key = name.lower() if ":" in name else name
            if target is None or not target.ok or name in entries or key in aliases:
                continue
            aliases[key] = [target.id]
            views.append(replace(target, id=name, source="alias"))
            if doc.get("by") == "pull":
                pulled.add(target.id)
        self._pulled = pulled
        return views

    def listing(self) -> list[ModelEntry]:
        """`scan()` as the API lists models, one name per model: one pulled by name through Ollama's
        API is listed by that name only (its own id still resolves); copies and creates stay names of
        their own."""
        entries = self.scan()
        return [e for e in entries if e.id not in self._pulled]

    def entries(self) -> list[ModelEntry]:
        return self.scan()

    def ids(self) -> list[str]:
        return [e.id for e in self._entries.values() if e.ok]

    def servable(self) -> list[ModelEntry]:
        """The servable entries as of the last scan; no rescan, no file access."""
        return [e for e in self._entries.values() if e.ok]

    def _lookup(self, model_id: str) -> ModelEntry | None:
        entry = self._entries.get(model_id)
        if entry is not None:
            return entry
        key = model_id.lower() if ":" in model_id else model_id
        targets = self._aliases.get(key, [])
        if len(targets) > 1:
            raise ModelNotFoundError(
                f"{model_id!r} names several models: {', '.join(sorted(targets))}; use one of those ids",
                param="model",
            )
        return self._entries.get(targets[0]) if targets else None

    def find(self, model_id: str) -> ModelEntry | None:
        """The entry for an id or alias as of the last scan, or None; no rescan (the gateway asks this
        before trying a remote lane, on every request)."""
        return self._lookup(model_id)

    def get(self, model_id: str, *, allow_broken: bool = False) -> ModelEntry:
        """The entry for a servable model (an id or an alias); on a miss (a file may have just arrived)
        rescans first, unless a rescan for a miss began less than MISS_RESCAN_S ago and the folders are
        unchanged since. `allow_broken` returns a broken or not-yet-runnable entry instead of raising."""
        if self._missing(model_id) and self._rescan_due():
            self._scan_for_miss()
        return self._answer(model_id, allow_broken=allow_broken)

    async def aget(self, model_id: str, *, allow_broken: bool = False) -> ModelEntry:
        """`get` for the event loop: the rescan on a miss runs in a thread, shared by every request that
        misses meanwhile, so a burst of unknown names costs one scan and never stalls the loop."""
        if self._missing(model_id) and (self._rescan is not None or self._rescan_due()):
            rescan = self._rescan
            if rescan is None or rescan.get_loop() is not asyncio.get_running_loop():  # a loop since closed
                rescan = self._rescan = asyncio.ensure_future(asyncio.to_thread(self._scan_for_miss))
                rescan.add_done_callback(self._rescanned)
            await asyncio.shield(rescan)
        return self._answer(model_id, allow_broken=allow_broken)

    def _rescanned(self, fut: asyncio.Future[list[ModelEntry]]) -> None:
        self._rescan = None
        if not fut.cancelled():
            fut.exception()  # each waiter sees the scan's error itself; this one is only retrieved

    def _missing(self, model_id: str) -> bool:
        entry = self._lookup(model_id)
        return entry is None or not entry.path.exists()

    def _rescan_due(self) -> bool:
        recent = time.monotonic() - self._miss_scan_at < MISS_RESCAN_S
        return not recent or self._folders() != self._miss_scan_of

    def _answer(self, model_id: str, *, allow_broken: bool) -> ModelEntry:
        entry = self._lookup(model_id)
        if entry is None:
            raise ModelNotFoundError(
                f"model {model_id!r} does not exist; available models: {self._known_text()}", param="model"
            )
        if allow_broken:
            return entry
        if entry.kind == ADAPTER_KIND:
            raise NoLaneForFormatError(
                _adapter_refused(model_id, self._adapters.get(entry.id)), param="model"
            )
        if entry.problem is not None:
            raise ModelBrokenError(f"model {model_id!r} cannot be served: {entry.problem}", param="model")
        if not entry.ok:
            raise NoLaneForFormatError(
                f"model {model_id!r} is a {entry.format} model ({entry.kind}); "
                f"no lane for format {entry.format} yet — GGUF models (llama.cpp), MLX folders, "
                "safetensors folders, Piper voices, whisper ggml models and diffusion models (sd.cpp) "
                "run today; "
                "use a GGUF build of this model",
                param="model",
            )
        return entry

    def _known_text(self) -> str:
        ids = self.ids()
        if not ids:
            return f"none (put .gguf files in {', '.join(map(str, self.dirs))})"
        more = len(ids) - LISTED_IN_ERRORS
        return ", ".join(ids[:LISTED_IN_ERRORS]) + (
            f" and {more} more (GET /v1/models lists them all)" if more > 0 else ""
        )


def _with_source(e: ModelEntry, source: str) -> ModelEntry:
    return replace(e, source=source)


def _key(path: Path) -> HeaderKey:
    st = path.stat()
    return (str(path), st.st_size, st.st_mtime_ns)


def _adapter_refused(model_id: str, pairing: AdapterPairing | None) -> str:
    head = f"{model_id!r} is a LoRA adapter, not a model: it is served only with its base model"
    if pairing is None or not pairing.bases:
        why = pairing.why if pairing is not None else "no base model in the library pairs with it"
        return f"{head}, and {why}"
    base = pairing.bases[0]
    return (
        f"{head} ({', '.join(pairing.bases)}); add it to model_overrides[{base!r}].lora (the Library's Tune "
        f"panel: LoRA adapters) and ask for {base}+<adapter>, as GET /v1/models lists it"
    )
