"""The engine list asks a kind that knows its own build (app/lanes/engines/kind.py KnowsOwnBuild) instead of
naming it: llama.cpp reports its runtime choice's build, a registered capability build an unknown one, and
every other engine the manifest's build for this machine's probe."""

from __future__ import annotations

from app.core.settings import Settings
from app.lanes.engines.kind import FoundByRegistration, KnowsOwnBuild
from app.lanes.engines.registry import KINDS
from app.lanes.install.listing import build_fields
from app.lanes.install.runtimes import choose_runtime
from tests.lanes.install.test_builds import XEON
from tests.lanes.install.test_runtimes_build import H200

LLAMA_CPP = "llama.cpp"
LLAMA_CPP_COMPAT = "llama.cpp-compat"


def test_the_llamacpp_kinds_know_their_own_build() -> None:
    assert [k.lane for k in KINDS if isinstance(k, KnowsOwnBuild)] == [LLAMA_CPP, LLAMA_CPP_COMPAT]
    assert [k.lane for k in KINDS if isinstance(k, FoundByRegistration)] == [LLAMA_CPP_COMPAT]


def test_the_engine_list_takes_the_kinds_word_for_its_build() -> None:
    settings = Settings()
    for hw in (XEON, H200):
        choice = choose_runtime(settings, hw)
        assert build_fields(LLAMA_CPP, settings, hw) == {
            "build": choice.build,
            "build_why": choice.why,
            "runtime": choice.runtime,
        }
        compat = build_fields(LLAMA_CPP_COMPAT, settings, hw)
        assert (compat["build"], compat["runtime"]) == (None, None)
        assert "cannot tell" in compat["build_why"]
    # an engine without its own word is the probe's: a CUDA card picks a CUDA build of vLLM
    assert build_fields("vllm", settings, H200)["build"] != build_fields("vllm", settings, XEON)["build"]
