"""Which engines are installed here, at what version, and which of them Switchyard can drive today."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil

from app.core.errors import EngineUnavailableError
from app.core.settings import Settings
from app.lanes.llamacpp import choose_runtime, find_llama_server
from app.routing import LANES, LaneInstall

# lane -> (python module, distribution) or a binary name; lanes Switchyard can start are in RUNNABLE
_PROBES: dict[str, tuple[str, str] | str] = {
    "mistral.rs": ("mistralrs", "mistralrs"),
    "mlx": ("mlx_lm", "mlx-lm"),
    "vllm": ("vllm", "vllm"),
    "sglang": ("sglang", "sglang"),
    "sd.cpp": "sd-server",
    "whisper.cpp": ("pywhispercpp", "pywhispercpp"),
    "piper": ("piper", "piper-tts"),
}
RUNNABLE = frozenset({"llama.cpp"})


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_lanes(settings: Settings) -> dict[str, LaneInstall]:
    out: dict[str, LaneInstall] = {}
    try:
        runtime = choose_runtime(settings)  # the same choice a lane start makes, `runtime` setting included
    except EngineUnavailableError as exc:
        out["llama.cpp"] = LaneInstall("llama.cpp", False, None, note=exc.message)
    else:
        if runtime == "xllamacpp":
            out["llama.cpp"] = LaneInstall("llama.cpp", True, f"xllamacpp {_dist_version('xllamacpp')}")
        else:
            out["llama.cpp"] = LaneInstall(
                "llama.cpp", True, f"llama-server at {find_llama_server(settings)}"
            )
    for lane in LANES:
        if lane in out:
            continue
        probe = _PROBES.get(lane)
        found: str | None = None
        if isinstance(probe, tuple):
            if importlib.util.find_spec(probe[0]) is not None:
                found = f"{probe[1]} {_dist_version(probe[1]) or '(version unknown)'}"
        elif probe is not None and (path := shutil.which(probe)):
            found = f"{probe} at {path}"
        if found and lane not in RUNNABLE:
            # the engine is here, but this Switchyard version cannot drive it yet
            note = f"{found} is installed, but Switchyard has no {lane} lane yet"
            out[lane] = LaneInstall(lane, False, found, note=note)
        else:
            out[lane] = LaneInstall(
                lane, False, None, note=f"Switchyard has no {lane} lane yet; it is planned"
            )
    return out
