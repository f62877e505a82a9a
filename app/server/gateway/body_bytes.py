"""The bytes of a request body after the gateway changed it: the client's own bytes with the new fields
written after them where that is all that changed, re-encoded whole only otherwise.

The session bank adds `id_slot` to nearly every chat for a llama.cpp lane; encoding the whole body again
for that costs a few microseconds for a short chat and about 90 for an agent's 35 KB one, on the event
loop, per request. A JSON object whose closing brace gets `, "key": value` before it is the same object
with those members added (the key is new, so no duplicate is made).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_SPACE = b" \t\r\n"


def changed_body(raw: bytes, before: Mapping[str, Any], after: Mapping[str, Any]) -> bytes:
    """The JSON bytes of `after`, given that `raw` are the bytes of `before` (parsed from them, or
    encoded from it): `raw` extended when `after` only adds keys to a non-empty `before`, else `after`
    encoded whole. `after` is a new dict over `before`'s values, as every body change on the request
    path is (`{**body, ...}`): a value edited in place would not be seen."""
    added = after.keys() - before.keys()
    end = len(raw.rstrip(_SPACE))
    if (
        not added
        or not before
        or end == 0
        or raw[end - 1 : end] != b"}"
        or len(after) != len(before) + len(added)
        or any(after[k] is not v for k, v in before.items())  # the very objects: unchanged
    ):
        return json.dumps(after).encode()
    tail = b"".join(b", %s: %s" % (json.dumps(k).encode(), json.dumps(after[k]).encode()) for k in added)
    return raw[: end - 1] + tail + b"}"
