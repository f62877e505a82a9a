"""The guard models Switchyard knows by name: where to pull each and which prompt format it speaks.

Read by `switchyard guard enable` and the Settings page's Safety section (which enables the default).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnownJudge:
    repo: str
    quant: str
    format: str

    @property
    def model(self) -> str:
        return f"{self.repo}:{self.quant}"  # the catalog's alias for the pulled file


# the default: in the seed's trials it passed ordinary coding requests and refused harmful ones
DEFAULT_JUDGE = "qwen3guard-0.6b"
KNOWN: dict[str, KnownJudge] = {
    DEFAULT_JUDGE: KnownJudge("QuantFactory/Qwen3Guard-Gen-0.6B-GGUF", "Q8_0", "qwen3guard"),
    "llamaguard3-1b": KnownJudge("bartowski/Llama-Guard-3-1B-GGUF", "Q8_0", "llamaguard"),
}
