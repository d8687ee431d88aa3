"""`lockstep preflight`: what a site must look like
before its first run, checked without changing anything.

A team runs it on day one against its site file (``--site``, else ``$LOCKSTEP_SITE``, else the
sandbox's ``.sandbox/site.toml``). It reads the consumer and build repos (temporary checkouts), asks
iris, every Spark node and the registry, and reports each check as a `Finding`: its name, ok / warn
/ fail, what is wrong, where (``file:line`` in a repository, a node, or ``site.toml:line``) and the
fix. Nothing is pushed, committed, submitted or written anywhere; the one thing it opens is a
registry upload session, cancelled at once, to prove the token can push. (git's mirror cache under
``$LOCKSTEP_CACHE`` is filled as by any lockstep read.)

    findings.py    the Finding model, a report's sections, text and JSON rendering, exit codes
    consumer.py    the consumer repo: harbor's lock
    follows the site's branch, the Dockerfile pin equals
                   the lock, the kaniko build script's pre-flight (tpu_assets.build_script)
    build_repo.py  the Jovian build repo, per build dir
    and lineage: versions.env, profiles, fetch-deps.sh
                   gates, recipes (build_profile top-level),
                   the lane's baseline.json, boot-gate markers
    iris.py        the iris CLI: found, its contract learned from its help, not too old for the
    controller nodes.py       each Spark node: connected the way
    lockstep connects (host keys verified), docker, the
                   bench tools on the lane's head
    registry.py    push rights to [tpu].image (Registry.can_push), the token's variable named when
    unset run.py         the checks of one site, run concurrently, each outside call under a
    deadline command.py     the click command, registered in lockstep/cli.py

Imports point one way: this package imports the locations' plain modules and resources/; nothing
imports it but lockstep/cli.py.
"""
