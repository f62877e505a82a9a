"""Write docs/openapi.json: the document of the app `serve` builds, made without starting anything.

    .venv/bin/python -m app.server.openapi_write          # writes docs/openapi.json
    .venv/bin/python -m app.server.openapi_write --check  # exits 1 if the committed copy is stale

Apart from app/server/openapi.py (which the app itself serves at GET /openapi.json), so that building the
app and describing it do not import each other.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.server.app import make_app
from app.server.openapi import DOC_PATH, document, render


def generate() -> str:
    """The document of the app `serve` builds, made without starting anything (in a scratch home)."""
    with tempfile.TemporaryDirectory(prefix="switchyard-openapi-") as home:
        return render(document(make_app(Runtime(settings=Settings(), paths=Paths(home=Path(home))))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m app.server.openapi_write", description="Write docs/openapi.json."
    )
    ap.add_argument("path", nargs="?", type=Path, default=DOC_PATH)
    ap.add_argument("--check", action="store_true", help="exit 1 if the file differs from the generated one")
    args = ap.parse_args(argv)
    text = generate()
    if args.check:
        current = args.path.read_text(encoding="utf-8") if args.path.exists() else ""
        if current != text:
            print(f"{args.path} is stale; run: python -m app.server.openapi_write", file=sys.stderr)
            return 1
        return 0
    args.path.write_text(text, encoding="utf-8")
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
