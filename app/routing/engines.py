"""The lanes as people read them: display names, what each runs, how to install it, and engine builds.

The lanes themselves (ids, routes, what machine each needs) are app/lanes/engines/facts.py's table; lane ids
are the keys of `installed` and `pins` and never change. Everything here is text for people.
"""

from __future__ import annotations

from app.lanes.engines.facts import LANES, facts_of

__all__ = ["LANES", "build_title", "facts_of", "install_hint", "runs", "title", "titles"]


# the engine builds (app/hardware/build_choice.py) as people read them
_BUILDS = {
    "cpu": "CPU",
    "cuda12": "CUDA 12",
    "cuda13": "CUDA 13",
    "rocm": "ROCm",
    "vulkan": "Vulkan",
    "metal": "Metal",
}


def build_title(build: str | None) -> str:
    """ "CUDA 13 build"; "build unknown" for a binary whose build Switchyard cannot tell."""
    return f"{_BUILDS.get(build, build)} build" if build else "build unknown"


def title(lane: str) -> str:
    return f.title if (f := facts_of(lane)) else lane


def runs(lane: str) -> str:
    return f.runs if (f := facts_of(lane)) else "is not a lane Switchyard knows"


def install_hint(lane: str) -> str:
    return f.install_hint if (f := facts_of(lane)) else f"install {lane}"


def titles(lanes: tuple[str, ...] | list[str], *, joiner: str = "or") -> str:
    """ "vLLM", "SGLang or vLLM", "A, B or C"."""
    names = [title(x) for x in lanes]
    if len(names) <= 1:
        return "".join(names)
    return f"{', '.join(names[:-1])} {joiner} {names[-1]}"
