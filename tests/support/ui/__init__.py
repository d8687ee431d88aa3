"""Helpers for the UI tests: `dagster dev` on a sandbox."""
