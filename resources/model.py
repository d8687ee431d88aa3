"""The base of lockstep's own pydantic models: each builds its validator when first used.

A code server, `dagster dev` and every run worker import both locations before doing anything; most
of these models (a bench report, an iris answer, a dep table) are never validated in that process,
and building their validators at import was the largest part of loading a location. Dagster's own
classes (`dg.Config`, `dg.ConfigurableResource`) are built as before: Definitions instantiates them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    model_config = ConfigDict(defer_build=True)
