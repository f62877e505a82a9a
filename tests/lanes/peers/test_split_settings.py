"""The `split` model override: checked when read, parsed the same from a list or a comma list, and a
split model started with no server to own its peers is refused with what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.errors import EngineUnavailableError, SettingsError
from app.core.settings import Settings, check_overrides
from app.lanes.engines.llamacpp import across
from app.lanes.engines.llamacpp.server import LlamaRuntimesKind
from app.lanes.engines.plan import StartContext
from app.library.model import ModelEntry


@pytest.mark.parametrize("value", [["desk", "laptop"], "desk,laptop"])
def test_split_names_parse_from_a_list_or_a_comma_list(value: object) -> None:
    check_overrides("m", {"split": value})
    settings = Settings().replace(model_overrides={"m": {"split": value}})
    assert across.split_of(settings, "m") == ("desk", "laptop")
    assert across.split_of(settings, "other") == ()


@pytest.mark.parametrize("value", [3, ["desk", 4], [""], {"desk": 1}])
def test_a_split_that_names_no_peers_is_refused_when_read(value: object) -> None:
    with pytest.raises(SettingsError, match=r"split'\] must be a list of paired peers"):
        check_overrides("m", {"split": value})


def test_a_split_model_needs_a_server_with_peers(tmp_path: Path) -> None:
    assert across.registered() is None  # no server in this process
    settings = Settings().replace(model_overrides={"m": {"split": ["desk"]}})
    entry = ModelEntry(id="m", path=tmp_path / "m.gguf", facts=None, problem=None)
    start = StartContext(ppid=1, port=1, hardware=None)
    with pytest.raises(EngineUnavailableError, match="only a running server with peers"):
        LlamaRuntimesKind().build(entry, settings, start)
