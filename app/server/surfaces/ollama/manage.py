"""Ollama's model management, the pure part: pull names, alias names, create bodies and Modelfiles, and
the progress lines a pull streams. The routes are in manage_routes.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.core.errors import BadRequestError
from app.hub.transfer import FileSpec

LATEST = ":latest"
_HOSTS = ("hf.co/", "huggingface.co/")
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO = re.compile(rf"^{_SEGMENT}/{_SEGMENT}$")
_ALIAS = re.compile(rf"^{_SEGMENT}(?:/{_SEGMENT})*(?::[A-Za-z0-9][A-Za-z0-9._-]*)?$")
PULL_FORM = "hf.co/ORG/REPO[:QUANT] (for example hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M)"
# create fields an alias cannot carry: Switchyard keeps no per-name prompt, template or options
_PER_NAME = ("system", "template", "parameters", "messages", "license")
_BLOBS = ("files", "adapters")


@dataclass(frozen=True)
class PullRef:
    name: str  # as the client will name the model afterwards (`hf.co/org/repo:Q4_K_M`), `:latest` dropped
    repo: str
    quant: str | None


def parse_pull_name(name: str) -> PullRef:
    """`hf.co/org/repo:Q4_K_M` (or `huggingface.co/...`, with or without https://); `:latest` or no tag
    picks the way `switchyard pull org/repo` does."""
    raw = name.strip()
    low = raw.lower()
    for scheme in ("https://", "http://"):
        if low.startswith(scheme):
            raw, low = raw[len(scheme) :], low[len(scheme) :]
    host = next((h for h in _HOSTS if low.startswith(h)), None)
    rest = raw[len(host) :] if host else ""
    repo, _, tag = rest.partition(":")
    if host is None or not _REPO.match(repo):
        raise BadRequestError(
            f"cannot pull {name!r}: only Hugging Face GGUF repositories can be pulled, named as {PULL_FORM}; "
            "Ollama's own registry is not reachable from Switchyard",
            param="model",
        )
    quant = None if tag.lower() in ("", "latest") else tag
    return PullRef(name=f"{host}{repo}" + (f":{quant}" if quant else ""), repo=repo, quant=quant)


def alias_name(name: Any, *, param: str) -> str:
    """A name a new model may take: `name`, `org/name`, with an optional `:tag` (`:latest` is dropped)."""
    if not isinstance(name, str) or not name.strip():
        raise BadRequestError(f"missing required field {param!r} (the new model's name)", param=param)
    out = name.strip()
    if out.lower().endswith(LATEST) and len(out) > len(LATEST):
        out = out[: -len(LATEST)]
    if len(out) > 200 or not _ALIAS.match(out) or any(s in ("..", ".") for s in out.split("/")):
        raise BadRequestError(
            f"{name!r} is not a usable model name: use letters, digits, '.', '_' and '-', with '/' between "
            "parts and an optional ':tag' (like 'my-model' or 'me/my-model:v2')",
            param=param,
        )
    return out


def _given(value: Any) -> bool:
    return value not in (None, "", [], {})


def refuse_unsupported(body: dict[str, Any]) -> None:
    """400 naming the create fields Switchyard cannot honour (it would otherwise drop them silently)."""
    if blobs := [k for k in _BLOBS if _given(body.get(k))]:
        raise BadRequestError(
            f"'{', '.join(blobs)}' name uploaded blobs, which Switchyard does not keep; pull a GGUF with "
            f"POST /api/pull ({PULL_FORM}), import a local file with `switchyard import PATH`, or create "
            'from a file on this machine: {"model": NAME, "from": "/absolute/path/model.gguf"}',
            param=blobs[0],
        )
    if _given(body.get("quantize")):
        raise BadRequestError(
            "Switchyard does not re-quantize models; pull the quantization you want instead "
            "(hf.co/ORG/REPO:Q4_K_M)",
            param="quantize",
        )
    _refuse_per_name([k for k in _PER_NAME if _given(body.get(k))])


def _refuse_per_name(fields: list[str], *, param: str | None = None) -> None:
    if fields:
        raise BadRequestError(
            f"{', '.join(fields)} cannot be kept with a model here: a created model is the same model "
            "under another name, with no prompt, template or options of its own; send a system message "
            "and 'options' with each request instead, and create with 'from' only",
            param=param or fields[0],
        )


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, argument) pairs of a Modelfile; `\"\"\"` blocks are one argument, `#` lines comments."""
    out: list[tuple[str, str]] = []
    lines = iter(text.splitlines())
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        word, _, arg = stripped.partition(" ")
        arg = arg.strip()
        if arg.count('"""') == 1:  # a block that runs over the next lines
            block = [arg]
            for more in lines:
                block.append(more)
                if '"""' in more:
                    break
            arg = "\n".join(block)
        out.append((word.upper(), arg))
    return out


def modelfile_source(text: str) -> str:
    """The FROM of an older client's Modelfile; any other instruction is refused by name."""
    pairs = _instructions(text)
    froms = [arg for word, arg in pairs if word == "FROM"]
    if len(froms) != 1 or not froms[0]:
        raise BadRequestError(
            "the Modelfile needs exactly one FROM line: a model from GET /api/tags, or an absolute path "
            "to a GGUF file on this machine",
            param="modelfile",
        )
    others = sorted({word for word, _ in pairs if word != "FROM"})
    if others:
        _refuse_per_name([f"the Modelfile's {', '.join(others)}"], param="modelfile")
    return froms[0].strip().strip('"')


def is_local_path(source: str) -> bool:
    """A create source that names a file rather than a model."""
    return source.startswith(("/", "./", "../", "~")) or source.lower().endswith(".gguf")


def layer(f: FileSpec, done: int) -> dict[str, Any]:
    """One `pulling <digest>` progress line for a file, Ollama's layer status."""
    digest = f.sha256 or f.oid or ""
    return {
        "status": f"pulling {digest[:12]}",
        "digest": f"sha256:{digest}",
        "total": f.size,
        "completed": min(done, f.size),
    }
