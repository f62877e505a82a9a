"""Coding agents pointed at this server (`switchyard launch`): pure plans, no I/O but what the caller does."""
