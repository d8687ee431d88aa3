"""Helpers for the resources tests: the child interpreter the error-path tests run."""
