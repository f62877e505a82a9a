"""What the library knows about one model: the entry the supervisor and gateway use, its files, origin."""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.settings import Settings
from app.formats.detect import ModelFormat, detect_format
from app.formats.gguf_meta import GGUFFacts
from app.library.starter import StarterModel

# where a model was found; `download`: in the HF cache and fetched by `switchyard pull`
# `starter`: the starter model inside an installed Python package (library/starter.py)
# `app_store`: in another app's store or a shared folder, read in place, never written (library/app_stores/)
SOURCES = ("models_dir", "hf_cache", "import_copy", "import_link", "download", "starter", "app_store")
# formats some lane runs here (app/lanes); the others are listed with status `no_lane`. A safetensors
# folder is servable: mistral.rs runs plain weights anywhere, vLLM/SGLang quantized ones on NVIDIA GPUs
# (which of them can start here is the supervisor's question, answered with a 503 that says what to install)
LANE_FORMATS = frozenset(
    {"gguf", "piper", "whisper-ggml", "mlx", "safetensors", "diffusers", "gguf-diffusion"}
)
_RUN_TODAY = (
    "GGUF models, MLX folders, safetensors folders, Piper voices, whisper ggml models and diffusion models "
    "(sd.cpp)"
)
# sources whose files Switchyard may delete on `rm` without --delete-files (its own copies and the cache)
OWNED_SOURCES = frozenset({"hf_cache", "download", "import_copy"})


def projector_for(model_path: Path, paired: Path | None, *, override: str | None) -> Path | None:
    """The projector a lane loads: the override (absolute, or relative to the model's folder) when one is
    set, else the automatic pairing. An override of "" or "none" turns vision off for the model."""
    if override is None:
        return paired
    if override.strip().lower() in ("", "none"):
        return None
    p = Path(override).expanduser()
    return p if p.is_absolute() else model_path.parent / p


@dataclass(frozen=True)
class FileInfo:
    rel: str  # relative to the entry's location, POSIX separators
    size: int
    mtime_ns: int
    sha256: str | None = None  # known for HF cache LFS blobs (the blob's name) and copied imports

    def public(self) -> dict[str, Any]:
        return {"path": self.rel, "size": self.size, "sha256": self.sha256, "mtime_ns": self.mtime_ns}


@dataclass(frozen=True)
class Origin:
    """Where a model came from on the hub: the repository, the ref and the commit its files are from."""

    repo: str
    revision: str | None = None  # the ref (`main`)
    commit: str | None = None
    snapshot: str | None = None  # the snapshot folder in the HF cache
    history: tuple[str, ...] = ()  # older revisions of the repository still in the cache

    @property
    def short(self) -> str:
        return f"{self.repo}@{self.commit[:7]}" if self.commit else self.repo

    def public(self) -> dict[str, Any]:
        return {
            "repo": self.repo,
            "revision": self.revision,
            "commit": self.commit,
            "snapshot": self.snapshot,
            "history": list(self.history),
        }


@dataclass(frozen=True)
class Owner:
    """The app whose store holds a model Switchyard serves in place (Ollama, LM Studio, Jan, GPT4All, or
    `folder` for a shared folder the user named): its files are that app's to change, never ours."""

    app: str
    store: Path  # the store's root folder
    name: str  # the model's name in that app (Ollama's `llama3.2:latest`, LM Studio's `pub/repo/file`)
    family: str | None = None  # what the app itself records (Ollama's config blob), when it records it
    template: str | None = None  # Ollama's prompt template (a Go template), shown, never used to prompt

    def public(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "store": str(self.store),
            "name": self.name,
            "family": self.family,
            "template": self.template,
            "read_only": True,
        }


@dataclass(frozen=True)
class ModelEntry:
    """One model. Only GGUF entries carry `facts`; `ok` (servable) also covers other formats with a lane."""

    id: str
    path: Path  # the main file (first GGUF part) or the model's folder
    facts: GGUFFacts | None
    problem: str | None
    parts: tuple[Path, ...] = ()
    format: str = "gguf"
    kind_name: str | None = None  # the kind of a non-GGUF model (GGUF kinds come from the facts)
    source: str = "models_dir"
    location: Path | None = None  # the folder FileInfo.rel is relative to
    files: tuple[FileInfo, ...] = ()
    origin: Origin | None = None
    quant: str | None = None  # Q4_K_M, ... from the file name (HF cache models), for `repo:QUANT`
    mmproj: Path | None = None  # the vision projector paired with a GGUF text model (library/pairing.py)
    # the draft model a start pairs for speculative decoding (set per start by the supervisor: drafts.py)
    draft: Path | None = None
    # what the scan's detect_format found (non-GGUF entries; GGUFs carry `facts` from the header cache)
    detected: ModelFormat | None = field(default=None, compare=False, repr=False)
    owner: Owner | None = None  # another app's store (source `app_store`): read in place, never written
    # the package the starter model ships in (its version and license); None for every other model
    starter: StarterModel | None = None

    def model_format(self) -> ModelFormat:
        """The detected format: the scan's, or (for an entry made without one) read from `path` now."""
        return self.detected if self.detected is not None else detect_format(self.path)

    @property
    def ok(self) -> bool:
        if self.problem is not None:
            return False
        return self.facts is not None if self.format == "gguf" else self.format in LANE_FORMATS

    @property
    def kind(self) -> str:
        if self.kind_name is not None:
            return self.kind_name
        if self.facts is None:
            return "unknown"
        if self.facts.is_reranker:  # pooled like an embedding model, but asked through /v1/rerank
            return "rerank"
        return "embedding" if self.facts.is_embedding else "chat"

    @property
    def status(self) -> str:
        if self.problem is not None:
            return "broken"
        if self.kind_name == "adapter":  # a LoRA adapter: loads with its base model (library/pairing.py)
            return "adapter"
        return "ok" if self.ok else "no_lane"

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def identity(self) -> str:
        """The model's files as they are now (each one's path, size and mtime), hashed: a result tied to it
        (a smoke test) belongs to these files; a replaced or re-downloaded file has another identity."""
        files = sorted((f.rel, f.size, f.mtime_ns) for f in self.files)
        if not files:  # an entry made without its file list: the main file alone
            with contextlib.suppress(OSError):
                st = self.path.stat()
                files = [(self.path.name, st.st_size, st.st_mtime_ns)]
        return hashlib.sha1(repr((str(self.path), files)).encode()).hexdigest()

    def projector(self, settings: Settings | None = None) -> Path | None:
        """The one answer to "which vision projector loads with this model", which the lane start, the
        image check, capabilities (/v1/models, /api/show), `ls` and the Library page all follow:
        `model_overrides[id].mmproj` when set ("none" or "": no vision), else the library's pairing
        (`mmproj`, library/pairing.py). Neither read nor checked here (pairing.vision_projector does that
        before a start), so listings stay cheap. Without `settings` the pairing alone answers."""
        if self.format != "gguf" or (self.facts is not None and self.facts.is_embedding):
            return None
        override = settings.override(self.id, "mmproj", None) if settings is not None else None
        return projector_for(self.path, self.mmproj, override=override)

    def public(self, settings: Settings | None = None) -> dict[str, Any]:
        """The entry as the API and `switchyard ls` show it; with `settings`, `mmproj` and `vision` follow
        the model's `mmproj` override (without, the library's own pairing)."""
        mmproj = self.projector(settings)
        return {
            "id": self.id,
            "path": str(self.path),
            "format": self.format,
            "kind": self.kind,
            "status": self.status,
            "problem": self.problem or _not_servable(self),
            "parts": [str(p) for p in self.parts] if len(self.parts) > 1 else [],
            "facts": self.facts.public() if self.facts else None,
            "source": self.source,
            "location": str(self.location) if self.location else None,
            "size": self.size,
            "quant": self.quant,
            "mmproj": str(mmproj) if mmproj else None,
            "vision": mmproj is not None,
            "origin": self.origin.public() if self.origin else None,
            "owner": self.owner.public() if self.owner else None,
            "starter": self.starter.public() if self.starter else None,
        }


def _not_servable(entry: ModelEntry) -> str | None:
    if entry.ok:
        return None
    if entry.kind_name == "adapter":
        return "a LoRA adapter, not a model of its own: it loads with its base model (`switchyard ls`)"
    return f"no lane for format {entry.format} yet ({_RUN_TODAY} run today)"
