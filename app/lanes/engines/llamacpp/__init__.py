"""The llama.cpp kinds: the plan and command line, the runtimes, the capability lane, speculation and LoRA."""
