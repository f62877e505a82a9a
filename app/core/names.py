"""Names a user gives that become a file name, a folder or a keyring user (API keys, remotes, peers, MCP
servers, library ids, engine versions): one way to check them, and one way to refuse them.

A name that fails is refused before anything is written, with the field named (`param`), the rule it
breaks and an example, so the caller can fix it in one go.
"""

from __future__ import annotations

import re
from functools import cache

from app.core.errors import BadRequestError, SwitchyardError


@cache
def short_name_rule(longest: int) -> re.Pattern[str]:
    """1 to `longest` letters, digits, '.', '_' or '-', starting with a letter or digit: safe as one file
    name and as a keyring user on every system."""
    return re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{longest - 1}}}")


def check_named(
    value: str,
    *,
    fits: bool,
    refusal: str,
    error: type[SwitchyardError] = BadRequestError,
    param: str = "name",
) -> str:
    """`value` unchanged when it `fits`; else `error(refusal)` for the field `param` (the refusal quotes the
    value and says the rule it breaks)."""
    if not fits:
        raise error(refusal, param=param)
    return value


def check_short_name(value: str, *, what: str, longest: int, example: str, note: str = "") -> str:
    """`value` when it matches `short_name_rule(longest)`; else BadRequestError saying the rule, `note`
    (why the rule, in a few words) and an `example`."""
    extra = f" ({note})" if note else ""
    return check_named(
        value,
        fits=short_name_rule(longest).fullmatch(value) is not None,
        refusal=f"{what} {value!r} is not allowed; use 1-{longest} letters, digits, '.', '_' or '-', "
        f"starting with a letter or digit{extra}, e.g. {example}",
    )
