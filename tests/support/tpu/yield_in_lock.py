"""A generator asset that yields its MaterializeResult inside a `with` block, as `tpu/floating_tag`
does inside the floating-tag lock; at the block's exit it writes down what the instance has stored.

Its own module so a step subprocess (the multiprocess executor, as daemon-launched runs use) can
import the job cheaply. Used by tests/tpu/test_floating_tag_log.py.
"""

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

KEY = dg.AssetKey(["yield_in_lock", "record"])
# where the block's exit writes what it saw (set by the test)
REPORT_ENV = "LOCKSTEP_TEST_YIELD_REPORT"


@contextlib.contextmanager
def _block(instance: dg.DagsterInstance, run_id: str) -> Iterator[None]:
    try:
        yield
    finally:
        stored = [r.run_id for r in instance.fetch_materializations(KEY, limit=5).records]
        Path(os.environ[REPORT_ENV]).write_text(
            json.dumps({"pid": os.getpid(), "stored": stored, "run_id": run_id})
        )


@dg.asset(key=KEY)
def record(context: dg.AssetExecutionContext) -> Iterator[dg.MaterializeResult]:
    with _block(context.instance, context.run.run_id):
        yield dg.MaterializeResult(metadata={"where": dg.MetadataValue.text("inside the block")})


defs = dg.Definitions(
    assets=[record],
    jobs=[
        dg.define_asset_job(
            "in_a_step_process", selection=[KEY], executor_def=dg.multiprocess_executor
        )
    ],
)


def step_process_job() -> dg.JobDefinition:
    return defs.resolve_job_def("in_a_step_process")
