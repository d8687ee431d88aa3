"""The sandbox's tests (sandbox/): its repos, engines, nodes, CLI and teardown."""
