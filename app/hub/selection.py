"""What a pull fetches: the hub's metadata for one commit, and the files a `REPO[:QUANT|:FILE]` names.

Metadata comes from huggingface_hub (`model_info(files_metadata=True)`: the commit, sizes, LFS sha256,
git oids); the transfer itself is ours (app/hub/transfer.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from huggingface_hub import HfApi

from app.core.errors import BadRequestError, HubFileNotFoundError, HubUnsafeAnswerError
from app.hub import safe_names
from app.hub.client import prepare, token_arg
from app.hub.config import HubConfig
from app.hub.errors import hub_errors
from app.hub.quant import RepoFile, group_gguf_files, is_projector, parse_quant, pick
from app.hub.transfer import FileSpec


@dataclass(frozen=True)
class RepoCommit:
    repo: str
    commit: str
    files: dict[str, FileSpec]


def fetch_commit(config: HubConfig, repo: str, revision: str = "main") -> RepoCommit:
    """The files of `repo` at `revision` with sizes and checksums (blocking: run it in a thread). Every
    name and checksum the hub answers is checked before it can become a path (HubUnsafeAnswerError)."""
    safe_names.check_repo_id(repo)
    safe_names.check_revision(revision)
    prepare(config, repo)
    with hub_errors(config, repo=repo):
        info = HfApi(endpoint=config.endpoint, token=token_arg(config)).model_info(
            repo, revision=revision, files_metadata=True
        )
    if not info.sha:
        raise HubFileNotFoundError(f"the hub gave no commit for {repo}@{revision}; try again")
    commit = safe_names.check_commit(repo, info.sha)
    files: dict[str, FileSpec] = {}
    for s in info.siblings or []:
        spec = _file_spec(repo, s.rfilename, s.size, s.lfs, s.blob_id)
        files[spec.path] = spec
    return RepoCommit(repo=repo, commit=commit, files=files)


def _file_spec(repo: str, name: object, size: object, lfs: object, oid: object) -> FileSpec:
    """One sibling of the hub's answer, every value checked."""
    path = safe_names.check_file_name(repo, name)
    sha256 = getattr(lfs, "sha256", None) if lfs is not None else None
    if lfs is not None:
        sha256 = safe_names.check_sha256(repo, sha256, path=path)
        size = getattr(lfs, "size", None)
    if oid is not None:
        oid = safe_names.check_oid(repo, oid, path=path)
    if size is None:
        size = 0
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise HubUnsafeAnswerError(
            f"the hub answered an impossible size {safe_names.shown(size)} for {path} in {repo}, so nothing "
            "was written; check the `hf_endpoint` setting (HF_ENDPOINT) and try again later"
        )
    return FileSpec(path=path, size=size, sha256=sha256, oid=oid if isinstance(oid, str) else None)


def _projector(projectors: list[RepoFile], repo: str, mmproj: str | None) -> RepoFile | None:
    """The vision projector pulled beside a quantization: the one `mmproj` names (a path or a file name;
    "none" for no projector), else the F16 one (projectors are small, and F16 loses nothing), else BF16,
    else the smallest."""
    if mmproj is not None:
        if mmproj.strip().lower() == "none":
            return None
        for p in projectors:
            if mmproj in (p.path, PurePosixPath(p.path).name):
                return p
        have = ", ".join(p.path for p in projectors) or "none"
        raise HubFileNotFoundError(
            f"{repo} has no projector {mmproj!r}; its projectors: {have}", param="mmproj"
        )
    if not projectors:
        return None
    for want in ("F16", "BF16"):
        for p in projectors:
            if parse_quant(p.path) == want:
                return p
    return min(projectors, key=lambda p: p.size or 0)


def pulled_projector(projectors: list[RepoFile], repo: str) -> RepoFile | None:
    """The projector a plain pull of a quantization fetches beside it (for sizes shown before a pull)."""
    return _projector(projectors, repo, None)


def cli_pull(repo: str, quant: str) -> str:
    return f"`switchyard pull {repo}:{quant}`"


def select(
    rc: RepoCommit,
    selector: str | None,
    *,
    mmproj: str | None = None,
    spell: Callable[[str, str], str] = cli_pull,
) -> list[FileSpec]:
    """The files `selector` names: a file path, a quantization (all its parts plus the projector), or,
    with no selector, the one quantization a GGUF repository has, or every file of a non-GGUF one.
    `mmproj` names the projector to pull with a quantization (`pull --mmproj FILE`; "none": none).
    `spell(repo, quant)`: how the caller's user names a quantization (an Ollama client: hf.co/REPO:Q)."""
    if selector and selector in rc.files:
        return [rc.files[selector]]
    repo_files = [RepoFile(f.path, f.size, f.sha256) for f in rc.files.values()]
    groups = group_gguf_files(repo_files)
    names = ", ".join(c.name for c in groups.choices)
    if selector:
        choice = pick(groups, selector)
        if choice is None:
            hint = f"its quantizations: {names}" if names else f"its files: {', '.join(sorted(rc.files))}"
            raise HubFileNotFoundError(f"{rc.repo} has no {selector!r}; {hint}", param="quant")
    elif len(groups.choices) == 1:
        choice = groups.choices[0]
    elif groups.choices:
        raise BadRequestError(
            f"{rc.repo} has {len(groups.choices)} quantizations ({names}); name one: "
            f"{spell(rc.repo, groups.choices[0].name)}",
            param="quant",
        )
    else:
        return [f for f in rc.files.values() if not f.path.startswith(".")]
    if not choice.complete:
        raise HubFileNotFoundError(
            f"{rc.repo}:{choice.name} is incomplete on the hub ({len(choice.files)} of "
            f"{choice.parts_expected} parts); pick another quantization"
        )
    paths = [f.path for f in choice.files]
    proj = _projector(groups.projectors, rc.repo, mmproj)
    if proj is not None and not is_projector(paths[0]):
        paths.append(proj.path)
    return [rc.files[p] for p in paths]
