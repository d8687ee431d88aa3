"""The demo in a real browser: the asset graph, then re-lock -> build -> promote launched with
clicks; then, on the same running demo, the command line acting through its webserver.

`lockstep demo` runs on a fresh sandbox (tests/support/ui/dagster_dev.py); Playwright (from pip)
drives Debian's chromium (`apt-get install chromium`; `./dev` installs it — never `playwright
install`). The test does what the README tells a new user to do:

1. Lineage: both groups and every asset are there (docs/asset-graph.png is taken at the end).
2. The sensors' first runs finish; the user stops `harbor_branch_sensor` (so the re-lock below is
   the one they launch, not a race with the sensor), pushes the harbor fix upstream, and launches
   `relock_harbor` from its launchpad. The run pushes a new consumer commit.
3. `consumer_rebuild_sensor` (the sandbox sets rebuild_on_lock_change) builds that commit:
   `build_tpu` for the new partition must succeed (kaniko on fake iris, checks, smoke, verified).
4. The first build's (unverified) image is put on `:tpu` by hand, as before lockstep; `promote_tpu`
   from its launchpad (config pre-filled: action promote) moves `:tpu` from it.
5. The `tpu/floating_tag` page shows the move, and its changelog table the harbor fix it adds; the
   digest read from the page is what the registry says `:tpu` points at (docs/floating-tag.png).

6. The command line (a second test, on the same `dagster dev`: one start per module, ~30 s of both
   cores): `lockstep promote --plan`, `promote`, `rollback --plan`, `rollback`, `hold release
   tag|harbor` launch the tpu location's jobs through the webserver's GraphQL (the commands get only
   its URL: no DAGSTER_HOME, no database), follow the runs, exit by their outcome, and the records
   name who acted. It starts from the promotion above, stops every sensor (the only runs are then
   the commands'), and verifies a later build in process on the demo's instance to promote.

The demo runs every sensor; status_sensor and lane_watch_sensor (each minute: the registry, git,
every lane node's engine) are stopped at the start, as nothing here reads what they record.

Screenshots under docs/ are regenerated when LOCKSTEP_UPDATE_SCREENSHOTS=1; on failure a screenshot
of the page, its text and the demo's log go to the test's tmp dir and the output.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import git
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from jovian_assets.definitions import defs as jovian_defs
from jovian_assets.keys import LANE_WATCH_SENSOR
from lockstep.graphql import Webserver
from resources.registry import ImageRef, registry_for
from resources.secrets import redact
from resources.site.load import load_site
from sandbox.jovian_world import JovianRepos
from sandbox.world import CONSUMER_BRANCH, advance_harbor
from sensors.status import STATUS_SENSOR
from tests.conftest import sandbox_resources
from tests.support.runs import Pipeline, failure_message
from tests.support.ui.dagster_dev import ROOT, Demo, lockstep_command, stop_sensors
from tpu_assets.definitions import defs as tpu_defs
from tpu_assets.harbor_hold import HOLD
from tpu_assets.history import FLOATING_TAG
from tpu_assets.keys import HARBOR_LOCK

pytestmark = pytest.mark.heavy(380)  # about the seconds the module takes alone (-n 0)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The committed screenshots are rewritten only on request (LOCKSTEP_UPDATE_SCREENSHOTS=1), so a test
# run does not dirty the tree; otherwise they go to a temporary directory.
DOCS = (
    ROOT / "docs"
    if os.environ.get("LOCKSTEP_UPDATE_SCREENSHOTS") == "1"
    else Path(tempfile.mkdtemp(prefix="lockstep-shots-"))
)
VIEWPORT = {"width": 1600, "height": 1000}
GRAPH_SHOT = {"width": 2200, "height": 1250}

# The keys a new user is told about; the graph must
# show them and every other asset of both locations.
README_KEYS = [
    "tpu/harbor_lock",
    "tpu/image",
    "tpu/verified_image",
    "tpu/floating_tag",
    "jovian/source_lock",
    "jovian/fork_cut",
]
TERMINAL = {"Success", "Failure", "Canceled"}
STATUS_WORDS = (
    "Success",
    "Failure",
    "Canceled",
    "Canceling",
    "Started",
    "Starting",
    "Queued",
    "Not started",
)
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
COMMAND_TIMEOUT_S = 600
# What the browser test leaves for the command-line test after it: the build it promoted.
PROMOTED: dict[str, str] = {}


def defined_assets() -> dict[str, list[dg.AssetKey]]:
    """Every asset key of both code locations, by group (what the UI must show)."""
    groups: dict[str, list[dg.AssetKey]] = {}
    for defs in (tpu_defs, jovian_defs):
        graph = defs.get_repository_def().asset_graph
        for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
            groups.setdefault(graph.get(key).group_name, []).append(key)
    return groups


# -- the browser -----------------------------------------------------------------------------------


@pytest.fixture
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: this test drives Debian's chromium. Install it with "
            "`sudo apt-get install chromium` (./dev setup does; CI runs ./dev).",
            pytrace=False,
        )
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(20_000)
    pg = context.new_page()
    # First visit of a fresh instance: Dagster's "Join the
    # Dagster community" dialog. Skip it whenever it shows.
    skip = pg.get_by_role("button", name="Skip", exact=True)
    pg.add_locator_handler(skip, lambda: skip.click())
    try:
        yield pg
    finally:
        context.close()


@contextmanager
def diagnostics(page: Page, demo: Demo, tmp: Path) -> Iterator[None]:
    """On failure: a screenshot of the page into tmp,
    and the page text and the demo log in the output."""
    try:
        yield
    except BaseException:
        shot = tmp / "failure.png"
        try:
            page.screenshot(path=str(shot))
            text = page.inner_text("body")[-3000:]
        except Exception as exc:  # noqa: BLE001  # the page may be gone; the demo log still helps
            text = f"(page unavailable: {exc})"
        print(
            f"\n--- UI test failed on {page.url}; screenshot: {shot}\n--- page text (tail):\n{text}"
            f"\n--- demo log (tail):\n{demo.log_tail()}"
        )
        raise


# -- small helpers ---------------------------------------------------------------------------------


def wait_until(
    what: str | Callable[[], str],
    probe: Callable[[], object],
    timeout_s: float,
    every_s: float = 2.0,
) -> object:
    """Call `probe` until it returns something truthy; fail
    saying `what` (or what it returns) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(
                (
                    f"timed out after {timeout_s:.0f} s waiting for "
                    f"{what() if callable(what) else what}"
                ),
                pytrace=False,
            )
        time.sleep(every_s)


def run_rows(page: Page, runs_url: str) -> list[dict[str, str]]:
    """The rows of a runs list (a job's Runs tab), read
    from the page: run page href, status, row text."""
    page.goto(runs_url)
    page.get_by_text(re.compile(r"^(ID|No runs)")).first.wait_for()
    page.wait_for_timeout(500)  # the list renders right after its header
    rows = page.evaluate(
        """() => {
            // A row holds the run's short-id link (ID column) and its "View" link: the row is the
            // smallest element holding both (the page header may link the latest run too).
            const rows = [];
            for (const idLink of document.querySelectorAll('a[href^="/runs/"]')) {
                const m = (idLink.getAttribute('href') || '').match(/^\\/runs\\/([0-9a-f-]{36})$/);
                if (!m || !/^[0-9a-f]{8}$/.test(idLink.textContent.trim())) continue;
                const view = [...document.querySelectorAll(`a[href="/runs/${m[1]}"]`)]
                    .find(a => a.textContent.trim() === 'View');
                if (!view) continue;
                const above = new Set();
                for (let n = idLink; n; n = n.parentElement) above.add(n);
                let row = view;
                while (row && !above.has(row)) row = row.parentElement;
                if (row) rows.push({href: '/runs/' + m[1], text: row.innerText});
            }
            return rows;
        }"""
    )
    for row in rows:
        lines = [line.strip() for line in row["text"].splitlines()]
        row["status"] = next(
            (w for line in lines for w in STATUS_WORDS if line == w or line.startswith(w + " ")),
            "?",
        )
    return rows


def describe(rows: list[dict[str, str]]) -> str:
    return "; ".join(f"{r['href'][6:14]} {r['status']}" for r in rows) or "no runs"


def wait_run_page(page: Page, timeout_s: float) -> str:
    """On a run's page: wait for its status tag to be terminal; return it."""
    status = page.get_by_text(re.compile(r"^(Success|Failure|Canceled)$"))
    try:
        status.first.wait_for(timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        pytest.fail(f"run {page.url} did not finish within {timeout_s:.0f} s", pytrace=False)
    return status.first.inner_text().strip()


def open_job(page: Page, demo: Demo, job: str) -> None:
    """Jobs (left navigation) -> the job's row."""
    page.goto(demo.url + "/jobs")
    page.get_by_role("link").filter(has_text=re.compile(rf"^{job}$")).click()
    page.get_by_role("heading", name=job, exact=True).wait_for()


def launch_from_launchpad(
    page: Page, demo: Demo, job: str, expect_config: str | None = None
) -> str:
    """Jobs -> JOB -> Materialize ▾ -> Open launchpad
    -> Materialize. Returns the new run's page URL."""
    open_job(page, demo, job)
    materialize = page.get_by_role("button", name=re.compile(r"(^|\s)Materialize$")).first
    materialize.wait_for()
    page.wait_for_function(
        "() => ![...document.querySelectorAll('[role=progressbar]')].some(e => e.offsetParent)",
        # the button shows a spinner while the asset statuses load
        timeout=30_000,
    )
    materialize.locator("xpath=following::button[1]").click()  # the ▾ next to it
    page.get_by_role("menuitem").filter(has_text="Open launchpad").click()
    # "Launchpad (configure assets)"
    launchpad = page.get_by_role("dialog").filter(has_text=re.compile(r"Launchpad \("))
    confirm = page.get_by_role("button", name="Confirm", exact=True)
    launchpad.or_(confirm).first.wait_for()
    if confirm.is_visible():  # "upstream assets ... have not been materialized yet"
        confirm.click()
    launchpad.wait_for()
    expect(launchpad.get_by_text(re.compile(r"^Loading"))).to_have_count(0, timeout=60_000)
    if expect_config:
        try:
            expect(launchpad).to_contain_text(re.compile(expect_config), timeout=20_000)
        except AssertionError:
            raise AssertionError(
                f"the {job} launchpad should be pre-filled with {expect_config!r}; it shows:\n"
                f"{launchpad.inner_text()[:1500]}"
            ) from None
    launchpad.get_by_role("button", name=re.compile(r"(^|\s)Materialize$")).click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=30_000)
    return page.url


def metadata_value(page: Page, key: str) -> str:
    """The value cell of metadata row `key` on an asset
    page (the latest materialization's metadata)."""
    row = page.get_by_role("row").filter(has=page.get_by_role("cell", name=key, exact=True)).first
    row.wait_for()
    return row.get_by_role("cell").last.inner_text().strip()


def dismiss_community_dialog(page: Page) -> None:
    """A fresh instance greets the first visit with "Join the
    Dagster community": Skip it (it may take a moment)."""
    skip = page.get_by_role("button", name="Skip", exact=True)
    try:
        skip.wait_for(timeout=8_000)
    except PlaywrightTimeout:
        return
    try:
        skip.click(timeout=5_000)
    except PlaywrightTimeout:  # the page's locator handler won the race and clicked it first
        pass
    skip.wait_for(state="hidden")


def expand_all_groups(page: Page) -> None:
    """The graph's options (the gear at the bottom right)
    -> "Expand all groups", unless already expanded."""
    # The graph has laid out: collapsed groups (a fresh
    # browser) or asset nodes (the UI remembers expansion).
    page.locator("[aria-label='unfold_more']").or_(
        page.get_by_text("floating_tag", exact=True)
    ).first.wait_for()
    for attempt in range(3):  # a dialog popping up closes the menu: open it again
        page.get_by_role("button", name="settings", exact=True).last.click()
        option = page.get_by_role("menuitem").filter(
            has_text=re.compile(r"(Expand|Collapse) all groups")
        )
        try:
            if "Expand" in option.inner_text(timeout=5_000):
                option.click(timeout=5_000)
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
    page.keyboard.press("Escape")


def graph_extent(page: Page, pad: int = 24) -> dict[str, float]:
    """The part of the page the drawn graph covers (its
    groups and nodes), padded: the screenshot's clip."""
    box = page.evaluate(
        """() => {
            const boxes = [...document.querySelectorAll('svg foreignObject')]
                .map(e => e.getBoundingClientRect()).filter(b => b.width > 0 && b.height > 0);
            if (!boxes.length) return null;
            return {x: Math.min(...boxes.map(b => b.left)), y: Math.min(...boxes.map(b => b.top)),
                    right: Math.max(...boxes.map(b => b.right)), bottom: Math.max(...boxes.map(b => b.bottom))};
        }"""  # noqa: E501
    )
    size = page.viewport_size or GRAPH_SHOT
    if not box:
        return {"x": 0, "y": 0, "width": size["width"], "height": size["height"]}
    x, y = max(0, box["x"] - pad), max(0, box["y"] - pad)
    right, bottom = min(size["width"], box["right"] + pad), min(size["height"], box["bottom"] + pad)
    return {"x": x, "y": y, "width": right - x, "height": bottom - y}


# -- the test --------------------------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_demo_ui_relock_build_promote(page: Page, demo: Demo, tmp_path: Path) -> None:
    # `page` first: a missing chromium fails the test before the demo is started.
    started = time.monotonic()
    sb = demo.sandbox
    site = load_site(sb.site_file)
    consumer = git.Repo(sb.consumer)
    first_commit = consumer.commit(CONSUMER_BRANCH).hexsha

    with diagnostics(page, demo, tmp_path):
        assert set(stop_sensors(demo.url, {STATUS_SENSOR, LANE_WATCH_SENSOR})) == {
            STATUS_SENSOR,
            LANE_WATCH_SENSOR,
        }, "the demo should start every sensor running"
        # 1. The global asset lineage: both groups, every asset of both locations.
        groups = defined_assets()
        assert set(groups) == {"tpu", "jovian"}, f"asset groups are {sorted(groups)}"
        keys = [k.to_user_string() for ks in groups.values() for k in ks]
        assert set(README_KEYS) <= set(keys), (
            f"missing from the definitions: {sorted(set(README_KEYS) - set(keys))}"
        )
        page.goto(demo.url + "/asset-groups")
        page.get_by_text("Global asset lineage").wait_for()
        dismiss_community_dialog(page)
        expand_all_groups(page)
        for group, group_keys in groups.items():
            assert page.get_by_text(group, exact=True).first.is_visible(), (
                f"group {group} is not on the graph"
            )
            for key in group_keys:  # a node is labelled with the last part of its key
                node = page.get_by_text(key.path[-1], exact=True).first
                node.wait_for()
                assert node.is_visible(), f"asset {key.to_user_string()} is not on the graph"
        # ... and under their full keys in the catalog (tall
        # viewport: the list renders only what is on screen)
        page.set_viewport_size({"width": VIEWPORT["width"], "height": 3000})
        page.get_by_role("link", name=re.compile("Catalog")).click()
        for key in (k for ks in groups.values() for k in ks):
            page.get_by_text(" / ".join(key.path), exact=True).first.wait_for()
        page.set_viewport_size(VIEWPORT)
        print(f"\n[ui] graph and catalog checked at {time.monotonic() - started:.0f} s")

        # 2. The sensors' first re-lock (nothing to do yet)
        #    finishes; stop harbor_branch_sensor; push the fix.
        relock_runs = f"{demo.url}/locations/tpu/jobs/relock_harbor/runs"

        def startup_relock_done() -> bool:
            rows = run_rows(page, relock_runs)
            failed = [r for r in rows if r["status"] == "Failure"]
            assert not failed, (
                f"the sensor's first relock_harbor failed: {demo.url}{failed[0]['href']}"
            )
            return bool(rows) and all(r["status"] in TERMINAL for r in rows)

        wait_until(
            "the first relock_harbor run (harbor_branch_sensor) to finish", startup_relock_done, 240
        )
        page.goto(demo.url + "/automation")
        page.get_by_role("link").filter(has_text=re.compile(r"^harbor_branch_sensor")).click()
        running = page.get_by_role("row", name="Running").get_by_role("checkbox")
        running.wait_for(state="attached")  # a styled switch: the input itself is hidden
        if running.is_checked():
            running.dispatch_event("click")
        wait_until(
            "harbor_branch_sensor to show as stopped", lambda: not running.is_checked(), 20, 0.5
        )
        fix = advance_harbor(sb.root, fix=True)
        print(f"[ui] harbor fix {fix[:8]} pushed at {time.monotonic() - started:.0f} s")

        # 3. relock_harbor from the UI: it re-locks the consumer on the fix and pushes one commit.
        run_url = launch_from_launchpad(page, demo, "relock_harbor")
        status = wait_run_page(page, 240)
        assert status == "Success", (
            f"relock_harbor launched from the UI ended in {status}: {run_url}"
        )
        relocked = consumer.commit(CONSUMER_BRANCH)
        assert relocked.hexsha != first_commit, (
            "relock_harbor succeeded but pushed no consumer commit"
        )
        assert f"#{fix}" in consumer.git.show(f"{relocked.hexsha}:uv.lock"), (
            "the pushed uv.lock does not pin the fix"
        )
        print(
            f"[ui] relock_harbor {run_url.rsplit('/', 1)[1][:8]} pushed {relocked.hexsha[:8]} "
            f"at {time.monotonic() - started:.0f} s"
        )

        # 4. build_tpu for that commit: started by consumer_rebuild_sensor (rebuild_on_lock_change).
        build_runs = f"{demo.url}/locations/tpu/jobs/build_tpu/runs"
        partition = f"partition: {relocked.hexsha}"

        seen: list[dict[str, str]] = []

        def build_succeeded() -> bool:
            seen[:] = run_rows(page, build_runs)
            rows = [r for r in seen if partition in r["text"]]
            failed = [r for r in rows if r["status"] in ("Failure", "Canceled")]
            assert not failed, (
                f"build_tpu for {relocked.hexsha[:8]} ended in {failed[0]['status']}: "
                f"{demo.url}{failed[0]['href']}"
            )
            return any(r["status"] == "Success" for r in rows)

        wait_until(
            lambda: (
                f"a successful build_tpu run for partition {relocked.hexsha[:8]} (build_tpu "
                f"runs: {describe(seen)})"
            ),
            build_succeeded,
            300,
            3,
        )
        print(
            f"[ui] build_tpu {relocked.hexsha[:8]} verified at {time.monotonic() - started:.0f} s"
        )

        # The runbook's starting point: the first build's image (the unfixed guard, never verified)
        # was put on :tpu by hand before lockstep, so the promotion has
        # a harbor to compare with: its changelog is the fix.
        ref = ImageRef.parse(site.tpu.image)
        registry = registry_for(site)
        broken = registry.resolve(
            repository=ref.repository,
            reference=f"tpu-{consumer.git.rev_parse('--short', first_commit)}",
        )
        assert broken is not None, "the first (failing) build pushed no pinned tag"
        registry.tag(repository=ref.repository, digest=broken, tag=site.tpu.floating_tag)
        fix_subject = git.Repo(sb.harbor).commit(fix).summary

        # 5. promote_tpu from the UI (its launchpad config is pre-filled: action promote).
        run_url = launch_from_launchpad(
            page, demo, "promote_tpu", expect_config=r"action:\s*promote"
        )
        status = wait_run_page(page, 180)
        assert status == "Success", f"promote_tpu launched from the UI ended in {status}: {run_url}"
        print(
            f"[ui] promote_tpu {run_url.rsplit('/', 1)[1][:8]} done at "
            f"{time.monotonic() - started:.0f} s"
        )

        # 6. tpu/floating_tag: the move as the page shows it, against the registry.
        page.set_viewport_size({"width": VIEWPORT["width"], "height": 1300})
        page.goto(demo.url + "/assets/tpu/floating_tag")
        to_digest = metadata_value(page, "to_digest")
        action, build = metadata_value(page, "action"), metadata_value(page, "build")
        assert DIGEST.fullmatch(to_digest), (
            f"to_digest on the tpu/floating_tag page is {to_digest!r}"
        )
        assert action == "promote" and build == relocked.hexsha, (action, build)
        page.get_by_text(re.compile(r"promote :tpu .* -> " + re.escape(to_digest))).first.wait_for()
        assert metadata_value(page, "from_digest") == broken, (
            "the promotion does not start from the hand-moved digest"
        )
        # The changelog table: the harbor commit this
        # promotion adds, as a row of the page's metadata.
        changelog = (
            page.get_by_role("row")
            .filter(has=page.get_by_role("cell", name="changelog", exact=True))
            .first
        )
        changelog.get_by_role("cell", name=fix_subject, exact=True).wait_for()
        assert changelog.get_by_role("cell", name=fix_subject, exact=True).is_visible(), (
            f"{fix_subject!r} is not shown"
        )
        assert changelog.get_by_role("cell", name=fix, exact=True).is_visible(), (
            f"the fix {fix[:8]}'s row has no sha"
        )
        in_registry = registry.resolve(repository=ref.repository, reference=site.tpu.floating_tag)
        assert to_digest == in_registry, (
            f"the page says :tpu -> {to_digest}, the registry says {in_registry}"
        )
        PROMOTED["build"] = relocked.hexsha
        DOCS.mkdir(exist_ok=True)
        # The status section loads last: its "Latest
        # materialization" tag reads "N seconds/minutes ago".
        page.get_by_text(re.compile(r"^(\d+|a|an|a few) (seconds?|minutes?) ago$")).first.wait_for()
        page.wait_for_timeout(1000)
        page.evaluate("() => document.activeElement && document.activeElement.blur()")
        page.screenshot(path=str(DOCS / "floating-tag.png"))

        # The graph after the run, both groups expanded, for the README: a wide window without the
        # group tree on the left, cropped to the graph. Node colours are the latest status (the
        # first build's red is the sandbox's deliberate failure).
        page.set_viewport_size(GRAPH_SHOT)
        page.goto(demo.url + "/asset-groups")
        page.get_by_text("Global asset lineage").wait_for()
        tree_toggle = page.get_by_role("button", name="panel_show_right", exact=True)
        if tree_toggle.is_visible():
            tree_toggle.click()
        expand_all_groups(page)
        page.get_by_text("floating_tag", exact=True).first.wait_for()
        wait_until(
            "the graph's nodes to load their status",
            lambda: page.get_by_text("Loading...").count() == 0,
            30,
            0.5,
        )
        page.evaluate("() => document.activeElement && document.activeElement.blur()")
        page.wait_for_timeout(500)
        page.screenshot(path=str(DOCS / "asset-graph.png"), clip=graph_extent(page))
        print(
            f"[ui] :tpu -> {to_digest} (registry agrees); screenshots in {DOCS}; "
            f"at {time.monotonic() - started:.0f} s"
        )

        # 7. A sensor tick that found nothing says why: lab_rev_sensor (running all along, every 30
        #    s) shows its skip reason, naming the remote and the sha
        # it saw, on the latest tick's "0 runs requested".
        jovian = site.jovian
        assert jovian is not None
        tip = git.Repo(JovianRepos(repos=sb.repos).lab).commit(jovian.lab_branch).hexsha
        reason = f"{jovian.lab_branch} on {redact(jovian.lab_repo)} still at {tip}"
        page.set_viewport_size(VIEWPORT)
        page.goto(demo.url + "/automation")
        page.get_by_role("link").filter(has_text=re.compile(r"^lab_rev_sensor")).click()
        page.get_by_text("Latest tick", exact=True).wait_for()
        latest = (
            page.get_by_role("row")
            .filter(has_text="Latest tick")
            .get_by_text("0 runs requested", exact=True)
        )
        latest.hover()
        expect(page.get_by_text(reason, exact=True).first).to_be_visible(timeout=10_000)
        print(
            f"[ui] lab_rev_sensor's skip reason shown: {reason!r}; "
            f"{time.monotonic() - started:.0f} s in the browser"
        )


# -- the command line, through the same webserver -------------------------------------------------


def lockstep(demo: Demo, *args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`lockstep ARGS --url <the server>` as a person on a laptop runs it: no DAGSTER_HOME, no site
    file (unless `home`: the in-process planner's path)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "LOCKSTEP_SITE")}
    if home is not None:
        env |= {"DAGSTER_HOME": str(home), "LOCKSTEP_SITE": str(demo.sandbox.site_file)}
    return subprocess.run(
        [str(lockstep_command()), *args, "--url", demo.url],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        cwd=ROOT,
    )


def said(done: subprocess.CompletedProcess[str], demo: Demo) -> str:
    return (
        f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-3000:]}\n"
        f"dagster dev:\n{demo.log_tail(3000)}"
    )


def refresh_status(demo: Demo) -> None:
    """Launch refresh_status and wait for it: the status record `--plan` reads is new
    (status_sensor, which records it each minute, is stopped here)."""
    web = Webserver(demo.url)
    run_id = web.launch(location="tpu", job="refresh_status", run_config={}, tags={})
    *_, final = web.run_events(run_id, deadline_s=COMMAND_TIMEOUT_S)
    assert final == "SUCCESS", f"refresh_status ended {final}; dagster dev:\n{demo.log_tail(3000)}"


def wait_runs_finished(instance: dg.DagsterInstance, demo: Demo) -> None:
    """Until no run the sensors launched before they were stopped is still queued or running."""

    def idle() -> bool:
        return all(r.dagster_run.is_finished for r in instance.get_run_records())

    wait_until(
        lambda: f"the sensors' runs to finish; dagster dev:\n{demo.log_tail(3000)}",
        idle,
        COMMAND_TIMEOUT_S,
        1,
    )


def newest_move(instance: dg.DagsterInstance) -> dict[str, object]:
    record = instance.fetch_materializations(FLOATING_TAG, limit=1).records[0]
    meta = record.asset_materialization.metadata  # type: ignore[union-attr]
    return {"run_id": record.run_id, **{k: getattr(v, "value", v) for k, v in meta.items()}}


def run_text(instance: dg.DagsterInstance, run_id: str) -> str:
    return "\n".join(e.user_message for e in instance.all_logs(run_id))


@pytest.mark.timeout(900)
def test_promote_rollback_and_hold_release_through_the_webserver_record_who_acted(
    demo: Demo, tmp_path: Path
) -> None:
    assert "build" in PROMOTED, (
        "this test continues from the promotion test_demo_ui_relock_build_promote makes"
    )
    older, sb = PROMOTED["build"], demo.sandbox
    home = sb.root / "dagster_home"  # the demo's instance (lockstep/cli.py demo)
    stop_sensors(demo.url)  # the only runs from here on are the commands'
    with dg.DagsterInstance.from_config(str(home)) as instance:
        wait_runs_finished(instance, demo)
        tpu = Pipeline(sb, sandbox_resources(sb, tmp_path / "cache"), instance)
        assert tpu.floating() == tpu.pinned(older)
        # A later harbor commit that keeps the fix, re-locked and verified in process: the
        # build to promote.
        advance_harbor(sb.root)
        newer = tpu.relock()
        built = tpu.build(newer)
        assert built.success, failure_message(built)
        acted(demo, home, instance, tpu, older, newer)


def acted(
    demo: Demo, home: Path, instance: dg.DagsterInstance, tpu: Pipeline, older: str, newer: str
) -> None:
    """The commands, in a person's order, against `demo`; `older` is on :tpu, `newer` verified."""
    # --plan changes nothing: the tag stays where it is, and no run is launched.
    refresh_status(demo)
    runs_before = len(instance.get_run_records())
    planned = lockstep(demo, "promote", "--plan")
    assert planned.returncode == 0, said(planned, demo)
    assert newer[:8] in planned.stdout, said(planned, demo)
    planned_json = lockstep(demo, "promote", "--plan", "--build", newer[:10], "--json", home=home)
    assert planned_json.returncode == 0, said(planned_json, demo)
    shown = json.loads(planned_json.stdout)
    assert shown["ok"] is True and shown["target"]["build"] == newer and shown["plan"] is True
    assert tpu.floating() == tpu.pinned(older)

    # promote as alice: the tag moves to the newer build; the run and its record name alice.
    promoted = lockstep(demo, "promote", "--by", "alice", "--note", "ship the fix", "--json")
    assert promoted.returncode == 0, said(promoted, demo)
    answer = json.loads(promoted.stdout)
    assert answer["status"] == "SUCCESS" and answer["outcome"] == "ok" and answer["by"] == "alice"
    assert answer["url"] == f"{demo.url}/runs/{answer['run_id']}"
    assert tpu.floating() == tpu.pinned(newer) and answer["move"]["to_digest"] == tpu.pinned(newer)
    run = instance.get_run_by_id(answer["run_id"])
    assert run is not None and run.job_name == "promote_tpu"
    assert run.tags["lockstep/by"] == "alice" and run.tags["lockstep/cli"] == "promote"
    move = newest_move(instance)
    assert move["run_id"] == answer["run_id"] and move["action"] == "promote"
    assert move["note"] == "ship the fix"
    assert move.get("by") == "alice", move
    assert "alice" in run_text(instance, answer["run_id"])

    # A second promote is a negative answer (the tag is already there): exit 1, nothing moves.
    again = lockstep(demo, "promote", "--by", "alice")
    assert again.returncode == 1, said(again, demo)
    assert "refused" in again.stdout, said(again, demo)
    assert "already points at" in again.stdout, said(again, demo)  # and why
    assert tpu.floating() == tpu.pinned(newer)

    # The two promotes; no plan launched a run.
    assert len(instance.get_run_records()) == runs_before + 2
    refresh_status(demo)
    planned = lockstep(demo, "rollback", "--plan")
    assert planned.returncode == 0, said(planned, demo)
    assert older[:8] in planned.stdout, said(planned, demo)
    assert "nothing was changed" in planned.stdout, said(planned, demo)
    assert tpu.floating() == tpu.pinned(newer)
    assert len(instance.get_run_records()) == runs_before + 3  # and the refresh

    # rollback as bob (the log printed as it comes): back to the older build, hold set.
    rolled = lockstep(demo, "rollback", "--by", "bob", "--note", "bad harbor")
    assert rolled.returncode == 0, said(rolled, demo)
    assert f"{demo.url}/runs/" in rolled.stdout and "SUCCESS" in rolled.stdout
    # The run's log, as it came.
    assert "rollback by bob: bad harbor" in rolled.stdout, said(rolled, demo)
    assert tpu.floating() == tpu.pinned(older)
    move = newest_move(instance)
    assert move["action"] == "rollback" and move["hold"] is True and move.get("by") == "bob", move
    assert "bob" in run_text(instance, str(move["run_id"]))
    held_record = instance.fetch_materializations(HARBOR_LOCK, limit=1).records[0]
    harbor_held = held_record.asset_materialization
    assert harbor_held is not None and harbor_held.metadata[HOLD].value is True  # scope auto: both

    # Release both holds, as carol: the tag's, then harbor's (re-locked to the tip, pushed).
    released = lockstep(demo, "hold", "release", "tag", "--by", "carol")
    assert released.returncode == 0, said(released, demo)
    move = newest_move(instance)
    assert move["action"] == "release_hold" and move["hold"] is False, move
    assert move.get("by") == "carol", move
    assert tpu.floating() == tpu.pinned(older)  # a release moves nothing

    relocked = lockstep(demo, "hold", "release", "harbor", "--by", "carol", "--json")
    assert relocked.returncode == 0, said(relocked, demo)
    lock = instance.fetch_materializations(HARBOR_LOCK, limit=1).records[0]
    meta = lock.asset_materialization.metadata  # type: ignore[union-attr]
    assert lock.run_id == json.loads(relocked.stdout)["run_id"]
    assert meta[HOLD].value is False and meta["by"].value == "carol"
    assert "harbor hold released by carol" in run_text(instance, lock.run_id)

    # No hold left: releasing it again is a refusal (exit 1), not a crash.
    none_left = lockstep(demo, "hold", "release", "harbor", "--by", "carol")
    assert none_left.returncode == 1, said(none_left, demo)
    assert "no harbor hold to release" in none_left.stdout, said(none_left, demo)
