"""The window's wording of the core's messages, round two (issue 32, last round): a size said once, not
"12.0 MiB (12.0 MiB)"; the download folder's setting key turned into where to read up; the planner's speeds
in the pages' figures; a replaced command that starts a sentence starts it with a capital."""

from __future__ import annotations

from app.ui.fmt import predicted, tps
from app.ui.wording import for_window


def test_a_size_the_core_gives_twice_is_said_once() -> None:
    said = for_window(
        "not enough free space for acme/x: 12582912 bytes (12.0 MiB) still to download plus a 33554432 "
        "bytes (32.0 MiB) margin. Free some space (or set hf_cache_dir to a larger disk) and pull again"
    )
    assert "12.0 MiB still to download plus a 32.0 MiB margin" in said, said
    assert "hf_cache_dir" not in said and "docs/desktop.md" in said and "press Resume" in said, said


def test_speeds_in_one_style() -> None:
    said = for_window("at 2048 tokens per request, 1114-11135 tokens/s (not measured yet)")
    assert said.endswith("1.1k-11k tok/s (not measured yet)"), said
    assert for_window("measured 219 tokens/s here") == "measured 219 tok/s here"
    assert for_window("0.0-0.4 tokens/s") == "under 0.4 tok/s"  # never "0-0.4"
    assert [tps(n) for n in (0.04, 3.44, 999.4, 1114, 8417, 11135)] == [
        "0.04",
        "3.4",
        "999",
        "1.1k",
        "8.4k",
        "11k",
    ]
    assert predicted(None, (1114.0, 11135.0)) == "1.1k-11k tok/s"
    assert predicted(43.2, (1.0, 2.0)) == "~43 tok/s"
    assert predicted(None, None) is None


def test_a_replaced_command_that_opens_a_sentence_is_capitalised() -> None:
    said = for_window(
        "llama.cpp comes first (llama). `switchyard pin tiny mistral.rs` to use mistral.rs instead."
    )
    assert "(llama). Choose mistral.rs under Lane on the Library page to use" in said, said
    # mid-sentence (and a message that is only the hint) keeps its small letter
    assert for_window("x is corrupt; retry the pull").endswith("; press Resume in the Downloads list")
