"""The one request path every surface crosses: resolve, wait, hold, check, post, relay (core.py)."""
