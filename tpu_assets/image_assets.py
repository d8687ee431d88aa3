"""`tpu/image`, `tpu/smoke`, `tpu/verified_image`:
build pinned-first, verify installed files, smoke live.

The build, inspection and attestation code is imported by the bodies that run it: every process that
loads the location (code server, run worker, sensor tick) pays for what it imports, and only these
assets' runs need it (docs/PERFORMANCE.md, code-location load).
"""

import contextlib
import time
from collections.abc import Iterator

import dagster as dg

from resources.git import GitRemotes
from resources.heartbeat import observe_start
from resources.iris.cli import IrisCli, JobSpec
from resources.iris.output import JobState
from resources.links import commit_entries, digest_entries
from resources.registry import ImageRef, Registry
from resources.signing import AttestSigner
from resources.site.resource import SiteResource
from tpu_assets.keys import (
    CHECK_INSTALLED,
    CHECK_LAYERS,
    CHECK_PROBES,
    HARBOR_LOCK,
    IMAGE,
    IRIS_POOL,
    SMOKE,
    VERIFIED_IMAGE,
)
from tpu_assets.models import (
    BuiltImage,
    Finding,
    SmokeResult,
    VerifiedImage,
)
from tpu_assets.partitions import tpu_builds

IMAGE_CHECKS = [
    dg.AssetCheckSpec(
        CHECK_INSTALLED,
        asset=IMAGE,
        blocking=True,
        description="The INSTALLED harbor (dist-info version + direct_url.json commit_id, read "
        "out of the "
        "pushed image's layers) equals the uv.lock pin. Never a build-log line.",
    ),
    dg.AssetCheckSpec(
        CHECK_PROBES,
        asset=IMAGE,
        blocking=True,
        description="The site's file probes hold in the installed files, e.g. in harbor/job.py the "
        "`existing_config != self.config` guard is followed by logger.warning, not a raise (the "
        "far-away "
        "per-trial raise is not mistaken for it).",
    ),
    dg.AssetCheckSpec(
        CHECK_LAYERS,
        asset=IMAGE,
        blocking=True,
        description=(
            "Several layers, none over the site's size limit: a single giant layer is not "
            "pullable over ghcr egress."
        ),
    ),
]


@contextlib.contextmanager
def failures_shown() -> Iterator[None]:
    """A BuildFailed becomes a dg.Failure: its facts (state,
    error, log tail) show in the UI's step failure."""
    from tpu_assets.build import BuildFailed

    try:
        yield
    except BuildFailed as exc:
        metadata = {k: dg.MetadataValue.md(f"```\n{v}\n```") for k, v in exc.facts.items()}
        raise dg.Failure(description=str(exc), metadata=metadata) from None


def _check_result(name: str, finding: Finding) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=name,
        asset_key=IMAGE,
        passed=finding.passed,
        description=finding.description[:2000],
        metadata={
            k: dg.MetadataValue.md(f"```\n{v}\n```") for k, v in list(finding.facts.items())[:10]
        },
    )


@dg.asset(
    key=IMAGE,
    deps=[HARBOR_LOCK],
    partitions_def=tpu_builds,
    check_specs=IMAGE_CHECKS,
    group_name="tpu",
    kinds={"kaniko", "oci"},
    pool=IRIS_POOL,
    code_version="1",
    description=(
        "The consumer commit (the partition) built as a kaniko job on iris and pushed ONLY to the "
        "immutable `:tpu-<gitsha>`; the floating tag is never a build destination. The job is "
        "state-polled, never log-watched; the digest comes from the registry, not from the job. An "
        "existing pinned tag is reused, never rebuilt. Checks read the installed files from the "
        "layers."
    ),
)
def image(
    context: dg.AssetExecutionContext,
    site: SiteResource,
    git: GitRemotes,
    registry: Registry,
    iris: IrisCli,
):
    from tpu_assets.build import build_image
    from tpu_assets.inspection import verify_image

    config = site.config()
    with failures_shown():
        built = build_image(
            commit=context.partition_key,
            site=config,
            git=git,
            iris=iris,
            registry=registry,
            log=context.log,
            on_submit=lambda sub: observe_start(
                context, {"job_id": sub.job_id}, what="iris build job submitted"
            ),
        )
    findings = verify_image(
        registry,
        built=built,
        tpu=config.tpu,
        repository=ImageRef.parse(config.tpu.image).repository,
    )
    yield dg.Output(
        built,
        data_version=dg.DataVersion(built.digest),
        metadata={
            "image": dg.MetadataValue.text(built.ref),
            **digest_entries(config.links, "digest", config.tpu.image, built.digest),
            "job_id": dg.MetadataValue.text(built.job_id or "(reused existing pinned tag)"),
            "job_state": dg.MetadataValue.text(built.job_state),
            "job_command": dg.MetadataValue.text(built.job_command or "-"),
            "duration_s": dg.MetadataValue.float(built.duration_s),
            "layers": dg.MetadataValue.int(built.layers),
            "largest_layer_bytes": dg.MetadataValue.int(built.largest_layer_bytes),
            **commit_entries(
                config.links, "harbor_commit_locked", config.tpu.harbor_repo, built.lock_pin.commit
            ),
            "harbor_commit_dockerfile": dg.MetadataValue.text(built.dockerfile_commit),
            "build_script_warnings": dg.MetadataValue.md(
                f"```\n{built.script_warnings}\n```" if built.script_warnings else "none"
            ),
        },
    )
    for name, finding in findings.items():
        yield _check_result(name, finding)


@dg.asset(
    key=SMOKE,
    partitions_def=tpu_builds,
    group_name="tpu",
    kinds={"iris"},
    code_version="1",
    description=(
        "A live smoke job (site `[tpu].smoke_command`) on the image pinned BY DIGEST, through "
        "the same "
        "iris job interface. Passes only when the job's final state is succeeded."
    ),
)
def smoke(
    context: dg.AssetExecutionContext,
    site: SiteResource,
    git: GitRemotes,
    iris: IrisCli,
    image: BuiltImage,
) -> dg.Output[SmokeResult]:
    from tpu_assets.build import finish_job, job_heartbeat

    config = site.config()
    assert config.iris is not None
    spec = JobSpec(
        name=f"tpu-smoke-{image.gitsha}",
        task_image=image.pinned_ref,
        cpu=4,
        memory="16GB",
        disk="50GB",
        timeout_s=config.iris.smoke_timeout_s,
        command=config.tpu.smoke_command,
    )
    context.log.info("submitting " + iris.command_line(spec))
    started = time.monotonic()
    with failures_shown():
        # iris bundles the submit directory as /app: the consumer
        # at the built commit, as a datagen launch would.
        with git.checkout(url=config.tpu.consumer_repo, sha=image.consumer_commit) as wt:
            submission = iris.submit(spec=spec, cwd=wt.path)
        observe_start(context, {"job_id": submission.job_id}, what="iris smoke job submitted")
        summary = finish_job(
            iris,
            submission,
            spec,
            what="smoke",
            consequence=f"{image.pinned_ref} is not verified and will not be promoted",
            heartbeat=job_heartbeat(config, submission, spec, what="smoke", log=context.log.info),
        )
    job_id = submission.job_id
    result = SmokeResult(
        task_image=image.pinned_ref,
        job_id=job_id,
        state=summary.state.value,
        exit_code=summary.exit_code,
        duration_s=round(time.monotonic() - started, 1),
    )
    return dg.Output(
        result,
        metadata={
            "job_id": dg.MetadataValue.text(job_id),
            "state": dg.MetadataValue.text(result.state),
            "task_image": dg.MetadataValue.text(image.pinned_ref),
            "duration_s": dg.MetadataValue.float(result.duration_s),
        },
    )


@dg.asset(
    key=VERIFIED_IMAGE,
    partitions_def=tpu_builds,
    group_name="tpu",
    kinds={"oci"},
    code_version="1",
    description=(
        "The 'last good' record: materializes ONLY when every image check passes (re-verified "
        "here from "
        "the registry) and the smoke succeeded. Shaped like SLSA provenance: subject digest, "
        "resolved "
        "dependencies with git commits, verification results. With the site's [attest], that "
        "statement is "
        "signed (DSSE) and attached to the image in the registry, cosign's layout; promotion "
        "checks it. "
        "Promotion and rollback choose from these."
    ),
)
def verified_image(
    context: dg.AssetExecutionContext,
    site: SiteResource,
    registry: Registry,
    attest_signer: AttestSigner,
    image: BuiltImage,
    smoke: SmokeResult,
) -> dg.Output[VerifiedImage]:
    from tpu_assets.attestation import UNSIGNED, attest
    from tpu_assets.build import BuildFailed
    from tpu_assets.inspection import verify_image
    from tpu_assets.provenance import slsa_statement

    config = site.config()
    tpu = config.tpu
    findings = verify_image(
        registry, built=image, tpu=tpu, repository=ImageRef.parse(tpu.image).repository
    )
    failed = [f"{name}: {f.description}" for name, f in findings.items() if not f.passed]
    if smoke.state != JobState.SUCCEEDED.value:
        failed.append(f"smoke job {smoke.job_id} ended {smoke.state}")
    if failed:
        raise BuildFailed(f"{image.pinned_ref} is not verified:\n" + "\n".join(failed))
    verified = VerifiedImage(
        build=context.partition_key,
        digest=image.digest,
        ref=image.ref,
        harbor_commit=image.lock_pin.commit,
        harbor_version=image.lock_pin.version or "",
        consumer_commit=image.consumer_commit,
        findings=findings,
        smoke_job=smoke.job_id,
    )
    provenance = slsa_statement(image=image, tpu=tpu, findings=findings, smoke=smoke)
    # Signed and attached before the record exists: a verified record always has its attestation.
    key = attest_signer.signing_key()
    if key is None:
        context.log.warning(f"attestation {UNSIGNED}")
        signed = {"attestation": dg.MetadataValue.text(UNSIGNED)}
    else:
        signed = attest(
            config,
            registry,
            key,
            repository=ImageRef.parse(tpu.image).repository,
            digest=image.digest,
            statement=provenance,
        ).metadata()
    return dg.Output(
        verified,
        data_version=dg.DataVersion(image.digest),
        metadata={
            **digest_entries(config.links, "digest", tpu.image, image.digest),
            "image": dg.MetadataValue.text(image.ref),
            **commit_entries(config.links, "harbor_commit", tpu.harbor_repo, image.lock_pin.commit),
            "harbor_version": dg.MetadataValue.text(image.lock_pin.version or ""),
            **commit_entries(
                config.links, "consumer_commit", tpu.consumer_repo, image.consumer_commit
            ),
            "gitsha": dg.MetadataValue.text(image.gitsha),
            "provenance": dg.MetadataValue.json(provenance),
            **signed,
            "verification": dg.MetadataValue.md(
                "\n".join(f"- **{n}**: {f.description}" for n, f in findings.items())
                + f"\n- **smoke**: job {smoke.job_id} {smoke.state}"
            ),
        },
    )
