"""What a record shows at the wire (the admin API, `--json`, the window): some of its fields, by name.

`dataclasses.asdict` serves a record that shows every field; a record that keeps something back (a key's
id, a file's path) names the fields it shows here instead of spelling out a dict of its own.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def fields_of(record: object, *names: str) -> dict[str, Any]:
    """`{name: record.name}` for each of `names`, in that order; values as they are (no deep copy)."""
    return {name: getattr(record, name) for name in names}


class Public:
    """A frozen dataclass that shows every field at the wire, as `dataclasses.asdict` gives them (nested
    records as dicts, tuples kept)."""

    def public(self) -> dict[str, Any]:
        return dataclasses.asdict(cast("DataclassInstance", self))
