"""Every value from the network that becomes a path is checked here first.

A hub (or a mirror in `hf_endpoint`, or a remote) is not trusted to name files: repository ids, commits,
blob checksums and file names are checked against narrow rules before they are joined to a folder, and
`inside()` checks the resolved result right before a write or a symlink (also against symlinks already
planted in the cache). Anything else is refused with the repository and the value named.

The rules are the strictest of the systems that share the Hugging Face cache (Linux, macOS, Windows), so a
name that passes is one file in the same place everywhere:

- repository id: `owner/name`, letters, digits, `.`, `_`, `-`; no `..` or `--`, nothing leading or
  trailing `.`/`-`, at most 96 characters a part (the hub's own rules; `--` would make the cache folder
  `models--owner--name` ambiguous).
- commit: 40 lowercase hex digits; sha256: 64; git blob id: 40.
- file name: a relative POSIX path of non-empty parts; no `.`/`..` part, no backslash, no drive letter or
  other `:`, none of `<>"|?*`, no control characters, no part ending in `.` or a space (Windows drops
  them: two names would be one file), no reserved device name (`CON`, `nul.txt`, `COM1`...), each part at
  most 255 bytes of UTF-8.
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

from app.core.errors import BadRequestError, CachePathEscapeError, HubUnsafeAnswerError

MAX_PART_BYTES = 255  # NAME_MAX on Linux, macOS and NTFS
MAX_PATH_BYTES = 4096
MAX_REPO_PART = 96
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REPO_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?")
_WINDOWS_FORBIDDEN = frozenset('<>:"|?*\\')
_DEVICE_DIGITS = "0123456789\u00b9\u00b2\u00b3"  # Windows also reserves COM¹..COM³
_RESERVED = frozenset(
    {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"}
    | {f"{dev}{n}" for dev in ("COM", "LPT") for n in _DEVICE_DIGITS}
)


def shown(value: object, limit: int = 80) -> str:
    """A value as a message may quote it: its repr (control characters escaped), cut to `limit`."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def control_problem(text: str) -> str | None:
    """Why `text` cannot be shown or logged as it is (control, format or separator characters)."""
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            return f"it holds the control character {ch!r}"
    return None


def _part_problem(part: str) -> str | None:
    if part in ("", ".", ".."):
        return "it has an empty, '.' or '..' part"
    bad = sorted(set(part) & _WINDOWS_FORBIDDEN)
    if bad:
        return f"it holds {''.join(bad)!r}, which is a path separator, drive or stream marker on some systems"
    if part[-1] in ". ":
        return "a part ends in '.' or a space (Windows drops those: two names would be one file)"
    if part.split(".", 1)[0].rstrip(" ").upper() in _RESERVED:
        return f"{part!r} is a reserved device name on Windows"
    if len(part.encode("utf-8", "surrogatepass")) > MAX_PART_BYTES:
        return f"a part is longer than {MAX_PART_BYTES} bytes"
    return None


def path_problem(name: object) -> str | None:
    """Why `name` is not a safe relative file path in a repository; None when it is."""
    if not isinstance(name, str) or not name:
        return "it is not a non-empty string"
    if (why := control_problem(name)) is not None:
        return why
    if name.startswith("/"):
        return "it is an absolute path"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        return f"it is longer than {MAX_PATH_BYTES} bytes"
    for part in name.split("/"):
        if (why := _part_problem(part)) is not None:
            return why
    return None


def repo_id_problem(repo: object) -> str | None:
    """Why `repo` is not a safe `owner/name` repository id; None when it is."""
    if not isinstance(repo, str):
        return "it is not a string"
    parts = repo.split("/")
    if len(parts) != 2:
        return "it is not owner/name"
    for part in parts:
        if len(part) > MAX_REPO_PART or not _REPO_PART.fullmatch(part) or ".." in part or "--" in part:
            return (
                f"{shown(part)} is not a repository name part (letters, digits, '.', '_', '-'; "
                f"no '..' or '--', at most {MAX_REPO_PART} characters)"
            )
    return None


def revision_problem(revision: object) -> str | None:
    """Why `revision` cannot name a ref file in the cache (a branch, tag, `refs/pr/N` or a commit)."""
    if isinstance(revision, str) and ".." in revision:
        return "it holds '..'"
    if isinstance(revision, str) and len(revision) > MAX_PART_BYTES:
        return f"it is longer than {MAX_PART_BYTES} characters"
    return path_problem(revision)


def _unsafe(repo: str, what: str, value: object, why: str) -> HubUnsafeAnswerError:
    return HubUnsafeAnswerError(
        f"the hub answered something unsafe for {shown(repo)}: {what} {shown(value)} ({why}), so nothing "
        "was written. A broken or hostile hub or mirror sent it: check the `hf_endpoint` setting "
        "(HF_ENDPOINT) and try again later, or report the repository"
    )


def _safe(repo: str, what: str, value: object, why: str | None) -> str:
    """`value` when nothing is wrong with it (`why` is None: its rule's checker took it as a string)."""
    if why is not None:
        raise _unsafe(repo, what, value, why)
    assert isinstance(value, str)
    return value


def check_file_name(repo: str, name: object) -> str:
    """A repository's file name from the hub, unchanged when safe."""
    return _safe(repo, "the file name", name, path_problem(name))


def check_file_part(repo: str, name: object) -> str:
    """One safe file name with no folder part (a local stand-in named after a hub file)."""
    if isinstance(name, str) and "/" in name:
        raise _unsafe(repo, "the file name", name, "it has a folder part where one name was expected")
    return check_file_name(repo, name)


def check_commit(repo: str, commit: object) -> str:
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise _unsafe(repo, "the commit id", commit, "a commit is 40 lowercase hex digits")
    return commit


def check_sha256(repo: str, value: object, *, path: str) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise _unsafe(repo, f"the sha256 of {path}", value, "a sha256 is 64 lowercase hex digits")
    return value


def check_oid(repo: str, value: object, *, path: str) -> str:
    if not isinstance(value, str) or not _COMMIT.fullmatch(value):
        raise _unsafe(repo, f"the git blob id of {path}", value, "a blob id is 40 lowercase hex digits")
    return value


def check_blob_key(repo: str, key: object) -> str:
    """A blob's name in the cache: a sha256 (LFS files) or a git blob id."""
    if not isinstance(key, str) or not (_SHA256.fullmatch(key) or _COMMIT.fullmatch(key)):
        raise _unsafe(repo, "the blob checksum", key, "a checksum is 64 or 40 lowercase hex digits")
    return key


def check_answered_repo(asked: str, answered: object) -> str:
    """The repository id the hub says it answered for (must be a safe id)."""
    return _safe(asked, "the repository id", answered, repo_id_problem(answered))


def check_repo_id(repo: str) -> str:
    """A repository id given by the user (CLI, API): BadRequestError when it is not a safe owner/name."""
    why = repo_id_problem(repo)
    if why is not None:
        raise BadRequestError(
            f"{shown(repo)} is not a Hugging Face repository id ({why}); use owner/name, "
            "e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF",
            param="repo",
        )
    return repo


def check_revision(revision: str) -> str:
    """A branch, tag or commit given by the user; it names a file under `refs/`."""
    why = revision_problem(revision)
    if why is not None:
        raise BadRequestError(
            f"{shown(revision)} is not a usable revision ({why}); give a branch, tag or commit, like main",
            param="revision",
        )
    return revision


def inside(root: Path, target: Path, *, repo: str) -> Path:
    """`target`, once its existing parts are resolved (symlinks followed), still under `root` resolved;
    CachePathEscapeError when it is not. Call it right before writing or linking at `target`."""
    base = os.path.realpath(root)
    real = os.path.realpath(target)
    if os.path.commonpath([base, real]) != base:
        raise CachePathEscapeError(
            f"refusing to write {target} for {shown(repo)}: it resolves to {real}, outside the repository's "
            f"cache folder {base} (a symlink in the cache points out of it, or the hub named an unsafe "
            "path), so nothing was written. Remove the link, or the repository's cache folder, and pull again"
        )
    return target
