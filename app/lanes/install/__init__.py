"""Engines in their own environments: the manifest, installs as jobs, runtimes, releases, containers."""
