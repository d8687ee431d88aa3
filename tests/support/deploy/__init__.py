"""Helpers for the deploy tests: the compose stack, a
production instance home, the Helm chart, the pod entry."""
