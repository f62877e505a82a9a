"""Chat conversations kept for the desktop window (no Qt here, so it is testable headless)."""
