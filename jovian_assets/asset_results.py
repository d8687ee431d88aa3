"""What every Jovian asset body shares: the site's
[jovian] table, the run's rev, a check result from a
finding, a table of strings as metadata. A plain module, so no asset module imports another."""

import dagster as dg

from jovian_assets.models import Finding
from resources.errors import LockstepError
from resources.names import NameRefused, check_name
from resources.site.jovian import JovianSection
from resources.site.resource import SiteResource


class AdoptionRefused(LockstepError):
    """A rev cannot be adopted as it stands; nothing was written."""


def jovian_of(site: SiteResource) -> JovianSection:
    """The site's [jovian] table; every Jovian asset needs it."""
    config = site.config()
    if config.jovian is None:
        raise LockstepError(
            f"{config.path}: no [jovian] table: the Jovian graph needs the lab and build repos"
        )
    return config.jovian


def rev_of(context: dg.AssetExecutionContext) -> str:
    """The run's `lab_revs` partition as a rev name. A partition can be added by hand, and the rev
    names files, directories, a docker tag and the node's PROFILE: checked before any of them."""
    try:
        return check_name("lab_revs partition", context.partition_key)
    except NameRefused as exc:
        raise AdoptionRefused(f"{exc}; nothing was written") from None


def check_result(
    key: dg.AssetKey,
    name: str,
    finding: Finding,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
    metadata: dict[str, dg.MetadataValue] | None = None,
) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=name,
        passed=finding.passed,
        severity=severity,
        description=finding.description[:3000],
        metadata=metadata,
    )


def string_table(rows: list[dict[str, object]], columns: list[str]) -> dg.MetadataValue:
    schema = dg.TableSchema(columns=[dg.TableColumn(c, "string") for c in columns])
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord({c: "" if r.get(c) is None else str(r.get(c)) for c in columns})
            for r in rows
        ],
        schema=schema,
    )
