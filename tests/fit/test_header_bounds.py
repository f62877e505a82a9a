"""GGUF header values attacked on purpose (issue 33): a header declaring a trained context of 2^32-1 tokens
once made the server plan a 41-million-token context and start an engine that grew past 4 GiB. Such a
value is refused before anything starts, with the numbers, and the automatic window is bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.errors import ModelBrokenError
from app.core.settings import Settings
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, read_gguf
from app.hardware.model import Bandwidth, CPUInfo, Hardware, MemoryInfo
from app.lanes.engines.llamacpp.kind import MAX_AUTO_SLOT_CTX, fit_for, plan_params, requested_ctx
from app.library.model import ModelEntry
from tests.support.tinymodels import TinySpec, write_tiny_gguf

GIB = 1 << 30


def _entry(tmp_path: Path, trained: int) -> ModelEntry:
    path = write_tiny_gguf(tmp_path / f"ctx-{trained}.gguf", TinySpec(n_ctx_train=trained))
    facts = read_gguf(path)
    assert isinstance(facts, GGUFFacts) and facts.context_length == trained
    return ModelEntry("hostile", path, facts, None, (path,))


def _machine() -> Hardware:
    """This kind of machine: 24 GiB, 2 cores, no GPU."""
    return Hardware(
        os="linux",
        arch="x86_64",
        cpu=CPUInfo(
            model_name="test cpu",
            physical_cores=2,
            logical_cores=2,
            usable_cores=2,
            cgroup_quota_cores=None,
            flags=("avx2",),
        ),
        memory=MemoryInfo(total=24 * GIB, available=20 * GIB, swap_total=0, swap_free=0, cgroup_limit=None),
        gpus=(),
        engine_devices=(),
        bandwidth=Bandwidth(single_core=20 * GIB, all_cores=40 * GIB, threads=2, measured_at=0.0),
    )


def test_a_trained_context_no_model_has_is_refused_with_the_numbers(tmp_path: Path) -> None:
    entry = _entry(tmp_path, 2**32 - 1)
    report = fit_for(entry, Settings(), hardware=_machine())
    assert isinstance(report, GGUFProblem) and "4294967295" in report.reason and "ctx_size" in report.reason
    with pytest.raises(ModelBrokenError, match="4294967295 tokens") as e:
        plan_params(entry, Settings())  # what a start without a plan runs: refused before any engine
    assert e.value.status == 422
    chosen = Settings.flat(
        model_overrides={"hostile": {"ctx_size": 1024}}
    )  # the user's own window still works
    assert requested_ctx(entry, chosen) == (1024, False)
    assert plan_params(entry, chosen).ctx_size == 1024


def test_the_automatic_window_is_bounded(tmp_path: Path) -> None:
    entry = _entry(tmp_path, 1 << 23)  # plausible, and far more than a tiny model's memory plan would cut
    ctx, auto = requested_ctx(entry, Settings.flat(parallel=2))
    assert auto and ctx == MAX_AUTO_SLOT_CTX * 2
