"""llama-server's flags for a lane's speculation (issue 16): each n-gram kind's knobs go to its own
`--spec-ngram-<kind>-*` flags, ngram_mod's n_min/n_max to `--spec-ngram-mod-*` (not the draft model's
`--spec-draft-n-*`), and the draft model's to `--spec-draft-*`. The flag names are checked against the
ones the llama.cpp build we ship knows (its `common/arg.cpp`, compiled into the xllamacpp wheel)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from app.lanes.engines.llamacpp.spec import spec_argv
from app.lanes.workers.params import LlamaParams

BASE: dict[str, Any] = dict(
    model_path="m.gguf",
    alias="m",
    ctx_size=512,
    parallel=1,
    threads=1,
    kv_type="f16",
    flash_attn="auto",
    gpu_layers=0,
    embedding=False,
    pooling=None,
)


def params(**kw: Any) -> LlamaParams:
    return LlamaParams(**BASE, **kw)


def pairs(args: list[str]) -> dict[str, str]:
    """`--flag value` pairs (every flag spec_argv writes takes one value, --lora-scaled aside)."""
    return dict(zip(args[0::2], args[1::2], strict=True))


@pytest.mark.parametrize("kind", ["ngram_simple", "ngram_map_k", "ngram_map_k4v"])
def test_an_ngram_map_kind_gets_its_own_size_and_min_hits_flags(kind: str) -> None:
    args = spec_argv(params(spec_type=kind, spec_size_n=6, spec_size_m=24, spec_min_hits=2))
    flag = "--spec-" + kind.replace("_", "-")
    assert pairs(args) == {
        "--spec-type": kind.replace("_", "-"),
        f"{flag}-size-n": "6",
        f"{flag}-size-m": "24",
        f"{flag}-min-hits": "2",  # was dropped
    }


def test_ngram_mod_gets_n_match_and_its_own_n_min_n_max() -> None:
    args = spec_argv(params(spec_type="ngram_mod", spec_n_match=8, spec_n_min=2, spec_n_max=32))
    assert pairs(args) == {
        "--spec-type": "ngram-mod",
        "--spec-ngram-mod-n-match": "8",
        "--spec-ngram-mod-n-min": "2",
        "--spec-ngram-mod-n-max": "32",
    }
    assert not any(a.startswith("--spec-draft") for a in args)


def test_a_draft_model_gets_the_draft_flags_and_its_layers() -> None:
    p = params(
        spec_type="draft_simple",
        spec_n_max=8,
        spec_n_min=1,
        spec_p_min=0.5,
        draft_path="d.gguf",
        draft_gpu_layers=99,
        lora_paths=("a.gguf",),
        lora_scales=(0.5,),
    )
    args = spec_argv(p)
    assert args[-3:] == ["--lora-scaled", "a.gguf", "0.5"]
    assert pairs(args[:-3]) == {
        "--spec-type": "draft-simple",
        "--spec-draft-n-max": "8",
        "--spec-draft-n-min": "1",
        "--spec-draft-p-min": "0.5",
        "--spec-draft-model": "d.gguf",
        "--spec-draft-ngl": "99",
    }


def test_unset_knobs_and_off_write_nothing() -> None:
    assert spec_argv(params()) == []
    assert spec_argv(params(spec_type="ngram_cache")) == ["--spec-type", "ngram-cache"]
    assert spec_argv(params(spec_type="ngram_mod", spec_n_max=16)) == [
        "--spec-type",
        "ngram-mod",
        "--spec-ngram-mod-n-max",
        "16",
    ]


def _engine_flags() -> set[str]:
    """The `--spec-*` words compiled into the xllamacpp wheel (llama.cpp's common/arg.cpp)."""
    spec = importlib.util.find_spec("xllamacpp")
    if spec is None or spec.origin is None:
        pytest.skip("the xllamacpp wheel is not installed")
    data = b"".join(p.read_bytes() for p in Path(spec.origin).parent.glob("*.so"))
    return {w.decode() for w in re.findall(rb"--spec-[a-z0-9-]+", data)}


def test_every_flag_written_is_one_the_engine_knows() -> None:
    known = _engine_flags()
    written = set()
    for kind in ("ngram_simple", "ngram_map_k", "ngram_map_k4v"):
        written |= set(spec_argv(params(spec_type=kind, spec_size_n=1, spec_size_m=1, spec_min_hits=1)))
    written |= set(spec_argv(params(spec_type="ngram_mod", spec_n_match=1, spec_n_min=0, spec_n_max=1)))
    draft = params(spec_type="draft_simple", spec_n_max=1, spec_n_min=0, spec_p_min=0.1, draft_path="d")
    written |= set(spec_argv(draft))
    flags = {w for w in written if w.startswith("--spec-")}
    assert len(flags) == 18 and flags <= known, sorted(flags - known)
