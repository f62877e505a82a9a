"""Issue 32 item 4: an automatic context leaves the machine usable. A 24 GiB machine with 3.5 GiB in use
and a model whose trained window would take far more KV cache than there is RAM: the automatic context is
cut so that 15 % of the machine stays free (not the last 64 MiB), and the plan says what it left; an
explicit context may still use that room, since the user asked for it."""

from __future__ import annotations

import dataclasses

import pytest

from app.fit.memory import FitParams
from app.fit.plan import AUTO_RESERVE_FRACTION, GIB, Budget, plan_placements
from app.formats.gguf_layout import GGUFLayout, read_gguf_layout
from app.hardware.model import MemoryInfo
from tests.support.machines import machine
from tests.support.tinymodels import LARGE, write_tiny_gguf

TOTAL = 24 * GIB
AVAILABLE = int(20.5 * GIB)


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> GGUFLayout:
    lay = read_gguf_layout(write_tiny_gguf(tmp_path_factory.mktemp("lay") / "large.gguf", LARGE))
    assert isinstance(lay, GGUFLayout)
    return lay


def busy_machine() -> object:
    hw = machine(ram_gib=24)
    mem = MemoryInfo(total=TOTAL, available=AVAILABLE, swap_total=0, swap_free=0, cgroup_limit=None)
    return dataclasses.replace(hw, memory=mem)


def cpu_use(report: object) -> int:
    chosen = report.chosen  # type: ignore[attr-defined]
    assert chosen is not None
    return sum(d.total for d in chosen.devices if d.device == "CPU")


def test_automatic_context_leaves_a_reserve_and_says_so(layout: GGUFLayout) -> None:
    hw = busy_machine()
    asked = FitParams(ctx_size=8_000_000)  # the trained window times the slots: far beyond this machine
    auto = plan_placements(layout, hw, params=asked, budget=Budget.of(hw), ctx_is_auto=True)  # type: ignore[arg-type]
    assert auto.chosen is not None and auto.ctx_reduced_from == 8_000_000
    left = AVAILABLE - cpu_use(auto)
    assert left >= TOTAL * AUTO_RESERVE_FRACTION, f"automatic context left only {left / GIB:.2f} GiB"
    assert auto.ram_left == left
    assert "of RAM free for the system and other programs" in auto.summary, auto.summary
    assert auto.public()["ram_left"] == left
    # still most of what there is: the reserve is not a cut to a token context
    assert cpu_use(auto) > (AVAILABLE - TOTAL * AUTO_RESERVE_FRACTION) * 0.9
    # an explicit context as large as the automatic plan's and a bit more fits into that reserve: asked for
    more = dataclasses.replace(asked, ctx_size=auto.chosen.params.ctx_size + 1024 * 64)
    explicit = plan_placements(layout, hw, params=more, budget=Budget.of(hw), ctx_is_auto=False)  # type: ignore[arg-type]
    assert explicit.chosen is not None and explicit.ram_left is None


def test_a_small_machine_still_gets_a_plan(layout: GGUFLayout) -> None:
    """Where nothing fits beside the reserve, the automatic context uses the whole budget, as before."""
    hw = machine(ram_gib=1.6)
    auto = plan_placements(layout, hw, params=FitParams(ctx_size=8_000_000), budget=Budget.of(hw))
    assert auto.chosen is not None and auto.ram_left is None
