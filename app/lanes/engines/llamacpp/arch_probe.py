"""Which GGUF architectures a llama.cpp build loads, found out by asking the build itself.

A build is told a GGUF architecture only by trying to load one: llama.cpp reads `general.architecture`
first and stops with "unknown model architecture: 'NAME'" when its revision does not know the name, before
it reads anything else. So a probe file is a GGUF header and nothing more (the architecture and a block
count, no tensors): a build that knows the name gets further and fails on a missing key instead. Nothing
is loaded into memory, and one probe run answers for many names in about a second.

Two kinds of build are probed: a Python interpreter with xllamacpp (its `Server` is asked to start on
each file, in one child process), and a `llama-server` binary (one short run per file; it exits when the
model does not load). A build's answers are kept per build identity (interpreter or binary, version, file
size and time) in `engines/llama.cpp-compat/archs.json`, so each name is asked once per build.

The names asked at registration are `gguf_architectures.txt` (every name seen in the llama.cpp builds
probed so far) and the architectures of the GGUFs in the library; any other name is asked the first time a
model with it is started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from app.core import statefile
from app.core.platform.ports import free_loopback_port

log = logging.getLogger("switchyard.arch_probe")

NAMES_FILE = Path(__file__).with_name("gguf_architectures.txt")
_UNKNOWN = re.compile(r"unknown model architecture: '([^']*)'")
# what a GGUF architecture name may be: what llama.cpp's table spells, nothing that escapes a file name
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
PROBE_TIMEOUT_S = 120.0

# The child run by a Python build: tries each file, says on stdout which it finished. The engine's log
# (where the refusal is named) goes to stderr from a thread of its own, so it is read as a whole after a
# short pause at the end, and a name counts only once its try finished.
_PY_PROBE = """
import sys, time
import xllamacpp as x
for i, path in enumerate(sys.argv[1:]):
    cp = x.CommonParams()
    cp.model.path = path
    cp.n_ctx = 64
    cp.cpuparams.n_threads = 1
    try:
        x.Server(cp)
    except Exception:
        pass
    print("done", i, flush=True)
time.sleep(0.3)
"""


@dataclasses.dataclass(frozen=True)
class Build:
    """One llama.cpp build: `python` (an interpreter that imports xllamacpp) or `llama-server` (a binary)."""

    kind: str  # "python" | "llama-server"
    path: str
    version: str | None = None

    def identity(self) -> str:
        """What the answers are kept under: a rebuilt or replaced binary is a new build."""
        try:
            st = Path(self.path).stat()
            stamp = f"{st.st_size}:{int(st.st_mtime)}"
        except OSError:
            stamp = "missing"
        return f"{self.kind}:{self.path}:{self.version or '-'}:{stamp}"

    def describe(self) -> str:
        if self.kind == "python":
            return f"xllamacpp {self.version or '(version unknown)'} in {self.path}"
        return f"llama-server at {self.path}"


def valid_name(name: str) -> bool:
    return bool(_NAME.match(name))


def known_names() -> tuple[str, ...]:
    """The architecture names asked at registration (one per line; # comments)."""
    lines = NAMES_FILE.read_text(encoding="utf-8").splitlines()
    return tuple(n for n in (ln.split("#", 1)[0].strip() for ln in lines) if n and valid_name(n))


# ---- the probe file -----------------------------------------------------------------------------------
def _gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def write_probe(path: Path, arch: str) -> Path:
    """A GGUF v3 header naming `arch`, with one key more (`<arch>.block_count`) and no tensors."""
    kv = [
        _gguf_string("general.architecture") + struct.pack("<I", 8) + _gguf_string(arch),  # 8: string
        _gguf_string(f"{arch}.block_count") + struct.pack("<I", 4) + struct.pack("<I", 1),  # 4: uint32
    ]
    head = b"GGUF" + struct.pack("<I", 3) + struct.pack("<Q", 0) + struct.pack("<Q", len(kv))
    path.write_bytes(head + b"".join(kv))
    return path


# ---- asking a build -----------------------------------------------------------------------------------
def _verdicts(names: list[str], finished: set[int], log_text: str) -> dict[str, bool]:
    refused = set(_UNKNOWN.findall(log_text))
    return {n: n not in refused for i, n in enumerate(names) if i in finished or n in refused}


def _ask_python(build: Build, names: list[str], files: list[str]) -> dict[str, bool]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHYARD_API", "HF_TOKEN"))}
    env["PYTHONUNBUFFERED"] = "1"
    try:
        done = subprocess.run(
            [build.path, "-c", _PY_PROBE, *files],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=PROBE_TIMEOUT_S,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("probing %s failed: %s", build.describe(), exc)
        return {}
    finished = {int(m) for m in re.findall(r"^done (\d+)$", done.stdout, flags=re.M)}
    if "No module named 'xllamacpp'" in done.stderr:
        log.warning("probing %s: xllamacpp does not import there", build.describe())
        return {}
    return _verdicts(names, finished, done.stderr)


def _ask_binary(build: Build, names: list[str], files: list[str]) -> dict[str, bool]:
    out: dict[str, bool] = {}
    libdir = str(Path(build.path).parent)
    var = "DYLD_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHYARD_API", "HF_TOKEN"))}
    env[var] = f"{libdir}:{env[var]}" if env.get(var) else libdir
    for name, file in zip(names, files, strict=True):
        argv = [
            build.path,
            "-m",
            file,
            "--host",
            "127.0.0.1",
            "--port",
            str(free_loopback_port()),
            "-c",
            "64",
        ]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=30, env=env)
        except subprocess.TimeoutExpired:
            log.warning("probing %s with %s did not end in 30 s; skipped", build.describe(), name)
            continue
        except OSError as exc:
            log.warning("probing %s failed: %s", build.describe(), exc)
            return out
        out.update(_verdicts([name], {0}, done.stdout + done.stderr))
    return out


def ask(build: Build, names: Iterable[str]) -> dict[str, bool]:
    """{name: loads} for each name the build answered about (names it did not are left out)."""
    todo = sorted({n for n in names if valid_name(n)})
    if not todo:
        return {}
    with tempfile.TemporaryDirectory(prefix="switchyard-archs-") as tmp:
        files = [str(write_probe(Path(tmp) / f"{i}.gguf", n)) for i, n in enumerate(todo)]
        if build.kind == "python":
            return _ask_python(build, todo, files)
        return _ask_binary(build, todo, files)


# ---- what was asked before ----------------------------------------------------------------------------
class ArchCache:
    """`archs.json`: per build identity, {"loads": [...], "refuses": [...]}."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def answers(self, build: Build) -> dict[str, bool]:
        data = _tolerant(statefile.read_text(self.path) or "{}", self.path)
        entry = data.get("builds", {}).get(build.identity(), {}) if isinstance(data, dict) else {}
        if not isinstance(entry, dict):
            return {}
        got = {str(n): True for n in entry.get("loads", []) if isinstance(n, str)}
        got.update({str(n): False for n in entry.get("refuses", []) if isinstance(n, str)})
        return got

    def ensure(self, build: Build, names: Iterable[str]) -> dict[str, bool]:
        """The build's answer for every name in `names` (asking it about the ones not asked yet) and the
        answers kept from before."""
        have = self.answers(build)
        missing = [n for n in names if valid_name(n) and n not in have]
        if not missing:
            return have
        fresh = ask(build, missing)
        if fresh:
            self._keep(build, fresh)
            have.update(fresh)
        return have

    def _keep(self, build: Build, fresh: dict[str, bool]) -> None:
        key = build.identity()

        def change(data: Any) -> dict[str, Any]:
            data = data if isinstance(data, dict) else {}
            builds = data.setdefault("builds", {})
            old = builds.get(key) if isinstance(builds.get(key), dict) else {}
            loads = {n for n in old.get("loads", []) if isinstance(n, str)}
            refuses = {n for n in old.get("refuses", []) if isinstance(n, str)}
            for n, ok in fresh.items():
                (loads if ok else refuses).add(n)
                (refuses if ok else loads).discard(n)
            builds[key] = {"describe": build.describe(), "loads": sorted(loads), "refuses": sorted(refuses)}
            return data

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            statefile.update(self.path, change, parse=lambda text: _tolerant(text, self.path))


def _tolerant(text: str, path: Path) -> Any:
    """The parsed file; a damaged one counts as empty (its answers are asked again) and is rewritten."""
    try:
        return json.loads(text)
    except ValueError:
        log.warning("%s is not valid JSON; the builds are asked again", path)
        return {}
