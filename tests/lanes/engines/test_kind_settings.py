"""Each engine kind's own keys: declared by the kind, all from one area of Settings that is a kind's."""

from __future__ import annotations

from app.core.settings import KIND_AREAS, Settings
from app.lanes.engines.registry import KINDS


def test_a_kind_reads_its_keys_from_one_kind_area_and_every_kind_area_has_a_kind() -> None:
    claimed: dict[str, set[str]] = {}
    for kind in KINDS:
        areas = {Settings.area_of(k) for k in kind.setting_keys}
        assert len(areas) <= 1, (kind.lane, areas)  # one kind, one area: nothing of another kind's
        for area in areas:
            assert area in KIND_AREAS, (kind.lane, area)  # server or lane-wide keys are not a kind's
            claimed.setdefault(area, set()).add(kind.lane)
    assert set(claimed) == set(KIND_AREAS), claimed
    assert claimed["cuda"] == {"vllm", "sglang"}  # the two CUDA kinds share one area, one key each


def test_a_kinds_keys_are_read_through_its_area() -> None:
    s = Settings.flat(vllm_extra_args="--a", sd_server_path="/opt/sd", mlx_prompt_cache_mib=64)
    for kind in KINDS:
        for key in kind.setting_keys:
            assert getattr(s.area(Settings.area_of(key)), key) == s.value(key)
    assert (s.cuda.vllm_extra_args, s.sdcpp.sd_server_path, s.mlx.mlx_prompt_cache_mib) == (
        "--a",
        "/opt/sd",
        64,
    )
