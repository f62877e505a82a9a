"""`switchyard guard`: enable pulls the judge through the normal pull path (from a local fake hub) and
writes `policy`; status shows it; disable turns it off and keeps the judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.__main__ import main
from app.core.paths import Paths
from app.core.policy import parse_policy
from app.core.settings import load_settings
from app.library.opening import opened_catalog
from tests.support.fakehub import FakeHub

REPO = "QuantFactory/Qwen3Guard-Gen-0.6B-GGUF"


def test_guard_enable_pulls_and_configures_the_default_judge(
    fake_hub: FakeHub, model_store: Path, isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_hub.add_repo(REPO, {"Qwen3Guard-Gen-0.6B.Q8_0.gguf": (model_store / "tiny2.gguf").read_bytes()})
    assert main(["guard", "enable", "qwen3guard-0.6b", "--local", "--judge", "both"]) == 0
    paths = Paths.from_env()
    settings = load_settings(paths.settings_file)
    policy = parse_policy(settings.safety.policy)
    assert policy.enabled and policy.requests and policy.answers
    assert settings.memory.max_loaded_lanes is None  # left alone: the judge's lane has a pool of its own
    (judge,) = policy.judges
    assert (judge.model, judge.format) == (f"{REPO}:Q8_0", "qwen3guard")
    # the judge's id is one the catalog resolves to the pulled file
    with opened_catalog(settings, paths) as (_, catalog):
        entry = catalog.get(judge.model)
    assert entry.path.name == "Qwen3Guard-Gen-0.6B.Q8_0.gguf"
    capsys.readouterr()
    assert main(["guard", "status"]) == 0
    assert "safety policy on" in capsys.readouterr().out
    assert main(["guard", "disable"]) == 0
    after = json.loads(paths.settings_file.read_text())["policy"]
    assert after["enabled"] is False and after["judges"][0]["model"] == judge.model
