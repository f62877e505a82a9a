"""What this machine has: a static probe taken once (`probe.probe`), memory bandwidth measured once
(`bandwidth.load_or_measure`), and a 1 Hz monitor (`monitor.Monitor`); the facts are in `model`.

Nothing is re-exported here: lanes import `app.hardware.cpu` in engine worker processes, and importing the
package must not drag numpy, psutil or the event bus along.
"""
