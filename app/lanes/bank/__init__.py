"""The session bank: llama.cpp slot checkpoints kept on disk across swaps (docs/engines.md#session-bank)."""
