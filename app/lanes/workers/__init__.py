"""Code that runs inside an engine's own environment (`python -m app.lanes.workers.NAME`).

The folder rule (tests/lanes/install/test_engines.py): a module here imports only the standard library,
app.core.errors, app.lanes.parentwatch, its own folder and what its engine's environment has, never the app's
other dependencies.
"""
