"""Settings, paths, events and the error tree (the Runtime that wires the parts is app/runtime.py)."""
