"""The lane's bench as lockstep reads it: the REAL tool-eval-bench and llama-benchy (run once per
module against sandbox/model_server.py), their outputs
parsed, the gate against a recorded baseline, the
report and the night-shift tables."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import git
import pytest
from click.testing import CliRunner

from jovian_assets.bench_tools import (
    Baseline,
    BenchOutputError,
    QualityRun,
    baseline_from_report,
    baseline_json,
    gate,
    night_shift_rows,
    parse_baseline,
    parse_perf,
    parse_quality,
    render_command,
    report_markdown,
    update_night_shift,
)
from lockstep.cli import main
from resources.errors import FileFormatError
from sandbox.jovian_world import BUILD_BRANCH
from sandbox.world import Sandbox
from tests.support.bench_run import (
    BENCH_BIN,
    bench_installed,
    make_site,
    model_server_argv,
    model_server_env,
    offline,
    perf_argv,
    quality_argv,
    run_tool,
    start_model_server,
)
from tests.support.servers import free_port, stop_process

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "bench"
LANE = "glm53-2x"
IMAGE = "sha256:" + "ab" * 32
WHEN = datetime(2026, 12, 1, 2, 30, tzinfo=UTC)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One run of each real tool against a good rev's model (a broken rev's:
    tests/jovian/test_node_build.py)."""
    assert bench_installed(), f"the real bench tools are not in {BENCH_BIN}: run ./dev setup"
    work = tmp_path_factory.mktemp("bench")
    home = work / "home"
    home.mkdir()
    tokenizer, book = offline(home)
    outs: dict[str, Path] = {}
    server = start_model_server(make_site(work / "site", broken=False), work / "server.log")
    try:
        outs["good"], outs["perf"], outs["log"] = work / "good.json", work / "perf.json", server.log
        done = run_tool(quality_argv(server.base_url, outs["good"]), work, home)
        assert done.returncode == 0, done.stderr[-3000:]
        done = run_tool(perf_argv(server.base_url, outs["perf"], tokenizer, book), work, home)
        assert done.returncode == 0, done.stdout[-3000:]
    finally:
        server.stop()
    return outs


def quality(path: Path) -> QualityRun:
    return parse_quality(path.read_bytes(), str(path))


def baseline_of(run: QualityRun, **changes: object) -> Baseline:
    return Baseline(
        lane=LANE,
        rev="r27",
        image_id=IMAGE,
        recorded_at=WHEN,
        recorded_by="night shift <n@x>",
        run=run.model_copy(update=changes),
    )


# -- the real tools' current output ----------------------------------------------------------------


def test_parser_reads_what_the_real_tool_eval_bench_writes_now(real: dict[str, Path]) -> None:
    run = quality(real["good"])
    assert (run.tool, run.tool_version, run.seed) == ("tool-eval-bench", "3.0.0", 42)
    assert (run.graded, run.total, run.completion_rate) == (15, 15, 100.0)  # --short: the core 15
    assert [c.category for c in run.categories] == ["A", "B", "C", "D", "E"]
    assert run.final_score == round(
        100 * sum(c.earned for c in run.categories) / sum(c.max for c in run.categories)
    )
    # Same flags, same server: the same cohort as the
    # committed run, which is the tool's own cohort for it.
    corpus = quality(CORPUS / "teb_short_good.json")
    assert run.cohort == corpus.cohort == (CORPUS / "teb_short_good.cohort").read_text().strip()
    # it folds in the endpoint (another port)
    assert run.config_fingerprint != corpus.config_fingerprint


def test_a_broken_revs_model_scores_lower_in_the_same_cohort() -> None:
    good, broken = (
        quality(CORPUS / "teb_short_good.json"),
        quality(CORPUS / "teb_short_broken.json"),
    )
    assert broken.final_score < good.final_score
    # comparable: only the model differs
    assert broken.cohort == good.cohort and broken.graded == good.graded
    verdict = gate(broken, baseline_of(good), 1.0, lane=LANE)
    assert verdict.comparable and not verdict.passed and "regression" in verdict.description
    assert gate(good, baseline_of(good), 1.0, lane=LANE).passed


def test_the_model_server_logs_each_request_and_vllms_readiness_lines(
    real: dict[str, Path],
) -> None:
    log = real["log"].read_text()
    assert log.index("GPU KV cache size: 1,234,560 tokens") < log.index(
        "INFO:     Application startup complete."
    )
    assert (
        '"POST /v1/chat/completions HTTP/1.1" 200 OK' in log
        and '"GET /v1/models HTTP/1.1" 200 OK' in log
    )


def test_perf_rows_from_the_real_llama_benchy(real: dict[str, Path]) -> None:
    perf = parse_perf(real["perf"].read_bytes(), str(real["perf"]))
    assert perf.tool_version == "0.4.0"
    assert [(r.test, r.concurrency) for r in perf.rows] == [
        ("pp64", 1),
        ("tg8", 1),
        ("pp64", 2),
        ("tg8", 2),
    ]
    assert all(r.tokens_per_s and r.tokens_per_s > 0 for r in perf.rows)


def _shape(doc: object, at: str = "$") -> set[str]:
    if isinstance(doc, dict):
        return {at} | {p for k, v in doc.items() for p in _shape(v, f"{at}.{k}")}
    if isinstance(doc, list):
        return {at} | ({p for p in _shape(doc[0], f"{at}[]")} if doc else set())
    return {f"{at}:{type(doc).__name__}"}


@pytest.mark.parametrize(
    ("corpus", "fresh"), [("teb_short_good.json", "good"), ("benchy_pp64_tg8_c1c2.json", "perf")]
)
def test_the_committed_corpus_has_the_shape_the_tools_write_now(
    real: dict[str, Path], corpus: str, fresh: str
) -> None:
    # free text, may be null
    keep = {"$.scores.scenario_results[].note", "$.scores.scenario_results[].raw_log"}

    def shape(path: Path) -> set[str]:
        return {p for p in _shape(json.loads(path.read_text())) if p.split(":")[0] not in keep}

    assert shape(CORPUS / corpus) == shape(real[fresh])


# -- refusals: garbled, wrong-typed, failed -------------------------------------------------------


def _good_doc() -> dict:
    return json.loads((CORPUS / "teb_short_good.json").read_text())


def test_a_wrong_typed_field_names_the_file_the_json_path_and_the_value() -> None:
    doc = _good_doc()
    doc["scores"]["category_scores"][2]["percent"] = "lots"
    with pytest.raises(BenchOutputError) as exc:
        parse_quality(json.dumps(doc).encode(), "spark-a:lockstep-bench/r28/quality.json")
    assert str(exc.value).startswith(
        "spark-a:lockstep-bench/r28/quality.json: $.scores.category_scores[2].percent: "
    )
    assert "'lots'" in str(exc.value)


def test_garbled_json_is_refused_with_its_line() -> None:
    raw = (CORPUS / "teb_short_good.json").read_bytes()[:5000]
    with pytest.raises(BenchOutputError, match=r"^q\.json:\d+: not JSON .*cut short"):
        parse_quality(raw, "q.json")


def test_an_empty_result_and_a_failed_run_say_so() -> None:
    with pytest.raises(BenchOutputError, match="wrote nothing here.*dead pipe pump"):
        parse_quality(b"", "q.json")
    with pytest.raises(BenchOutputError, match="reported a failed run: Connection refused"):
        parse_quality(b'{"error": "Connection refused"}', "q.json")


def test_graded_count_is_checked_against_the_scenarios() -> None:
    doc = _good_doc()
    doc["scores"]["max_points"] = 20
    with pytest.raises(BenchOutputError, match=r"max_points 20 grades 10 scenarios"):
        parse_quality(json.dumps(doc).encode(), "q.json")


def test_excluded_scenarios_lower_the_graded_count_and_the_completion_rate() -> None:
    doc = _good_doc()
    doc["scores"].update(excluded_scenarios=["TC-14", "TC-15"], completion_rate=86.7, max_points=26)
    run = parse_quality(json.dumps(doc).encode(), "q.json")
    assert (run.graded_text, run.completion_rate, run.excluded) == (
        "13/15",
        86.7,
        ["TC-14", "TC-15"],
    )
    verdict = gate(
        run, baseline_of(parse_quality(json.dumps(_good_doc()).encode(), "b.json")), 1.0, lane=LANE
    )
    assert (
        not verdict.comparable
        and "graded on 15/15 scenarios, this run on 13/15" in verdict.description
    )


def test_a_garbled_llama_benchy_row_names_its_path() -> None:
    doc = json.loads((CORPUS / "benchy_pp64_tg8_c1c2.json").read_text())
    doc["benchmarks"][1]["concurrency"] = 0
    with pytest.raises(
        BenchOutputError, match=r"^p\.json: \$\.benchmarks\[1\]\.concurrency: .*\(got 0\)"
    ):
        parse_perf(json.dumps(doc).encode(), "p.json")


# -- the gate -------------------------------------------------------------------------------------


def test_a_baseline_from_another_tool_version_is_not_comparable() -> None:
    run = parse_quality((CORPUS / "teb_short_good.json").read_bytes(), "q.json")
    old = baseline_of(
        run, tool_version="2.6.1.dev46+g9d412464a", final_score=5, graded=88, total=88
    )
    verdict = gate(run, old, 1.0, lane=LANE)
    assert not verdict.passed and not verdict.comparable
    assert verdict.description.startswith(
        "baseline is tool-eval-bench 2.6.1.dev46+g9d412464a, this run is 3.0.0"
    )
    assert "not comparable; re-baseline" in verdict.description and "15/15" in verdict.description


def test_another_cohort_is_not_comparable_and_a_missing_baseline_says_how_to_record_one() -> None:
    run = parse_quality((CORPUS / "teb_short_good.json").read_bytes(), "q.json")
    verdict = gate(run, baseline_of(run, cohort="0123456789ab", seed=7), 1.0, lane=LANE)
    assert (
        not verdict.comparable and "baseline is cohort 0123456789ab (seed 7" in verdict.description
    )
    missing = gate(run, None, 1.0, lane=LANE)
    assert (
        not missing.passed
        and "lockstep lane rebaseline" in missing.description
        and "15/15" in missing.description
    )


# -- the report, the record, the night-shift tables ------------------------------------------------


def _report(run: QualityRun, baseline: Baseline | None = None) -> str:
    perf = parse_perf((CORPUS / "benchy_pp64_tg8_c1c2.json").read_bytes(), "p.json")
    return report_markdown(
        lane=LANE,
        rev="r28",
        tag="jovian-judgement:r28-glm53",
        image_id=IMAGE,
        node="spark-a",
        stamp="20261201T023000Z",
        quality=run,
        perf=perf,
        verdict=gate(run, baseline, 1.0, lane=LANE),
        baseline=baseline,
    )


def test_the_report_names_the_served_image_and_the_runs_identity_and_can_become_the_baseline() -> (
    None
):
    run = parse_quality((CORPUS / "teb_short_good.json").read_bytes(), "q.json")
    text = _report(run)
    for needle in (
        IMAGE,
        "tool-eval-bench 3.0.0",
        "seed 42",
        "graded 15/15 scenarios",
        "completion_rate 100%",
        f"config_fingerprint `{run.config_fingerprint}`",
        "| pp64 | c2 |",
    ):
        assert needle in text
    base = baseline_from_report(
        text, "recipes/glm53-2x/reports/x.md", lane=LANE, recorded_at=WHEN, recorded_by="n <n@x>"
    )
    assert (base.rev, base.image_id, base.run) == ("r28", IMAGE, run)
    again = parse_baseline(baseline_json(base).encode(), "baseline.json")
    assert again == base and gate(run, again, 1.0, lane=LANE).passed


def test_a_report_without_a_record_or_with_a_bad_one_cannot_be_a_baseline() -> None:
    with pytest.raises(FileFormatError, match="no `<!-- lockstep:run"):
        baseline_from_report(
            "# a hand-written report\n", "r.md", lane=LANE, recorded_at=WHEN, recorded_by="n <n@x>"
        )
    run = parse_quality((CORPUS / "teb_short_good.json").read_bytes(), "q.json")
    text = _report(run).replace('"final_score": 17', '"final_score": "high"')
    with pytest.raises(FileFormatError, match=r"^r\.md:\d+: run record \$\.run\.final_score"):
        baseline_from_report(text, "r.md", lane=LANE, recorded_at=WHEN, recorded_by="n <n@x>")


def test_a_second_run_the_same_night_adds_rows_and_keeps_everything_else() -> None:
    run = parse_quality((CORPUS / "teb_short_good.json").read_bytes(), "q.json")
    perf = parse_perf((CORPUS / "benchy_pp64_tg8_c1c2.json").read_bytes(), "p.json")
    verdict = gate(run, baseline_of(run), 1.0, lane=LANE)

    def rows(stamp: str, rev: str) -> tuple[list[str], list[str]]:
        return night_shift_rows(
            stamp=stamp,
            lane=LANE,
            rev=rev,
            image_id=IMAGE,
            quality=run,
            perf=perf,
            verdict=verdict,
            report=f"recipes/{LANE}/reports/{stamp}_{rev}.md",
        )

    first = update_night_shift(
        None,
        date="2026-12-01",
        score_rows=rows("20261201T013000Z", "r28")[0],
        perf_rows=rows("20261201T013000Z", "r28")[1],
    )
    edited = first.replace("## Perf", "A person's note: lane ran hot.\n\n## Perf")
    second = update_night_shift(
        edited,
        date="2026-12-01",
        score_rows=rows("20261201T033000Z", "r29")[0],
        perf_rows=rows("20261201T033000Z", "r29")[1],
    )
    assert edited.splitlines() == [
        line for line in second.splitlines() if "20261201T033000Z" not in line
    ]
    scores = second[second.index("## Scores") : second.index("## Perf")]
    table = [line for line in scores.splitlines() if line.startswith("| 2026")]
    assert [line.split(" | ")[2] for line in table] == ["r28", "r29"]
    assert "| 17 | pass |" in table[1] and "15/15" in table[1]
    assert (
        len(
            [
                line
                for line in second.splitlines()
                if line.startswith("| 20261201T033000Z") and "| tg8 |" in line
            ]
        )
        == 2
    )


def test_text_from_the_tools_cannot_break_a_table_row() -> None:
    doc = _good_doc()
    doc["scores"]["category_scores"][0]["label"] = "Tool | Selection\n## injected"
    run = parse_quality(json.dumps(doc).encode(), "q.json")
    text = _report(run)
    assert "| A | Tool \\| Selection ## injected |" in text and "\n## injected" not in text


def test_site_bench_commands_fill_placeholders_as_single_words() -> None:
    argv = render_command(
        [
            "tool-eval-bench",
            "run",
            "--seed",
            "{seed}",
            "--base-url",
            "{base_url}",
            "--json-file",
            "{out}",
        ],
        base_url="http://127.0.0.1:8000",
        model="m",
        seed="42",
        out="a b;rm -rf x",
    )
    assert argv[-1] == "a b;rm -rf x" and argv[3] == "42"


# -- the model server's CLI contract, and re-baselining from a filed report ------------------------


def test_the_model_server_binds_only_at_startup_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    site = make_site(tmp_path, broken=False, delays_s=(0.2, 0.3))
    proc = subprocess.Popen(
        model_server_argv(port, "m"), stdout=subprocess.PIPE, text=True, env=model_server_env(site)
    )
    try:
        assert proc.stdout is not None
        lines = []
        while "Application startup complete." not in (line := proc.stdout.readline()):
            lines.append(line)
            if "GPU KV cache size: 1,234,560 tokens" in line:
                with pytest.raises(OSError):  # nothing answers before startup, as vLLM's API server
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
            assert line, "".join(lines)
        assert any("GPU KV cache size" in line for line in lines)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            assert json.load(r)["data"][0]["id"] == "m"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        stop_process(proc, grace_s=2)


def test_rebaseline_makes_a_filed_reports_run_the_lanes_baseline(
    sb: Sandbox, private_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    build = sb.repos / "docker-images.git"
    run = quality(CORPUS / "teb_short_broken.json")  # not the sandbox's recorded baseline run
    rel = f"recipes/{LANE}/reports/20261201T023000Z_r28.md"
    clone = git.Repo.clone_from(build.as_uri(), tmp_path / "clone", branch=BUILD_BRANCH)
    (tmp_path / "clone" / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "clone" / rel).write_text(_report(run))
    clone.git.add(rel)
    clone.git.commit(
        "-m",
        "bench: r28",
        env={
            "GIT_AUTHOR_NAME": "n",
            "GIT_AUTHOR_EMAIL": "n@x",
            "GIT_COMMITTER_NAME": "n",
            "GIT_COMMITTER_EMAIL": "n@x",
        },
    )
    clone.git.push("origin", BUILD_BRANCH)
    monkeypatch.setenv("LOCKSTEP_SITE", str(sb.site_file))
    before = parse_baseline(
        git.Repo(build).git.show(f"{BUILD_BRANCH}:recipes/{LANE}/baseline.json").encode(), "b"
    )
    assert before.run.final_score != run.final_score

    done = CliRunner().invoke(main, ["lane", "rebaseline", rel])
    assert done.exit_code == 0, done.output
    assert (
        f"glm53-2x: baseline is r28's run {run.run_id} (tool-eval-bench 3.0.0, score 0, "
        "graded 15/15"
    ) in done.output
    after = parse_baseline(
        git.Repo(build).git.show(f"{BUILD_BRANCH}:recipes/{LANE}/baseline.json").encode(), "b"
    )
    assert (after.rev, after.image_id, after.run) == ("r28", IMAGE, run)
    head = git.Repo(build).git.rev_parse(BUILD_BRANCH)
    for bad, why in (
        ("../../etc/passwd.md", "is not a plain name"),
        ("recipes/other-lane/reports/x.md", "not a report of"),
        (f"recipes/{LANE}/reports/missing.md", "has no recipes/"),
    ):
        refused = CliRunner().invoke(main, ["lane", "rebaseline", bad])
        assert refused.exit_code == 3 and isinstance(refused.exception, SystemExit), (
            refused.exception
        )
        assert why in refused.output, refused.output
    assert git.Repo(build).git.rev_parse(BUILD_BRANCH) == head  # nothing written on a refusal
