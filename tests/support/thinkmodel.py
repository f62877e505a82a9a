"""A tiny model that thinks: a Qwen3-style chat template (assistant turns keep their reasoning in a
`<think>` block, and thinking off opens the answer with an empty one), which llama.cpp's template analysis
reads as a thinking model, so it parses `<think>...</think>` out of the answer as `reasoning_content`.

Random weights think nothing on their own: REASONED pins the answer to a thought and a reply with a grammar
(llama.cpp's GBNF), as the tool-call tests pin their calls.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.tinymodels import TinySpec, write_tiny_gguf

THINKER_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
THOUGHT = "I ponder"
ANSWER = "the answer is 42"
# the engine's whole output: a thought, then the answer (llama.cpp returns the thought with its newline)
REASONED = 'root ::= "<think>\\n' + THOUGHT + "\\n</think>\\n\\n" + ANSWER + '"'


def write_thinker(path: Path) -> Path:
    """The thinking model's GGUF at `path`."""
    return write_tiny_gguf(path, TinySpec(seed=5, chat_template=THINKER_TEMPLATE))
