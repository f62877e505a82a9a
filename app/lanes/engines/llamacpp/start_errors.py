"""Why a llama.cpp engine failed to start, in its own words: the first line its log marks as an error.

llama.cpp logs each line with a level letter after the timestamp ("0.00.009.319 E llama_init_from_model:
..."); the first error line is the cause, the lines after it ("failed to create context", "exiting due to
model loading error") only repeat that something failed. Without it a start failure reads as the last
lines of a long log, where the cause is easy to miss.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# "<elapsed> E <component>: <message>"; the component is one word, the message the rest
_ERROR = re.compile(r"^\s*[\d.]+\s+E\s+(?:\w+\s+)?(?P<where>[\w:]+):\s+(?P<what>.+)$")
# the wrappers llama.cpp logs after the cause: they say only that loading failed
_ECHOES = ("failed to create context", "failed to create_context", "exiting due to", "failed to load model")
_KV = re.compile(r"\b[KV] cache type (?P<type>\w+)\b")


def start_cause(lines: Sequence[str]) -> str | None:
    """The first error llama.cpp logged in `lines` that names a cause (None: it logged none)."""
    for line in lines:
        m = _ERROR.match(line)
        if m and not any(e in m["what"] for e in _ECHOES):
            return m["what"].strip()
    return None


def start_advice(cause: str) -> str | None:
    """What to do about a known cause (None: nothing more to say than the cause)."""
    kv = _KV.search(cause)
    if kv:
        return (
            f"this model's attention heads do not suit a {kv['type']} KV cache: set kv_type to f16 for it "
            "(model_overrides, through PUT /api/settings or the Tune page)"
        )
    return None
