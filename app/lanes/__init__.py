"""Engine lanes: how each engine is started, the lane state machine, and the supervisor."""
