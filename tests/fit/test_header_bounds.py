"""GGUF header values attacked on purpose (issue 33): a header declaring a trained context of 2^32-1 tokens
once made the server plan a 41-million-token context and start an engine that grew past 4 GiB. Such a
value is refused before anything starts, with the numbers, and the automatic window is bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.errors import ModelBrokenError
from app.core.settings import Settings
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, read_gguf
from app.lanes.engines.llamacpp.kind import MAX_AUTO_SLOT_CTX, fit_for, plan_params, requested_ctx
from app.library.model import ModelEntry
from tests.support.machines import machine
from tests.support.tinymodels import TinySpec, write_tiny_gguf

GIB = 1 << 30
# this kind of machine: 24 GiB (20 available), 2 cores, no GPU
THIS_MACHINE = machine(ram_gib=24, available_gib=20, cores=2, threads=2, all_cores_gib=40)


def _entry(tmp_path: Path, trained: int) -> ModelEntry:
    path = write_tiny_gguf(tmp_path / f"ctx-{trained}.gguf", TinySpec(n_ctx_train=trained))
    facts = read_gguf(path)
    assert isinstance(facts, GGUFFacts) and facts.context_length == trained
    return ModelEntry("hostile", path, facts, None, (path,))


def test_a_trained_context_no_model_has_is_refused_with_the_numbers(tmp_path: Path) -> None:
    entry = _entry(tmp_path, 2**32 - 1)
    report = fit_for(entry, Settings(), hardware=THIS_MACHINE)
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
