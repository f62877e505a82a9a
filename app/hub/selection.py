"""What a pull fetches: the hub's metadata for one commit, and the files a `REPO[:QUANT|:FILE]` names.

Metadata comes from huggingface_hub (`model_info(files_metadata=True)`: the commit, sizes, LFS sha256,
git oids); the transfer itself is ours (app/hub/transfer.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub import HfApi

from app.core.errors import BadRequestError, HubFileNotFoundError
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
    """The files of `repo` at `revision` with sizes and checksums (blocking: run it in a thread)."""
    prepare(config, repo)
    with hub_errors(config, repo=repo):
        info = HfApi(endpoint=config.endpoint, token=token_arg(config)).model_info(
            repo, revision=revision, files_metadata=True
        )
    files: dict[str, FileSpec] = {}
    for s in info.siblings or []:
        lfs = s.lfs
        sha256 = lfs.sha256 if lfs is not None else None
        size = lfs.size if lfs is not None else s.size
        files[s.rfilename] = FileSpec(path=s.rfilename, size=int(size or 0), sha256=sha256, oid=s.blob_id)
    if not info.sha:
        raise HubFileNotFoundError(f"the hub gave no commit for {repo}@{revision}; try again")
    return RepoCommit(repo=repo, commit=info.sha, files=files)


def _projector(projectors: list[RepoFile], quant: str | None) -> RepoFile | None:
    """One vision projector for a choice: the same quantization, else F16, else the smallest."""
    if not projectors:
        return None
    for want in (quant, "F16", "BF16"):
        for p in projectors:
            if want is not None and parse_quant(p.path) == want:
                return p
    return min(projectors, key=lambda p: p.size or 0)


def select(rc: RepoCommit, selector: str | None) -> list[FileSpec]:
    """The files `selector` names: a file path, a quantization (all its parts plus the projector), or,
    with no selector, the one quantization a GGUF repository has, or every file of a non-GGUF one."""
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
            f"`switchyard pull {rc.repo}:{groups.choices[0].name}`",
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
    proj = _projector(groups.projectors, choice.quant)
    if proj is not None and not is_projector(paths[0]):
        paths.append(proj.path)
    return [rc.files[p] for p in paths]
