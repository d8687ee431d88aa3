"""Every job lives in its location's jobs.py: one
place to find what a location can run, and no asset
module that must be imported to name a job."""

from __future__ import annotations

import ast
from pathlib import Path

import dagster as dg

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("lockstep", "resources", "tpu_assets", "jovian_assets", "sensors", "sandbox")
JOBS_MODULES = {Path("tpu_assets/jobs.py"), Path("jovian_assets/jobs.py")}
JOB_MAKERS = {"define_asset_job", "job"}  # dg.define_asset_job(...), @dg.job / @dg.job(...)


def _maker(node: ast.expr) -> str | None:
    name = (
        node.attr
        if isinstance(node, ast.Attribute)
        else node.id
        if isinstance(node, ast.Name)
        else None
    )
    return name if name in JOB_MAKERS else None


def job_definitions(path: Path) -> list[int]:
    """Lines that define a job: a call of define_asset_job/job,
    or a function decorated with `job`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and _maker(n.func)]
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines += [
                d.lineno for d in fn.decorator_list if not isinstance(d, ast.Call) and _maker(d)
            ]
    return sorted(lines)


def test_the_walker_finds_each_way_of_defining_a_job(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import dagster as dg\nfrom dagster import job\nj = dg.define_asset_job('j')\n"
        "@dg.job\ndef a(): ...\n@job(name='b')\ndef b(): ...\n@dg.op\ndef c(): ...\n"
    )
    assert job_definitions(sample) == [3, 4, 6]


def test_no_job_is_defined_outside_a_locations_jobs_module() -> None:
    files = sorted(p.relative_to(ROOT) for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py"))
    outside = [
        f"{p}:{line}" for p in files if p not in JOBS_MODULES for line in job_definitions(ROOT / p)
    ]
    assert not outside, (
        f"jobs defined outside tpu_assets/jobs.py and jovian_assets/jobs.py: {outside}"
    )


def test_each_locations_jobs_are_its_jobs_modules() -> None:
    import jovian_assets.definitions as jovian
    import jovian_assets.jobs as jovian_jobs
    import tpu_assets.definitions as tpu
    import tpu_assets.jobs as tpu_jobs

    for defs, module in ((tpu.defs, tpu_jobs), (jovian.defs, jovian_jobs)):
        # define_asset_job's jobs are UnresolvedAssetJobDefinition, which dagster does not export
        in_module = {
            v.name
            for v in vars(module).values()
            if isinstance(v, dg.JobDefinition) or type(v).__name__ == "UnresolvedAssetJobDefinition"
        }
        in_defs = {job.name for job in defs.resolve_all_job_defs() if not job.name.startswith("__")}
        assert in_defs == in_module, (module.__name__, in_defs ^ in_module)
