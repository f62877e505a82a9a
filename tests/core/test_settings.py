"""Settings: defaults, file, validation errors that say what to fix, per-model overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.errors import SettingsError
from app.core.paths import Paths
from app.core.settings import DEFAULT_PORT, Settings, load_settings


def test_defaults_are_safe() -> None:
    s = Settings()
    assert s.server.host == "127.0.0.1" and s.server.port == DEFAULT_PORT
    assert s.memory.max_loaded_lanes is None and s.memory.loaded_lane_cap == 1 and s.memory.idle_ttl_s == 900


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    assert load_settings(tmp_path / "settings.json") == Settings()


def test_file_values_and_overrides(tmp_path: Path) -> None:
    p = tmp_path / "settings.json"
    p.write_text(
        json.dumps(
            {
                "port": 9000,
                "idle_ttl_s": 5,
                "models_dirs": ["~/m"],
                "model_overrides": {"tiny": {"ttl_s": 2, "ctx_size": 1024}},
            }
        )
    )
    s = load_settings(p)
    assert s.server.port == 9000 and s.memory.idle_ttl_s == 5.0
    assert s.library.models_dirs == (Path("~/m").expanduser(),)
    assert s.ttl_for("tiny") == 2 and s.ttl_for("other") == 5.0
    assert s.override("tiny", "ctx_size", 0) == 1024


def test_malformed_json_names_file_and_position_and_keeps_it(tmp_path: Path) -> None:
    p = tmp_path / "settings.json"
    p.write_text('{"port": 9000,\n  "host": }')
    with pytest.raises(SettingsError) as exc:
        load_settings(p)
    assert str(p) in exc.value.message and "line 2" in exc.value.message
    assert p.read_text() == '{"port": 9000,\n  "host": }'


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"prot": 1}, "unknown setting 'prot'"),
        ({"port": "80"}, "port must be int"),
        ({"port": True}, "port must be int"),
        ({"port": 70000}, "out of range"),
        ({"kv_type": "q3"}, "kv_type"),
        ({"max_loaded_lanes": 0}, "at least 1"),
        ({"model_overrides": {"m": {"colour": 1}}}, "unknown keys"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_values(tmp_path: Path, raw: object, match: str) -> None:
    p = tmp_path / "settings.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(SettingsError, match=match):
        load_settings(p)


def test_switchyard_home_overrides_everything(tmp_path: Path) -> None:
    paths = Paths.from_env({"SWITCHYARD_HOME": str(tmp_path / "h")})
    assert paths.home == (tmp_path / "h").resolve()
    assert paths.models == paths.home / "models"
    assert paths.lane_logs.is_relative_to(paths.home)


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"ctx_size": "big"}, "must be an integer"),
        ({"ttl_s": "soon"}, "number of seconds"),
        ({"parallel": 0}, "at least 1"),
        ({"kv_type": "q3"}, "must be one of"),
        ({"flash_attn": True}, "must be one of"),
    ],
)
def test_bad_override_values_are_refused_up_front(over: dict[str, object], match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        Settings.flat(model_overrides={"m": over})
