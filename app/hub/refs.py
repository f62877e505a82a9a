"""`owner/name:SELECTOR`: how the CLI, the admin API and the window name a repository and, optionally, one
quantization (or file) in it. Split in one place so `pull`, `show` and POST /api/downloads agree."""

from __future__ import annotations

from app.core.errors import BadRequestError

FORM = "owner/name or owner/name:QUANT, e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M"


def split_ref(ref: str, *, param: str = "repo") -> tuple[str, str | None]:
    """`org/name:Q4_K_M` -> ("org/name", "Q4_K_M"); `org/name` and `org/name:` -> ("org/name", None).

    Only the shape is checked here (a repository part, at most one ':'); whether the repository id is a
    safe one is app.hub.safe_names.check_repo_id's job."""
    repo, sep, selector = ref.strip().partition(":")
    repo, selector = repo.strip(), selector.strip()
    if not repo:
        raise BadRequestError(f"{ref!r} names no repository; give {FORM}", param=param)
    if ":" in selector:
        raise BadRequestError(f"{ref!r} has more than one ':'; give {FORM}", param=param)
    return repo, (selector or None) if sep else None
