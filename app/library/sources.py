"""Where models are found: the models folders, the Hugging Face cache, and imports.

Ids: in a models folder `DIR/tiny.gguf` is `tiny` and `DIR/org/repo/file.gguf` is `org/repo/file`; a
multi-part GGUF (`m-00001-of-00003.gguf`) is one model named by its stem `m`; a non-GGUF model folder
(safetensors, MLX, diffusers) is named by its folder. In the HF cache a GGUF is `org/repo/<file stem>`
and a non-GGUF repository is `org/repo`. Only the snapshot `refs/main` points to is listed; the other
snapshots of a repository are older revisions, kept as the origin's history, except a gated update's
new revision (refs/switchyard-candidate), listed as `<id>@candidate` while its eval decides.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from app.formats.detect import ModelFormat, ModelKind, detect_format
from app.formats.gguf_layout import DIFFUSION_ARCHS
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, split_part
from app.hub.cache_layout import CANDIDATE_REF
from app.hub.quant import parse_quant
from app.library.model import FileInfo, ModelEntry, Origin
from app.library.pairing import pair_projector
from app.library.starter import StarterModel

ReadGGUF = Callable[[Path], GGUFFacts | GGUFProblem]
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# a gated update's new revision, listed beside the current one while its eval runs (docs/evals.md)
CANDIDATE_SUFFIX = "@candidate"
# what a non-GGUF model is for; GGUF kinds come from the header
KIND_OF_FORMAT = {
    ModelKind.SAFETENSORS: "chat",
    ModelKind.MLX: "chat",
    ModelKind.DIFFUSERS: "image",
    ModelKind.GGUF_DIFFUSION: "image",
    ModelKind.WHISPER_GGML: "transcription",
    ModelKind.PIPER: "speech",
}
_FOLDER_MARKERS = ("config.json", "model_index.json")
PROJECTOR_ALONE = (
    "a vision projector (mmproj) loads with the text model it belongs to, not on its own; put it beside "
    "that model or name it in model_overrides[<model>].mmproj"
)


def file_info(path: Path, location: Path, *, sha256: str | None = None) -> FileInfo | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return FileInfo(path.relative_to(location).as_posix(), st.st_size, st.st_mtime_ns, sha256)


def gguf_parts(path: Path) -> tuple[str, tuple[Path, ...], str | None]:
    """(stem, parts, problem) of the GGUF model whose first file is `path`."""
    split = split_part(path)
    if split is None:
        return path.stem, (path,), None
    stem, _, total = split
    parts = tuple(path.with_name(f"{stem}-{i:05d}-of-{total:05d}.gguf") for i in range(1, total + 1))
    missing = [p.name for p in parts if not p.exists()]
    problem = f"multi-part model is incomplete: missing {', '.join(missing)}" if missing else None
    return stem, parts, problem


def gguf_entry(
    model_id: str,
    path: Path,
    *,
    read: ReadGGUF,
    source: str,
    location: Path,
    sha: Callable[[Path], str | None] = lambda _p: None,
    origin: Origin | None = None,
    snapshot: Path | None = None,
) -> ModelEntry:
    """A GGUF model's entry; a chat model gets the vision projector beside it (in `snapshot`, for a Hugging
    Face snapshot) whose width matches."""
    _, parts, problem = gguf_parts(path)
    got = read(path)
    if _maybe_diffusion(got) and (fmt := detect_format(path)).kind is ModelKind.GGUF_DIFFUSION:
        # an image model in GGUF clothing: listed as such, so it is routed to sd.cpp, not llama.cpp
        return other_entry(model_id, fmt, source=source, location=location, sha=sha, origin=origin)
    files = tuple(f for p in parts if (f := file_info(p, location, sha256=sha(p))) is not None)
    facts = got if isinstance(got, GGUFFacts) and problem is None else None
    if isinstance(got, GGUFProblem):
        problem = got.reason
    elif got.architecture == "clip":  # a projector not named mmproj: never a chat model of its own
        facts, problem = None, PROJECTOR_ALONE
    return ModelEntry(
        model_id,
        path,
        facts,
        problem,
        parts,
        source=source,
        location=location,
        files=files,
        origin=origin,
        quant=parse_quant(path.name),
        mmproj=_paired(path, facts, snapshot),
    )


def _paired(path: Path, facts: GGUFFacts | None, snapshot: Path | None) -> Path | None:
    if facts is None or facts.is_embedding:
        return None
    return pair_projector(path, embedding_length=facts.embedding_length, snapshot=snapshot)


def _maybe_diffusion(got: GGUFFacts | GGUFProblem) -> bool:
    """Whether a header read says "look closer": a diffusion architecture, or none at all (sd.cpp's own
    conversions have no general.architecture). Only those pay for the tensor-name check."""
    if isinstance(got, GGUFFacts):
        return got.architecture in DIFFUSION_ARCHS
    return "general.architecture" in got.reason


def _tree_files(folder: Path, location: Path, sha: Callable[[Path], str | None]) -> tuple[FileInfo, ...]:
    out = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if (f := file_info(p, location, sha256=sha(p))) is not None:
                out.append(f)
    return tuple(out)


def other_entry(
    model_id: str,
    fmt: ModelFormat,
    *,
    source: str,
    location: Path,
    sha: Callable[[Path], str | None] = lambda _p: None,
    origin: Origin | None = None,
) -> ModelEntry:
    """An entry for a non-GGUF model (listed with its format and kind; no lane runs it yet)."""
    if fmt.path.is_dir():
        files = _tree_files(fmt.path, location, sha)
    else:
        files = tuple(f for p in fmt.files or (fmt.path,) if (f := file_info(p, location, sha256=sha(p))))
    return ModelEntry(
        model_id,
        fmt.path,
        None,
        fmt.problem,
        format=fmt.kind.value,
        kind_name=KIND_OF_FORMAT.get(fmt.kind, "unknown"),
        source=source,
        location=location,
        files=files,
        origin=origin,
        detected=fmt,
    )


def scan_models_dir(root: Path, *, read: ReadGGUF, skip: set[Path]) -> list[ModelEntry]:
    """Every model under `root`; paths in `skip` (registered imports) are left to their import."""
    out: list[ModelEntry] = []
    folders: list[Path] = []
    loose: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        folder_model = here != root and any(m in filenames for m in _FOLDER_MARKERS)
        if folder_model:
            folders.append(here)
            dirnames[:] = []  # a diffusers pipeline's components are not models of their own
        for name in sorted(filenames):
            p = here / name
            low = name.lower()
            if low.endswith(".gguf") and "mmproj" not in low:
                split = split_part(p)
                if (split is None or split[1] == 1) and p not in skip:
                    rel = p.relative_to(root).with_suffix("")
                    stem = split[0] if split else rel.name
                    out.append(
                        gguf_entry(
                            rel.with_name(stem).as_posix(), p, read=read, source="models_dir", location=root
                        )
                    )
            elif low.endswith((".bin", ".onnx")) and p not in skip and not folder_model:
                loose.append(p)
    for folder in folders:
        if folder in skip:
            continue
        fmt = detect_format(folder)
        if fmt.kind in (ModelKind.GGUF, ModelKind.UNKNOWN, ModelKind.MMPROJ):
            continue  # GGUFs are listed file by file above
        out.append(other_entry(folder.relative_to(root).as_posix(), fmt, source="models_dir", location=root))
    for p in loose:
        fmt = detect_format(p)
        if fmt.kind in (ModelKind.WHISPER_GGML, ModelKind.PIPER) and fmt.problem is None:
            loose_id = p.relative_to(root).with_suffix("").as_posix()
            out.append(other_entry(loose_id, fmt, source="models_dir", location=root))
    return out


def _blob_sha(path: Path) -> str | None:
    """An LFS file in the HF cache links to `blobs/<sha256>`; a git file's blob is named by its sha1."""
    name = Path(os.path.realpath(path)).name
    return name if _SHA256.match(name) else None


def scan_hf_cache(cache_dir: Path, *, read: ReadGGUF) -> list[ModelEntry]:
    """The models in the current snapshot (refs/main) of each model repository in the HF cache."""
    from huggingface_hub import scan_cache_dir  # imported here: it is slow to import and rarely needed
    from huggingface_hub.errors import CacheNotFound

    if not cache_dir.is_dir():
        return []
    try:
        info = scan_cache_dir(cache_dir)
    except (CacheNotFound, OSError):
        return []
    out: list[ModelEntry] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revs = sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)
        current = next((r for r in revs if "main" in r.refs), revs[0])
        ref = "main" if "main" in current.refs else (sorted(current.refs)[0] if current.refs else None)
        origin = Origin(
            repo=repo.repo_id,
            revision=ref,
            commit=current.commit_hash,
            snapshot=str(current.snapshot_path),
            history=tuple(r.commit_hash for r in revs if r is not current),
        )
        out.extend(_snapshot_models(repo.repo_id, current.snapshot_path, read=read, origin=origin))
        candidate = next((r for r in revs if CANDIDATE_REF in r.refs and r is not current), None)
        if candidate is not None:  # a gated update under evaluation: served as `<id>@candidate` only
            staged = Origin(
                repo=repo.repo_id,
                revision=CANDIDATE_REF,
                commit=candidate.commit_hash,
                snapshot=str(candidate.snapshot_path),
                history=(),
            )
            out.extend(
                _snapshot_models(
                    repo.repo_id, candidate.snapshot_path, read=read, origin=staged, suffix=CANDIDATE_SUFFIX
                )
            )
    return out


def _snapshot_models(
    repo_id: str, snap: Path, *, read: ReadGGUF, origin: Origin, suffix: str = ""
) -> Iterable[ModelEntry]:
    ggufs = sorted(p for p in snap.rglob("*.gguf") if "mmproj" not in p.name.lower())
    for p in ggufs:
        split = split_part(p)
        if split is not None and split[1] != 1:
            continue
        stem = split[0] if split else p.stem
        yield gguf_entry(
            f"{repo_id}/{stem}{suffix}",
            p,
            read=read,
            source="hf_cache",
            location=snap,
            sha=_blob_sha,
            origin=origin,
            snapshot=snap,
        )
    if ggufs:
        return
    fmt = detect_format(snap)
    if fmt.kind not in (ModelKind.UNKNOWN, ModelKind.MMPROJ, ModelKind.GGUF):
        yield other_entry(
            f"{repo_id}{suffix}", fmt, source="hf_cache", location=snap, sha=_blob_sha, origin=origin
        )


def import_entry(model_id: str, location: Path, path: Path, *, source: str, read: ReadGGUF) -> ModelEntry:
    """The entry of a registered import; a vanished or changed import is listed as broken, never dropped."""
    if not path.exists():
        return ModelEntry(
            model_id,
            path,
            None,
            f"the imported model is gone from {path}; import it again or `switchyard rm {model_id}`",
            source=source,
            location=location,
        )
    if path.is_file() and path.suffix.lower() == ".gguf":  # the cached header read, not a full layout
        return gguf_entry(model_id, path, read=read, source=source, location=location)
    fmt = detect_format(path)
    if fmt.kind is ModelKind.GGUF:
        return gguf_entry(model_id, fmt.path, read=read, source=source, location=location)
    return other_entry(model_id, fmt, source=source, location=location)


def starter_entry(starter: StarterModel, *, read: ReadGGUF) -> ModelEntry:
    """The starter model's entry: its GGUF inside the installed package, with the package as its origin."""
    entry = gguf_entry(
        starter.model_id, starter.path, read=read, source="starter", location=starter.path.parent
    )
    return replace(entry, starter=starter)
