"""Build the embedded sandbox: real bare git repos
on this machine and a site file that points at them.

Idempotent: what exists is kept, what is missing is created. Nothing here is imported by assets or
resources; the sandbox only writes a SiteConfig that the rest of lockstep reads like any other.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import git
import tomli_w
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from resources.errors import FileFormatError, LockstepError
from resources.site.attest import AttestSection
from resources.site.general import SiteSection
from resources.site.iris import IrisSection
from resources.site.load import load_site
from resources.site.registry import RegistrySection
from resources.site.schema import SiteConfig
from resources.site.tpu import TpuSection
from resources.uv import UvCli
from sandbox import consumer_source, harbor_source
from sandbox.consumer_source import ConsumerShape
from sandbox.fake_iris import install_fake_iris
from sandbox.git_server import GitServer
from sandbox.jovian_world import jovian_section, jovian_up, lane_section
from sandbox.layout import BUILD_NODE, Sandbox
from sandbox.spark_nodes import install_nodes, spark_section

HARBOR_BRANCH = "penfever/working"
CONSUMER_BRANCH = "penfever/working"
AUTHOR = git.Actor("sandbox upstream", "upstream@sandbox.invalid")
DEFAULT_DIR = Path(".sandbox")
SANDBOX_IMAGE = "sandbox.local/open-thoughts/openthoughts-agent"
# Where the sandbox image's venv keeps harbor: its base's python is 3.11 (the real image's is 3.12).
SITE_PACKAGES = f"/opt/openthoughts/.venv/lib/{consumer_source.VENV_PYTHON}/site-packages"
# The smoke job runs the host's python3 (the same 3.11
# the image has) over the unpacked image's site-packages.
SMOKE_COMMAND = [
    "bash",
    "-lc",
    (
        f'PYTHONPATH="$IMAGE_ROOT{SITE_PACKAGES}" python3 -c '
        "\"import harbor.job, importlib.metadata as m; print('harbor', m.version('harbor'))\""
    ),
]


SANDBOX_OWNERS = ["team:ml-infra"]
SANDBOX_URL_SCHEMES = ("https", "ssh", "file", "git")
# The sandbox's build script requires a push token, as the real one does; its registry takes any.
# `lockstep demo` (and the tests) set this to a dummy value: it is still treated as a secret.
SANDBOX_TOKEN_ENV = "LOCKSTEP_SANDBOX_PUSH_TOKEN"
SANDBOX_TOKEN_VALUE = "sandbox-push-token-0000"
# The sandbox signs its verified builds, so promotion there checks attestations as on a real site.
# Its key is derived from a fixed seed (a dummy, like the push token: `lockstep demo` and the tests
# export it), and only its public half is written, as the site's trusted key.
SANDBOX_ATTEST_KEY_ENV = "LOCKSTEP_SANDBOX_ATTEST_KEY"
SANDBOX_ATTEST_PUB = Path("attest") / "sandbox-attest.pub"


def sandbox_attest_key() -> str:
    """The sandbox's ECDSA P-256 signing key, PEM (the
    same on every machine: it protects nothing)."""
    seed = int.from_bytes(hashlib.sha256(b"lockstep sandbox attestation key").digest(), "big")
    key = ec.derive_private_key(seed % (2**255), ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _write_attest_pub(sb: Sandbox) -> None:
    path = sb.root / SANDBOX_ATTEST_PUB
    if path.exists():
        return
    private = serialization.load_pem_private_key(sandbox_attest_key().encode(), password=None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


@contextmanager
def _worktree(bare: Path, branch: str | None) -> Iterator[git.Repo]:
    """A throwaway clone of `bare` (or a fresh repo when `branch` is None), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="lockstep-sandbox-") as tmp:
        path = Path(tmp) / "wt"
        if branch is None:
            repo = git.Repo.init(path)
        else:
            repo = git.Repo.clone_from(bare.resolve().as_uri(), path, branch=branch)
        with repo.config_writer() as cw:
            cw.set_value("user", "name", AUTHOR.name)
            cw.set_value("user", "email", AUTHOR.email)
        yield repo


def _write(root: Path, files: dict[str, str]) -> list[str]:
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return list(files)


def _publish(repo: git.Repo, bare: Path, branch: str) -> str:
    """Push the clone's HEAD to `bare`'s `branch` and return the sha."""
    repo.git.push(bare.resolve().as_uri(), f"HEAD:refs/heads/{branch}")
    return repo.head.commit.hexsha


def _init_bare(bare: Path, branch: str) -> None:
    bare.parent.mkdir(parents=True, exist_ok=True)
    git.Repo.init(bare, bare=True, initial_branch=branch)


def _create_harbor(sb: Sandbox) -> str:
    _init_bare(sb.harbor, HARBOR_BRANCH)
    with _worktree(sb.harbor, None) as repo:
        repo.git.checkout("-b", HARBOR_BRANCH)
        wt = Path(repo.working_dir)
        paths = _write(
            wt,
            {
                "pyproject.toml": harbor_source.pyproject("0.8.0"),
                "backend.py": harbor_source.BACKEND_PY,
                "harbor/__init__.py": harbor_source.init_py("0.8.0", 0),
                "harbor/job.py": harbor_source.job_py(fixed=False),
            },
        )
        repo.index.add(paths)
        repo.index.commit("harbor 0.8.0", author=AUTHOR, committer=AUTHOR)
        return _publish(repo, sb.harbor, HARBOR_BRANCH)


def _create_consumer(sb: Sandbox, harbor_sha: str, image: str, shape: ConsumerShape) -> str:
    _init_bare(sb.consumer, CONSUMER_BRANCH)
    harbor_url = sb.url(sb.harbor)
    with _worktree(sb.consumer, None) as repo:
        repo.git.checkout("-b", CONSUMER_BRANCH)
        wt = Path(repo.working_dir)
        paths = _write(
            wt,
            {
                "README.md": consumer_source.README,
                "pyproject.toml": consumer_source.pyproject(harbor_url, HARBOR_BRANCH, shape),
                "docker/Dockerfile.tpu": consumer_source.dockerfile(
                    harbor_url,
                    harbor_sha,
                    git_daemon=GitServer(sb.root).url_base(),
                    repos_uri=sb.repos.resolve().as_uri() + "/",
                ),
                "docker/build_tpu_kaniko.sh": consumer_source.build_script(image),
            },
        )
        (wt / "docker/build_tpu_kaniko.sh").chmod(0o755)
        UvCli(offline=True).lock(project_dir=wt)
        repo.index.add([*paths, "uv.lock"])
        repo.index.commit(
            "OpenThoughts-Agent: lock harbor from penfever/working", author=AUTHOR, committer=AUTHOR
        )
        return _publish(repo, sb.consumer, CONSUMER_BRANCH)


def sandbox_image(registry: str | None) -> str:
    """The sandbox's image repository: on the image-layout
    registry, or on `registry` (host:port)."""
    return f"{registry}/open-thoughts/openthoughts-agent" if registry else SANDBOX_IMAGE


def site_config(sb: Sandbox, registry: str | None = None) -> SiteConfig:
    """The sandbox's site: local repos, the fake iris, and
    an image-layout registry (or `registry` host:port)."""
    return SiteConfig(
        # The sandbox's repos are local bare repos: file://
        # is allowed here, never on a real site by default.
        site=SiteSection(
            name="sandbox", owners=SANDBOX_OWNERS, url_schemes=list(SANDBOX_URL_SCHEMES)
        ),
        tpu=TpuSection(
            harbor_repo=sb.url(sb.harbor),
            harbor_branch=HARBOR_BRANCH,
            consumer_repo=sb.url(sb.consumer),
            consumer_branch=CONSUMER_BRANCH,
            image=sandbox_image(registry),
            smoke_command=SMOKE_COMMAND,
            site_packages=SITE_PACKAGES,
            # The sandbox wants to show builds after re-locks;
            # a real site rarely needs this (runbook §7).
            rebuild_on_lock_change=True,
        ),
        registry=RegistrySection(kind="http")
        if registry
        else RegistrySection(kind="layout", layout_dir="registry"),
        iris=IrisSection(
            binary="bin/iris",
            cluster="sandbox",
            user="sandbox",
            docker_user="sandbox",
            docker_token_env=SANDBOX_TOKEN_ENV,
            poll_min_s=0.2,
            poll_max_s=2.0,
            call_timeout_s=60,
            cpu=16,
            memory="64GB",
            disk="120GB",
        ),
        jovian=jovian_section(sb.repos),
        spark=spark_section(),
        attest=AttestSection(
            key_env=SANDBOX_ATTEST_KEY_ENV, trusted_keys=[SANDBOX_ATTEST_PUB.as_posix()]
        ),
    )


def _install_iris(sb: Sandbox, contract: str, pull_secret_env: str | None = None) -> None:
    """`pull_secret_env`: the site's registry token
    variable, which the cluster pulls task images with."""
    py = [sys.executable, "-m"]
    install_fake_iris(
        sb.root,
        contract=contract,
        pull_secret_env=[pull_secret_env] if pull_secret_env else None,
        kaniko=[*py, "sandbox.fake_kaniko", "--site", str(sb.site_file)],
        task_image_hook=[*py, "sandbox.unpack_image", "--site", str(sb.site_file)],
    )


def use_iris_contract(root: Path, contract: str) -> None:
    """Make the sandbox's iris speak another 2026 generation (`[iris] sandbox_contract`)."""
    sb = Sandbox(root=root.resolve())
    text = sb.site_file.read_text(encoding="utf-8")
    text, n = re.subn(
        r'^sandbox_contract = "[^"]*"$',
        f'sandbox_contract = "{contract}"',
        text,
        flags=re.MULTILINE,
    )
    if n == 0:
        text = re.sub(
            r"^\[iris\]$",
            f'[iris]\nsandbox_contract = "{contract}"',
            text,
            count=1,
            flags=re.MULTILINE,
        )
    sb.site_file.write_text(text, encoding="utf-8")
    site = load_site(sb.site_file)
    _install_iris(sb, site.iris.sandbox_contract, site.registry.token_env)  # type: ignore[union-attr]


def up(
    root: Path = DEFAULT_DIR,
    *,
    registry: str | None = None,
    consumer_shape: ConsumerShape = "direct_reference",
) -> Sandbox:
    """Create whatever part of the sandbox is missing under `root`; return it.

    `registry` (host:port of a running registry server) is used only when the site file is first
    written; `consumer_shape` (how the consumer's pyproject declares
    harbor) only when the consumer repo is created.
    """
    sb = Sandbox(root=root.resolve())
    sb.root.mkdir(parents=True, exist_ok=True)
    if not (sb.harbor / "HEAD").exists():
        # its lock would point at a harbor that is gone
        shutil.rmtree(sb.consumer, ignore_errors=True)
        harbor_sha = _create_harbor(sb)
    else:
        harbor_sha = git.Repo(sb.harbor).commit(HARBOR_BRANCH).hexsha
    if not (sb.consumer / "HEAD").exists():
        _create_consumer(sb, harbor_sha, sandbox_image(registry), consumer_shape)
    jovian_up(sb)
    _write_attest_pub(sb)
    if not sb.site_file.exists():
        # The sandbox's repos have no web pages: no [links]
        # table (a person adds one for a real site).
        data = site_config(sb, registry).model_dump(
            mode="json", exclude_none=True, exclude={"links"}
        )
        sb.site_file.write_text(
            "# lockstep site file for the embedded sandbox (written by `lockstep sandbox up`).\n"
            + tomli_w.dumps(data),
            encoding="utf-8",
        )
    _allow_file_urls(sb)
    try:
        site = load_site(sb.site_file)
    except FileFormatError as exc:
        raise LockstepError(
            f"{exc}\nThis sandbox was made by an older lockstep: remove {sb.root} and run "
            "`lockstep sandbox up` again"
        ) from None
    _install_iris(
        sb, site.iris.sandbox_contract if site.iris else "2026-08", site.registry.token_env
    )
    if site.jovian is None:  # what we wrote (or found) must be a valid site
        # A sandbox made before the Jovian half existed: add its [jovian] table, keep the rest as it
        # is. Its build node and lane name [[spark.nodes]],
        # so those come along when the file has none.
        tables: dict[str, object] = {
            "jovian": jovian_section(sb.repos).model_dump(mode="json", exclude_none=True)
        }
        if site.spark is None:
            tables["spark"] = spark_section().model_dump(mode="json", exclude_none=True)
        table = tomli_w.dumps(tables)
        with sb.site_file.open("a", encoding="utf-8") as fh:
            fh.write("\n" + table)
        load_site(sb.site_file)
    _add_spark(sb)
    install_nodes(sb)
    return sb


def _allow_file_urls(sb: Sandbox) -> None:
    """A sandbox made before [site] url_schemes existed:
    its repos are file:// URLs, so allow them."""
    text = sb.site_file.read_text(encoding="utf-8")
    header = re.search(r"^\[site\][ \t]*$", text, re.MULTILINE)
    if header is None or re.search(r"^url_schemes\s*=", text, re.MULTILINE):
        return
    line = f"\nurl_schemes = {json.dumps(list(SANDBOX_URL_SCHEMES))}"
    sb.site_file.write_text(text[: header.end()] + line + text[header.end() :], encoding="utf-8")


def _add_spark(sb: Sandbox) -> None:
    """A sandbox made before the nodes existed: add
    [spark], the build node and the lane; keep the rest."""
    site = load_site(sb.site_file)
    if site.spark is not None or site.jovian is None:
        return
    text = sb.site_file.read_text(encoding="utf-8")
    if site.jovian.build_node is None:
        header = re.search(r"^\[jovian\][ \t]*$", text, re.MULTILINE)
        if header is None:  # [jovian] written some other way: leave the file to whoever wrote it
            return
        text = (
            text[: header.end()] + f"\nbuild_node = {json.dumps(BUILD_NODE)}" + text[header.end() :]
        )
    tables: dict[str, object] = {
        "spark": spark_section().model_dump(mode="json", exclude_none=True)
    }
    if site.jovian.lane is None:
        tables["jovian"] = {"lane": lane_section().model_dump(mode="json", exclude_none=True)}
    sb.site_file.write_text(text.rstrip("\n") + "\n\n" + tomli_w.dumps(tables), encoding="utf-8")
    load_site(sb.site_file)


def advance_harbor(
    root: Path = DEFAULT_DIR, *, fix: bool = False, version_bump: bool = True
) -> str:
    """Push one new commit to the sandbox harbor branch (a version bump unless told otherwise)."""
    sb = up(root)
    with _worktree(sb.harbor, HARBOR_BRANCH) as repo:
        wt = Path(repo.working_dir)
        pyproject = (wt / "pyproject.toml").read_text()
        version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE)
        assert version is not None
        old = version.group(1)
        new = harbor_source.bump_patch(old) if version_bump else old
        init = (wt / "harbor/__init__.py").read_text()
        revision = int(re.search(r"^REVISION = (\d+)", init, re.MULTILINE).group(1)) + 1  # type: ignore[union-attr]
        files = {
            "pyproject.toml": pyproject.replace(f'version = "{old}"', f'version = "{new}"', 1),
            "harbor/__init__.py": harbor_source.init_py(new, revision),
        }
        if fix:
            files["harbor/job.py"] = harbor_source.apply_fix((wt / "harbor/job.py").read_text())
        repo.index.add(_write(wt, files))
        what = (
            "fix(job): warn on config drift on resume instead of raising"
            if fix
            else f"harbor revision {revision}"
        )
        repo.index.commit(f"{what} ({new})", author=AUTHOR, committer=AUTHOR)
        return _publish(repo, sb.harbor, HARBOR_BRANCH)
