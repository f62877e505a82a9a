"""The Anthropic Messages surface (surface.py)."""
