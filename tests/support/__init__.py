"""Test helpers that are not tests: servers, runs,
hostile names, the canary scan, the shared worlds."""
