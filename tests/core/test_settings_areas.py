"""Settings in areas: settings.json stays flat (each key names one field of one area), each area refuses
its own bad values as it is made, and code reads through the areas, never a flat name."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from app.core.errors import SettingsError
from app.core.settings import (
    LimitSettings,
    MemorySettings,
    ServerSettings,
    Settings,
    load_settings,
    settings_from_mapping,
)
from app.core.settings_live import changed_keys

AREAS = Settings.areas()


def test_every_flat_key_names_one_field_of_one_area() -> None:
    keys = Settings.keys()
    assert AREAS == tuple(f.name for f in dataclasses.fields(Settings()))
    assert len(keys) == len(set(keys)) == sum(len(dataclasses.fields(Settings().area(a))) for a in AREAS)
    assert not set(keys) & set(AREAS)  # a key spelled like an area would be read as the area
    for key in keys:
        area = Settings.area_of(key)
        assert key in {f.name for f in dataclasses.fields(Settings().area(area))}
        assert Settings.area_keys(area).count(key) == 1
    assert [f.name for f in Settings.fields()] == list(keys)


def test_the_file_shape_is_flat_and_round_trips(tmp_path: Path) -> None:
    s = Settings.flat(port=9001, residency="memory", models_dirs=(tmp_path,), mlx_extra_args="--x 1")
    public = s.public()
    assert list(public) == list(Settings.keys())  # GET /api/settings and settings.json: flat keys only
    assert public["models_dirs"] == [str(tmp_path)] and public["port"] == 9001
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(public), encoding="utf-8")
    back = load_settings(path)
    assert back == s
    assert (
        back.server.port == 9001 and back.memory.residency == "memory" and back.mlx.mlx_extra_args == "--x 1"
    )
    assert back.memory.loaded_lane_cap is None  # "memory" residency: memory decides, not a count


def test_value_replace_and_with_changes_speak_flat_keys() -> None:
    s = Settings.flat(ram_budget_mib=4096)
    assert s.value("ram_budget_mib") == 4096 and s.value("port") == s.server.port
    cleared = s.replace(ram_budget_mib=None, port=0)  # replace sets exactly, None included
    assert cleared.memory.ram_budget_mib is None and cleared.server.port == 0
    kept = s.with_changes(ram_budget_mib=None, port=0)  # with_changes: None means "keep" (a flag not given)
    assert kept.memory.ram_budget_mib == 4096 and kept.server.port == 0
    assert kept.library is s.library  # an untouched area is shared, not copied
    assert changed_keys(s, cleared) == ["port", "ram_budget_mib"]
    with pytest.raises(TypeError, match="no key 'prot'"):
        s.replace(prot=1)


def test_a_flat_read_says_where_the_key_lives() -> None:
    with pytest.raises(AttributeError, match=r"settings\.server\.port"):
        Settings().port  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        Settings().nonsense  # type: ignore[attr-defined]  # noqa: B018


@pytest.mark.parametrize(
    ("area", "values", "match"),
    [
        (ServerSettings, {"port": 70000}, "port 70000 is out of range"),
        (ServerSettings, {"event_loop": "trio"}, "event_loop must be auto, asyncio or uvloop"),
        (MemorySettings, {"residency": "all"}, 'residency must be "single" or "memory"'),
        (MemorySettings, {"max_loaded_lanes": 0}, r"max_loaded_lanes must be at least 1 \(or null"),
        (LimitSettings, {"idle_timeout_s": 0}, "idle_timeout_s must be a positive number"),
    ],
)
def test_each_area_refuses_its_own_bad_values(area: Any, values: dict[str, Any], match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        area(**values)
    with pytest.raises(SettingsError, match=match):  # and the same words through the flat file
        settings_from_mapping(values)


def test_file_errors_keep_their_words() -> None:
    with pytest.raises(SettingsError, match=r"x\.json: unknown setting 'prot'; known: .*\bport\b"):
        settings_from_mapping({"prot": 1}, origin="x.json")
    with pytest.raises(SettingsError, match=r"x\.json: port must be int, got str"):
        settings_from_mapping({"port": "80"}, origin="x.json")
    with pytest.raises(SettingsError, match=r"x\.json: idle_ttl_s must be float, got bool"):
        settings_from_mapping({"idle_ttl_s": True}, origin="x.json")
    assert settings_from_mapping({"idle_ttl_s": 5}).memory.idle_ttl_s == 5.0  # an int is taken as seconds
