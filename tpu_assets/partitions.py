"""Partitions of the TPU graph."""

import dagster as dg

# One partition per consumer commit that is (or may be) built: the full 40-hex sha.
tpu_builds = dg.DynamicPartitionsDefinition(name="tpu_builds")
