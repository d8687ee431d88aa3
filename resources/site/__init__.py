"""The site file: one TOML file describes a site — every URL, branch, path and policy lockstep uses.

- schema.py: SiteConfig, the whole file, and LOCATIONS, the tables that configure a code location
- one module per table: general ([site]), tpu, jovian, registry, iris, spark, links, attest, alerts,
  timeouts, and promotion ([tpu.promotion]); fields.py and rules.py hold what the tables share
- load.py: which file, read and validated (errors.py renders a bad key at its file and line) and
  kept while unchanged (cache.py); check.py: every problem at once and the JSON schema
  (`lockstep site`)
- resource.py: the Dagster glue (SiteResource); reload.py: how a deployment reloads a changed site

Nothing is re-exported here: importing one module loads only what it imports (the location-load
budget, tests/test_location_import.py), so import each name from its module.
"""
