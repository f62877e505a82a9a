"""Engine kinds: one module per kind, registered in registry.py (its docstring is the contract).

Nothing outside this package names a lane or keeps a list of lane ids: it asks a kind (tests/lanes/engines/).
"""
