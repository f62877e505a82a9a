"""The local catalog of models."""
