"""The UI tests' fixtures: `demo` (the sandbox with `dagster dev` running on it), from
tests/support/ui/dagster_dev.py."""

from tests.support.ui.dagster_dev import demo  # noqa: F401  (a fixture, found by pytest here)
