"""The iris cluster CLI: lockstep's adapter to every 2026 version of it.

- cli.py: IrisCli, the resource that submits, polls, cancels and reads jobs (and `iris_for` a site)
- capabilities.py: what an installed binary offers, learned from its help screens
- output.py: parsers of what the CLI prints, and the iris errors
- deploy.py: whether a deployment has an iris binary and a kubeconfig at all

Nothing is re-exported here: import each name from its module.
"""
