"""Settings, paths, events, the error tree and the Runtime that wires the parts together."""
