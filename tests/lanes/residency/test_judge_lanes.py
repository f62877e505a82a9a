"""A safety judge runs on a small lane of its own beside the text lane (issue 17): with one text lane
allowed (`max_loaded_lanes` 1), the policy's judge stays loaded while text models swap around it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from tests.conftest import link_models
from tests.lanes.residency.test_memory import ready
from tests.support.tinymodels import TinySpec, write_tiny_gguf

TEXT, JUDGE, OTHER = "tiny", "tiny2", "tiny3"


@pytest.fixture
async def rt(tmp_path: Path, model_store: Path) -> AsyncIterator[Runtime]:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    write_tiny_gguf(models / f"{OTHER}.gguf", TinySpec(seed=11))
    policy = {"enabled": True, "judges": [{"model": JUDGE, "format": "qwen3guard"}]}
    s = Settings.flat(models_dirs=(models,), max_loaded_lanes=1, policy=policy)
    async with Runtime(settings=s, paths=Paths.from_env()) as runtime:
        yield runtime


async def test_the_judge_stays_loaded_while_text_models_swap(rt: Runtime) -> None:
    sup = rt.supervisor
    assert sup.judge_ids() == {JUDGE}
    await sup.load(TEXT)
    await sup.load(JUDGE)
    assert ready(rt) == {TEXT, JUDGE}  # beside the text lane, not instead of it
    assert sup.pool_of(sup.lanes[JUDGE]) == "judge" and sup.pool_of(sup.lanes[TEXT]) == "chat"
    await sup.load(OTHER)  # one text lane: the other text model goes, the judge stays
    assert ready(rt) == {OTHER, JUDGE}
    await sup.load(TEXT)
    assert ready(rt) == {TEXT, JUDGE}


async def test_without_a_policy_the_same_model_is_one_more_text_lane(
    tmp_path: Path, model_store: Path
) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    s = Settings.flat(models_dirs=(models,), max_loaded_lanes=1)
    async with Runtime(settings=s, paths=Paths.from_env()) as rt:
        await rt.supervisor.load(TEXT)
        await rt.supervisor.load(JUDGE)
        assert ready(rt) == {JUDGE}  # swapped: it is no judge here
