"""The regular expressions a suite brings (the `regex` scorer, a JSON schema's `pattern`), matched with a
time limit in a thread.

A suite is data from a file, and a pattern such as `^(a|aa)+$` backtracks for seconds on a short answer
with Python's `re`, which cannot be interrupted. The `regex` package takes the same syntax, gives up after
MATCH_TIMEOUT_S and lets other threads run while it matches, so a hostile pattern costs one case its score
and never stalls the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import regex

MATCH_TIMEOUT_S = 1.0


class PatternTimeout(Exception):
    """A pattern that did not finish within MATCH_TIMEOUT_S on one text."""


@dataclass(frozen=True)
class SuitePattern:
    source: str
    compiled: Any  # regex.Pattern[str]

    def found(self, text: str) -> bool:
        """Whether the pattern occurs in `text`; PatternTimeout past MATCH_TIMEOUT_S. Blocks: call it in a
        thread."""
        try:
            return self.compiled.search(text, timeout=MATCH_TIMEOUT_S, concurrent=True) is not None
        except TimeoutError:
            raise PatternTimeout(
                f"the pattern /{self.source}/ took over {MATCH_TIMEOUT_S:g} s on this answer "
                "(it backtracks); simplify it"
            ) from None


def compile_pattern(source: str, *, ignore_case: bool = False) -> SuitePattern:
    """The pattern compiled; ValueError with the reason when it does not compile."""
    try:
        return SuitePattern(source, regex.compile(source, regex.IGNORECASE if ignore_case else 0))
    except regex.error as exc:
        raise ValueError(str(exc)) from None
