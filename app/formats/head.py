"""The first bytes of a model file, read before anything trusts its format (the magic number, a header)."""

from __future__ import annotations

from pathlib import Path


def file_head(path: Path, n: int, *, named: str | None = None) -> tuple[int, bytes] | str:
    """(size, the first `n` bytes: fewer when the file is shorter), or why there are none to read: the file
    cannot be read, or it is empty (a download that never finished). Messages call it `named` (default:
    its file name)."""
    named = named or path.name
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(n)
    except OSError as exc:
        return f"cannot read {named}: {exc.strerror or exc}"
    if size == 0:
        return f"{named} is empty; download it again"
    return size, head
