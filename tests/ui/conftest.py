"""The UI tests' fixtures: `demo` (the sandbox with `dagster dev` running on it), from tests/ui/dagster_dev.py."""

from tests.ui.dagster_dev import demo  # noqa: F401  (a fixture, found by pytest here)
