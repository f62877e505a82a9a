"""The memory model: model layout x hardware x settings -> per-device memory, placements, context, speed."""
