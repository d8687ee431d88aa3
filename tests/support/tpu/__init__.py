"""Helpers for the TPU tests: the daemon, registries with
race windows, the workers and code locations they run."""
