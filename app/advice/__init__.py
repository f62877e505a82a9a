"""Advice: what Switchyard tells the user about a model before and after it runs.

`explain` (the routing decision and the memory plan of a local model), `hub_fit` (the same verdict for a
model still on the hub), `doctor` (the machine and its installs) and `inputs` (what every verdict is computed
from). Pure functions over an `AdviceInputs`: the Runtime's verbs wrap them for the server and the GUI, and
the CLI commands that run without a server call them with `local_inputs`. Nothing here imports the CLI.
"""
