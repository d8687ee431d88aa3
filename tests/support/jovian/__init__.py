"""Helpers for the Jovian tests: the lab (a sandbox with its Jovian definitions)."""
