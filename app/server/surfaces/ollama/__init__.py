"""The Ollama surface (surface.py): its client API and its model management."""
