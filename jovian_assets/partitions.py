"""Partitions of the Jovian graph."""

import dagster as dg

# One partition per lab rev (a source lock's `release.version`, e.g. r35), added by lab_rev_sensor.
lab_revs = dg.DynamicPartitionsDefinition(name="lab_revs")
