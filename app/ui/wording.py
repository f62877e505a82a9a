"""The core's messages as the window says them: where a message names a command (`switchyard hub login`,
"run the pull again"), the window names its own button or field instead, and byte counts are sizes.

The core keeps its command-line wording (the CLI and the API show it as is); only what the window shows
goes through `for_window`.
"""

from __future__ import annotations

import functools
import re

from app.core.units import fmt_bytes
from app.ui.fmt import speed_range, tps

# (pattern, replacement) in order: the longer phrases first, so a shorter one does not cut them
_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (
            r"add a token with `switchyard hub login`(?: \(or set HF_TOKEN\))?",
            "enter a token in the Hugging Face token field on the Settings page and press Save",
        ),
        (r"`switchyard hub login`(?: --file)?", "the Hugging Face token field on the Settings page"),
        (r"\(see `switchyard hub status`\)", "(Settings page)"),
        (r"log in again with", "enter it again with"),
        (
            r"create one with `switchyard keys create NAME`",
            "create one on the Server page (API keys tab, Create key)",
        ),
        (r"see `switchyard keys ls`", "see the API keys tab on the Server page"),
        (
            r"`switchyard keys revoke[^`]*`",
            "select the key in the Server page's API keys tab and press Revoke selected",
        ),
        (
            # the capability lane has no window control: it is rarely needed, and says where to read up
            r"no second llama\.cpp build is registered: .*",
            "optional: for GGUF architectures llama.cpp lacks (docs/engines.md, Capability lanes)",
        ),
        (r"`switchyard pin \S+ ([^`\s]+)`", r"choose \1 under Lane on the Library page"),
        (
            r"`?switchyard engine install ([\w.-]+)`?",
            r"select \1 in the engines table on the Lanes page and press Install",
        ),
        (r"`switchyard pull [^`]*`", "Download on the Discover page"),
        (
            # a LoRA adapter's settings.json recipe: the window's way is the base model's LoRA list
            r"load it with its base model through model_overrides\[<base id>\]\.lora \(e\.g\. \[[^\]]*\]\)",
            "put it beside its base model (or in a models folder), then select the base model on the Library "
            "page and tick the adapter under LoRA adapters",
        ),
        (
            r"add it to model_overrides\[('[^']*')\]\.lora \(the Library's Tune panel: LoRA adapters\)",
            r"select \1 on the Library page and tick it under LoRA adapters",
        ),
        (r"model_overrides\[[^\]]*\]\.mmproj", "the model's settings"),
        (
            r"add a judge, e\.g\. with `switchyard guard enable [^`]*`",
            "on the Settings page, tick Judge requests and answers with a safety model and press Save "
            "settings: that downloads a judge",
        ),
        (r"`switchyard guard enable [^`]*`", "the Safety section of the Settings page"),
        (
            r"no system keyring is available here \(backend [\w.]+\)",
            "this desktop has no password store (system keyring) running",
        ),
        (r"the system keyring did not accept it \(\w+\)", "the password store refused it (is it locked?)"),
        (
            # the window has no field for the download folder: the docs say how to move it
            r"\(or set hf_cache_dir to a larger disk\)",
            "(or move the download folder to a larger disk: docs/desktop.md, A full disk, says how)",
        ),
        (r"(?:run|retry) the pull(?: again)?|pull again(?: to retry)?", "press Resume in the Downloads list"),
        # the planner's advice names command-line flags: the window names the Library's settings
        (r" \(--kv-type (\w+)\)", r" (choose \1 under KV cache in the model's settings on the Library page)"),
    )
)
# the core writes some sizes both ways ("12582912 bytes (12.0 MiB)"): the window says the size once
_BYTES = re.compile(r"\b(\d+) of (\d+) bytes\b|\b(\d{4,}) bytes\b(?: \((\d[\d.]* [KMGT]?i?B)\))?")


def _sizes(m: re.Match[str]) -> str:
    if m.group(4) is not None:
        return m.group(4)
    if m.group(3) is not None:
        return fmt_bytes(int(m.group(3)))
    return f"{fmt_bytes(int(m.group(1)))} of {fmt_bytes(int(m.group(2)))}"


# token counts the planner writes bare ("a context of 27830272 or less"): grouped, as the window's other
# numbers are
_TOKENS = re.compile(r"\b(context of|asked for) (\d{5,})\b")


# the planner's speeds ("1114-11135 tokens/s", "about 43.2 tokens/s") in the figures every page uses
_SPEEDS = re.compile(r"\b(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))? tokens/s\b")


def _speeds(m: re.Match[str]) -> str:
    low = float(m.group(1))
    return speed_range(low, float(m.group(2))) if m.group(2) else f"{tps(low)} tok/s"


def _in_sentence(m: re.Match[str], replacement: str) -> str:
    """The replacement, its first letter a capital where it starts a sentence ("... (llama). Choose"):
    the core's command often opened one ("`switchyard pin ...` to use ...")."""
    said = m.expand(replacement)
    if m.string[: m.start()].endswith((". ", "! ", "? ")):
        return said[:1].upper() + said[1:]
    return said


def for_window(message: str) -> str:
    """`message` with command lines replaced by the window's buttons, byte counts as sizes, token counts
    grouped by thousands, and speeds written as the pages write them."""
    for pattern, replacement in _RULES:
        message = pattern.sub(functools.partial(_in_sentence, replacement=replacement), message)
    message = _TOKENS.sub(lambda m: f"{m.group(1)} {int(m.group(2)):,}", message)
    message = _SPEEDS.sub(_speeds, message)
    return _BYTES.sub(_sizes, message)
