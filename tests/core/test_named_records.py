"""statefile.NamedRecords: a store must say how it reads one record (`_record` is abstract), so a store that
forgot it fails where it is made, not on the first read of a file that has records in it."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from app.core.errors import NotFoundError
from app.core.statefile import NamedRecords
from app.lanes.peers.store import PeerStore
from app.lanes.remote.store import RemoteStore


class _Thing:
    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def public(self) -> dict[str, Any]:
        return {"name": self._name}


class _Forgetful(NamedRecords[_Thing]):
    list_key, noun, listing, repair = "things", "thing", "things ls", "remove it"
    missing_error = NotFoundError


def test_a_store_without_a_record_reader_cannot_be_made(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="_record"):
        _Forgetful(tmp_path / "things.json")  # type: ignore[abstract]


def test_a_store_with_one_reads_its_records(tmp_path: Path) -> None:
    class Things(_Forgetful):
        def _record(self, data: Any) -> _Thing:
            return _Thing(data["name"])

    path = tmp_path / "things.json"
    path.write_text('{"version": 1, "things": [{"name": "a"}, {"name": "b"}]}', encoding="utf-8")
    store = Things(path)
    assert [t.name for t in store.specs()] == ["a", "b"] and store.get("b").name == "b"
    with pytest.raises(NotFoundError, match=r"no thing named 'c' \(things: a, b\); see `things ls`"):
        store.get("c")


@pytest.mark.parametrize("store", [PeerStore, RemoteStore])
def test_both_stores_implement_it(store: type[NamedRecords[Any]]) -> None:
    assert not inspect.isabstract(store) and "_record" in vars(store)
