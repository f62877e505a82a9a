"""Search and model detail through `huggingface_hub.HfApi`, with errors that say what to do.

Every call takes the endpoint, token and proxy from a HubConfig made at call time (app.hub.config), fails
fast with "offline" in offline mode, and never lets huggingface_hub fall back to a token of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import Any

from huggingface_hub import HfApi, ModelInfo

from app.core.errors import BadRequestError, HubAuthError, HubGatedError
from app.hub import client, safe_names
from app.hub.config import HubConfig
from app.hub.errors import hub_errors
from app.hub.quant import GGUFGroups, RepoFile, group_gguf_files
from app.hub.range_reader import RangeReader

# --format NAME -> the hub tag or library name that filter matches
FORMAT_FILTERS = {
    "gguf": "gguf",
    "mlx": "mlx",
    "safetensors": "safetensors",
    "diffusers": "diffusers",
    "whisper": "whisper",
    "piper": "piper",
}
# --sort NAME -> the hub's `sort` query value on /api/models (always descending)
SORTS = {
    "downloads": "downloads",
    "likes": "likes",
    "updated": "lastModified",
    "created": "createdAt",
    "trending": "trendingScore",
}
MAX_PAGE_SIZE = 100
MAX_PAGES = 100  # page K asks the hub for K * size results; deeper pages need a narrower query
CARD_LIMIT = 512 * 1024
_FRONT_MATTER = re.compile(r"\A\ufeff?---[ \t]*\r?\n.*?\r?\n---[ \t]*(\r?\n|\Z)", re.DOTALL)
_LICENSE_LINE = re.compile(r"^license:[ \t]*(\S+)[ \t]*$", re.MULTILINE)
_LISTED_ID = re.compile(r"[A-Za-z0-9_][\w.-]*(/[\w.-]+)?")
check_repo_id = safe_names.check_repo_id


def _listed(repo_id: object) -> bool:
    """A search hit's id is shown and offered for a pull: a hostile one (control characters, `..`) is
    left out. Legacy ids without an owner (`gpt2`) stay."""
    return isinstance(repo_id, str) and bool(_LISTED_ID.fullmatch(repo_id)) and ".." not in repo_id


def _repo_file(repo: str, sibling: Any) -> RepoFile:
    """One file of a detail answer, its name and sha256 checked (they become local names later)."""
    path = safe_names.check_file_name(repo, sibling.rfilename)
    lfs = sibling.lfs
    sha256 = safe_names.check_sha256(repo, lfs.sha256, path=path) if lfs is not None else None
    return RepoFile(path, sibling.size, sha256)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def formats_of(tags: list[str], paths: list[str] | None = None, library: str | None = None) -> list[str]:
    """The model formats a repository offers, from its tags, library name and (where known) file names."""
    found: set[str] = {name for name, tag in FORMAT_FILTERS.items() if tag in tags or tag == library}
    for p in paths or ():
        low = p.lower()
        if low.endswith(".gguf"):
            found.add("gguf")
        elif low.endswith(".safetensors"):
            found.add("safetensors")
        elif low.rsplit("/", 1)[-1] == "model_index.json":
            found.add("diffusers")
        elif low.endswith(".onnx.json"):
            found.add("piper")
    return sorted(found)


@dataclass(frozen=True)
class SearchHit:
    id: str
    author: str | None
    downloads: int | None
    likes: int | None
    tags: list[str]
    library: str | None
    pipeline_tag: str | None
    last_modified: str | None
    gated: str | bool | None
    private: bool | None

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "author": self.author,
            "downloads": self.downloads,
            "likes": self.likes,
            "formats": formats_of(self.tags, library=self.library),
            "tags": self.tags,
            "library": self.library,
            "pipeline_tag": self.pipeline_tag,
            "last_modified": self.last_modified,
            "gated": self.gated,
            "private": self.private,
        }


@dataclass(frozen=True)
class SearchQuery:
    text: str | None = None
    format: str | None = None
    sort: str = "downloads"
    author: str | None = None
    page: int = 1
    size: int = 20

    def check(self) -> SearchQuery:
        if self.format is not None and self.format not in FORMAT_FILTERS:
            raise BadRequestError(
                f"unknown format {self.format!r}; use one of {', '.join(FORMAT_FILTERS)}", param="format"
            )
        if self.sort not in SORTS:
            raise BadRequestError(f"unknown sort {self.sort!r}; use one of {', '.join(SORTS)}", param="sort")
        if not 1 <= self.size <= MAX_PAGE_SIZE:
            raise BadRequestError(f"page size must be 1-{MAX_PAGE_SIZE}, got {self.size}", param="limit")
        if not 1 <= self.page <= MAX_PAGES:
            raise BadRequestError(
                f"page must be 1-{MAX_PAGES}, got {self.page}; narrow the query to see further", param="page"
            )
        return self

    def public(self) -> dict[str, Any]:
        return {
            "query": self.text,
            "format": self.format,
            "sort": self.sort,
            "author": self.author,
            "page": self.page,
            "limit": self.size,
        }


@dataclass(frozen=True)
class SearchPage:
    query: SearchQuery
    hits: list[SearchHit]
    next_page: int | None  # pass back as `page` for more; None: this was the last page

    def public(self) -> dict[str, Any]:
        return {
            **self.query.public(),
            "models": [h.public() for h in self.hits],
            "next_page": self.next_page,
        }


@dataclass
class ModelDetail:
    id: str
    commit: str
    author: str | None
    gated: str | bool | None
    private: bool | None
    license: str | None
    tags: list[str]
    library: str | None
    pipeline_tag: str | None
    downloads: int | None
    likes: int | None
    last_modified: str | None
    files: list[RepoFile]
    gguf: GGUFGroups
    card: str | None = None
    card_truncated: bool = False
    card_problem: str | None = None
    fit: dict[str, Any] | None = None  # filled in by app.advice.hub_fit
    fit_problem: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def formats(self) -> list[str]:
        return formats_of(self.tags, [f.path for f in self.files], self.library)

    @property
    def size(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "commit": self.commit,
            "author": self.author,
            "gated": self.gated,
            "private": self.private,
            "license": self.license,
            "formats": self.formats,
            "tags": self.tags,
            "library": self.library,
            "pipeline_tag": self.pipeline_tag,
            "downloads": self.downloads,
            "likes": self.likes,
            "last_modified": self.last_modified,
            "size": self.size,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
            "quantizations": [c.public() for c in self.gguf.choices],
            "projectors": [
                {"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.gguf.projectors
            ],
            "card": self.card,
            "card_truncated": self.card_truncated,
            "card_problem": self.card_problem,
            "fit": self.fit,
            "fit_problem": self.fit_problem,
            **self.extra,
        }


def strip_front_matter(text: str) -> str:
    """The card without its YAML front matter (the metadata block between --- lines at the top)."""
    return _FRONT_MATTER.sub("", text, count=1).lstrip("\r\n")


def _license(info: Any) -> str | None:
    card = getattr(info, "card_data", None)
    value = card.get("license") if card is not None else None
    if isinstance(value, str):
        return value
    for tag in info.tags or []:
        if tag.startswith("license:"):
            return str(tag.split(":", 1)[1])
    return None


class HubClient:
    """Search, detail and whoami for one HubConfig (make a new one when the settings or token change)."""

    def __init__(self, config: HubConfig, reader: RangeReader) -> None:
        self.config = config
        self.reader = reader
        self.api = HfApi(endpoint=config.endpoint, token=client.token_arg(config), library_name="switchyard")

    def search(self, query: SearchQuery) -> SearchPage:
        q = query.check()
        client.prepare(self.config, "a search")
        skip = (q.page - 1) * q.size
        params: dict[str, Any] = {"sort": SORTS[q.sort], "limit": skip + q.size + 1}  # +1: a next page?
        for key, value in (("search", q.text), ("author", q.author)):
            if value:
                params[key] = value
        if q.format:
            params["filter"] = FORMAT_FILTERS[q.format]
        # not HfApi.list_models: it retries a dead hub for ~24 s; quick_pages fails in seconds
        with hub_errors(self.config):
            items = client.quick_pages(self.config, f"{self.config.endpoint}/api/models", params=params)
            window = [ModelInfo(**{"siblings": None, **m}) for m in islice(items, skip, skip + q.size + 1)]
        hits = [
            SearchHit(
                id=m.id,
                author=m.author or m.id.split("/", 1)[0],
                downloads=m.downloads,
                likes=m.likes,
                tags=list(m.tags or []),
                library=m.library_name,
                pipeline_tag=m.pipeline_tag,
                last_modified=_iso(m.last_modified),
                gated=m.gated,
                private=m.private,
            )
            for m in window[: q.size]
            if _listed(m.id)
        ]
        more = len(window) > q.size and q.page < MAX_PAGES
        return SearchPage(q, hits, q.page + 1 if more else None)

    def detail(self, repo: str, *, revision: str | None = None, card: bool = True) -> ModelDetail:
        check_repo_id(repo)
        client.prepare(self.config, repo)
        with hub_errors(self.config, repo=repo):
            info = self.api.model_info(
                repo, revision=revision, files_metadata=True, token=client.token_arg(self.config)
            )
        files = [_repo_file(repo, s) for s in info.siblings or []]
        detail = ModelDetail(
            id=safe_names.check_answered_repo(repo, info.id),
            commit=safe_names.check_commit(repo, info.sha) if info.sha else (revision or "main"),
            author=info.author or info.id.split("/", 1)[0],
            gated=info.gated,
            private=info.private,
            license=_license(info),
            tags=list(info.tags or []),
            library=info.library_name,
            pipeline_tag=info.pipeline_tag,
            downloads=info.downloads,
            likes=info.likes,
            last_modified=_iso(info.last_modified),
            files=files,
            gguf=group_gguf_files(files),
        )
        if card:
            self._card(detail)
        return detail

    def _card(self, detail: ModelDetail) -> None:
        if not any(f.path == "README.md" for f in detail.files):
            detail.card_problem = "the repository has no README.md"
            return
        try:
            data, truncated = self.reader.small_file(detail.id, detail.commit, "README.md", limit=CARD_LIMIT)
        except (HubGatedError, HubAuthError) as exc:
            detail.card_problem = exc.message
            return
        text = data.decode("utf-8", errors="replace")
        detail.card = strip_front_matter(text)
        detail.card_truncated = truncated
        if detail.license is None:  # the hub parses the front matter into cardData; a mirror may not
            front = _FRONT_MATTER.match(text)
            found = _LICENSE_LINE.search(front.group(0)) if front else None
            detail.license = found.group(1).strip("'\"") if found else None

    def whoami(self) -> dict[str, Any] | None:
        """The account the token belongs to; None without a token. Raises HubAuthError when rejected."""
        if self.config.token is None:
            return None
        client.prepare(self.config, "the token's account")
        with hub_errors(self.config):
            return dict(self.api.whoami(token=self.config.token.reveal()))
