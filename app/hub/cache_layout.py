"""Writes into the Hugging Face cache layout, so `scan_cache_dir()` and other tools see what we fetch.

<cache>/models--org--name/
    blobs/<sha256 or git oid>              the bytes, once, however many snapshots use them
    blobs/<key>.incomplete.d/              our resumable partial (state.json, data, lock)
    snapshots/<commit>/<path>              relative symlink to ../../blobs/<key> (a copy without symlinks)
    refs/main                              the commit `main` points at
    refs/switchyard-previous               the commit before the last `switchyard update`
    refs/switchyard-candidate              a gated update's new commit while its eval runs

Every part of a path built here is checked by app.hub.safe_names (a hub's answer is not trusted to name
files), and every write or link is checked to resolve inside the repository's folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from app.hub import safe_names

PREVIOUS_REF = "switchyard-previous"
CANDIDATE_REF = "switchyard-candidate"  # a gated update lands here; main moves only if it passes
ROLLED_BACK_REF = "switchyard-rolled-back"  # the commit a rollback left (a second rollback goes no further)
_SHA1 = re.compile(r"[0-9a-f]{40}")


def repo_folder(cache_dir: Path, repo_id: str, *, repo_type: str = "model") -> Path:
    safe_names.check_repo_id(repo_id)
    return cache_dir / f"{repo_type}s--{repo_id.replace('/', '--')}"


def repo_of(repo_dir: Path) -> str:
    """The repository id a cache folder is for (`models--org--name` -> `org/name`), for messages."""
    return repo_dir.name.split("--", 1)[-1].replace("--", "/")


def blob_path(repo_dir: Path, key: str) -> Path:
    return repo_dir / "blobs" / safe_names.check_blob_key(repo_of(repo_dir), key)


def partial_dir(repo_dir: Path, key: str) -> Path:
    return repo_dir / "blobs" / f"{safe_names.check_blob_key(repo_of(repo_dir), key)}.incomplete.d"


def snapshot_path(repo_dir: Path, commit: str, path: str) -> Path:
    repo = repo_of(repo_dir)
    commit = safe_names.check_commit(repo, commit)
    return repo_dir / "snapshots" / commit / safe_names.check_file_name(repo, path)


def inside_repo(repo_dir: Path, target: Path) -> Path:
    """`target` once checked to resolve inside `repo_dir` (CachePathEscapeError otherwise)."""
    return safe_names.inside(repo_dir, target, repo=repo_of(repo_dir))


def is_commit(revision: str) -> bool:
    return bool(_SHA1.fullmatch(revision))


def write_atomic(path: Path, text: str) -> None:
    """Readers see the old text or the new, never half of either (temp file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; refs and job files are not secrets
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def link_snapshot(repo_dir: Path, commit: str, path: str, key: str) -> Path:
    """Make `snapshots/<commit>/<path>` point at the blob; a relative symlink, else a copy."""
    dest = snapshot_path(repo_dir, commit, path)
    blob = inside_repo(repo_dir, blob_path(repo_dir, key))
    inside_repo(repo_dir, dest.parent)  # before mkdir: a planted symlink must not take it elsewhere
    dest.parent.mkdir(parents=True, exist_ok=True)
    inside_repo(repo_dir, dest.parent)  # and after: a link swapped in meanwhile
    rel = os.path.relpath(blob, dest.parent)
    tmp = dest.with_name(f".{dest.name}.link")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.symlink(rel, tmp)
    except OSError:  # no symlinks here (some Windows set-ups, FAT): a copy, as huggingface_hub does
        shutil.copyfile(blob, tmp)
    os.replace(tmp, dest)
    return dest


def read_ref(repo_dir: Path, name: str) -> str | None:
    """The commit a ref names; None when absent, unreadable, or not a commit (never a path to follow)."""
    safe_names.check_revision(name)
    try:
        value = (repo_dir / "refs" / name).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value if is_commit(value) else None


def write_ref(repo_dir: Path, name: str, commit: str) -> None:
    safe_names.check_revision(name)
    safe_names.check_commit(repo_of(repo_dir), commit)
    write_atomic(inside_repo(repo_dir, repo_dir / "refs" / name), commit)


def snapshot_files(repo_dir: Path, commit: str) -> list[str]:
    """The repository paths present in one snapshot (POSIX separators)."""
    if not is_commit(commit):
        return []
    root = repo_dir / "snapshots" / commit
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.name.startswith("."):
            out.append(p.relative_to(root).as_posix())
    return out


def delete_ref(repo_dir: Path, name: str) -> None:
    safe_names.check_revision(name)
    with contextlib.suppress(FileNotFoundError):
        inside_repo(repo_dir, repo_dir / "refs" / name).unlink()


def discard_snapshot(repo_dir: Path, commit: str) -> int:
    """Delete `snapshots/<commit>` and the blobs no other snapshot links to; the bytes freed. A blob
    another snapshot (the current one, an older one) still uses is kept."""
    safe_names.check_commit(repo_of(repo_dir), commit)
    root = inside_repo(repo_dir, repo_dir / "snapshots" / commit)
    if not root.is_dir():
        return 0
    blobs = (repo_dir / "blobs").resolve()
    used: set[Path] = set()
    for other in (repo_dir / "snapshots").iterdir():
        if other.name != commit and other.is_dir():
            used.update(Path(os.path.realpath(p)) for p in other.rglob("*") if p.is_file())
    freed = 0
    for p in root.rglob("*"):
        target = Path(os.path.realpath(p))
        if p.is_symlink() and target.parent == blobs and target not in used and target.is_file():
            freed += target.stat().st_size
            target.unlink()
    shutil.rmtree(root)
    return freed
