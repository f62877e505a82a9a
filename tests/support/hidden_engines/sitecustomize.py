"""A machine without some engine, for a child `switchyard serve`
(tests/server/admin/test_first_use_install.py).

With this folder on PYTHONPATH, SWITCHYARD_TEST_HIDE_MODULES="mlx,mlx_lm" and SWITCHYARD_TEST_HIDE_FROM set
to a site-packages folder, that folder is replaced on sys.path by a folder of links to everything in it but
those packages: this interpreter cannot import them, as on a machine where they were never installed. Any
other interpreter (an engine environment made by the install) is left alone.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def _hide() -> None:
    names = {n.strip() for n in os.environ.get("SWITCHYARD_TEST_HIDE_MODULES", "").split(",") if n.strip()}
    source = os.environ.get("SWITCHYARD_TEST_HIDE_FROM")
    if not names or not source or source not in sys.path:
        return
    farm = Path(tempfile.mkdtemp(prefix="sy-hidden-"))
    for entry in os.listdir(source):
        top = entry.split(".", 1)[0].split("-", 1)[0]
        if top in names or entry.endswith(".pth"):
            continue  # the package itself and its dist-info (mlx-0.29.dist-info, mlx_lm-...)
        os.symlink(os.path.join(source, entry), farm / entry)
    sys.path[sys.path.index(source)] = str(farm)


_hide()
