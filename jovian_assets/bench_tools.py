"""The lane's bench as lockstep reads it: the real tools' own outputs, the recorded baseline, the
gate, the runbook's report and the night-shift tables. Pure
functions; the asset (bench_assets.py) runs them.

lockstep reads what the tools document for machines, never their console tables:
- tool-eval-bench's `--json-file` (its README: "For
  subprocess integration, `--json-file` writes results
  to a file"), a versioned envelope (`schema_version` "1", `tool_eval_bench_version`, `config` with
  the run's `config_fingerprint`, `scores`, `metadata`; docs/api.md);
- llama-benchy's `--format json --save-result FILE` (its results.py pydantic models: `version`,
  `benchmarks[]` with `concurrency`, `prompt_size`, `response_size`, `context_size` and the
  `pp_throughput`/`tg_throughput` metrics).

Both are untrusted input: a garbled or wrong-typed field is a FileFormatError naming the file and
the JSON path with the value, and every string that
reaches a report is checked against a shape first.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from resources.errors import FileFormatError, decode_utf8
from resources.model import Model
from resources.reader import loads_json
from resources.secrets import redact

TOOL = "tool-eval-bench"
BASELINE_SCHEMA = 1
# tool-eval-bench 3.0.0 application/run_config.py COHORT_EXCLUDED_KEYS: what names the model and the
# endpoint, not the benchmark conditions. Two revs served on one lane differ in exactly these (and
# in the engine version folded into config_fingerprint), so
# the gate compares cohorts, as its leaderboard does.
COHORT_EXCLUDED_KEYS = frozenset(
    {
        "base_url",
        "config_fingerprint",
        "decision_judge",
        "endpoint_id",
        "model",
        "perf_passes",
        "perf_preset",
    }
)
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+!_-]{0,63}")
_FINGERPRINT = re.compile(r"[0-9a-f]{6,64}")
_RUN_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z.:_-]{0,127}")
_SCENARIO = re.compile(r"[A-Z]{1,8}-?[0-9A-Za-z._-]{0,32}")


class BenchOutputError(FileFormatError):
    """A bench tool's output file is missing, garbled or not the shape its tool documents."""


# ---- tool-eval-bench --json-file ----------------------------------------------------------------


class _Strict(Model):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class TebCategory(_Strict):
    category: str = Field(pattern=r"^[A-Z]$")
    label: str = Field(max_length=120)
    earned: int = Field(ge=0)
    max: int = Field(ge=0)
    percent: int = Field(ge=0, le=100)
    pass_count: int = Field(ge=0)
    partial_count: int = Field(ge=0)
    fail_count: int = Field(ge=0)


class TebScores(_Strict):
    final_score: int = Field(ge=0, le=100)
    total_points: int = Field(ge=0)
    max_points: int = Field(ge=0)
    category_scores: list[TebCategory]
    # Present only when the endpoint failed scenarios
    # (timeouts, 5xx): they leave the score and the rate drops.
    excluded_scenarios: list[str] = Field(default_factory=list)
    completion_rate: float = Field(default=100.0, ge=0, le=100)


class TebConfig(_Strict):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    seed: int | None = None
    scenario_count: int = Field(ge=0)
    scenario_ids: list[str]
    config_fingerprint: str = Field(pattern=_FINGERPRINT.pattern)


class TebMetadata(_Strict):
    tool_version: str = Field(pattern=_VERSION.pattern)
    git_sha: str | None = None
    engine_name: str | None = Field(default=None, max_length=64)
    engine_version: str | None = Field(default=None, max_length=128)


class TebEnvelope(_Strict):
    schema_version: Literal["1"]
    tool_eval_bench_version: str = Field(pattern=_VERSION.pattern)
    run_id: str = Field(pattern=_RUN_ID.pattern)
    status: str
    total_scenarios: int = Field(ge=0)
    config: TebConfig
    scores: TebScores
    metadata: TebMetadata


# ---- llama-benchy --format json ------------------------------------------------------------------


class _Metric(_Strict):
    mean: float


class BenchyRow(_Strict):
    concurrency: int = Field(ge=1)
    context_size: int = Field(ge=0)
    prompt_size: int = Field(ge=0)
    response_size: int = Field(ge=0)
    is_context_prefill_phase: bool = False
    pp_throughput: _Metric | None = None
    tg_throughput: _Metric | None = None


class BenchyEnvelope(_Strict):
    version: str = Field(pattern=_VERSION.pattern)
    benchmarks: list[BenchyRow]


# ---- what lockstep records -----------------------------------------------------------------------


class CategoryScore(Model):
    category: str
    label: str
    percent: int
    earned: int
    max: int


class QualityRun(Model):
    """One tool-eval-bench run as the gate and the reports use it (also the body of a baseline)."""

    tool: str = TOOL
    tool_version: str
    run_id: str
    seed: int | None
    final_score: int
    graded: int  # scenarios that produced a gradable result
    total: int  # scenarios attempted
    completion_rate: float
    excluded: list[str] = Field(default_factory=list)
    config_fingerprint: str
    # the benchmark conditions, without model, endpoint and deployment (see COHORT_EXCLUDED_KEYS)
    cohort: str
    engine: str | None = None
    categories: list[CategoryScore]

    @property
    def graded_text(self) -> str:
        return f"{self.graded}/{self.total}"


class PerfRow(Model):
    test: str  # llama-bench's name: pp2048, tg128 (+ @d<depth>)
    concurrency: int
    tokens_per_s: float | None


class PerfRun(Model):
    tool: str = "llama-benchy"
    tool_version: str
    rows: list[PerfRow]


def _json_path(loc: tuple[Any, ...]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def _json_doc(raw: bytes, path: str, error: type[FileFormatError], hint: str) -> Any:
    text = decode_utf8(raw, path)
    try:
        # duplicate keys, deep nesting and NULs refused, with the line
        return loads_json(text, path)
    except FileFormatError as exc:
        raise error(path, exc.line, f"{exc.message}: {hint}") from None


def _validated(
    model: type[BaseModel], doc: Any, path: str, error: type[FileFormatError], hint: str
) -> Any:
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        shown = "" if err["type"] == "missing" else f" (got {redact(repr(err.get('input')))[:200]})"
        raise error(
            path, None, f"{_json_path(tuple(err['loc']))}: {err['msg']}{shown}{hint}"
        ) from None


def _load(raw: bytes, path: str, model: type[BaseModel], tool: str) -> Any:
    if not raw.strip():
        raise BenchOutputError(
            path,
            None,
            f"{tool} wrote nothing here: the run did not finish (a dead pipe pump, "
            "or the tool died before writing its result)",
        )
    doc = _json_doc(raw, path, BenchOutputError, f"{tool}'s output is garbled or cut short")
    if isinstance(doc, dict) and set(doc) <= {"error", "json_file"} and "error" in doc:
        raise BenchOutputError(
            path, None, f"{tool} reported a failed run: {redact(str(doc['error']))[:500]}"
        )
    return _validated(
        model, doc, path, BenchOutputError, f": not the {tool} output shape lockstep reads"
    )


def cohort_of(config: dict[str, Any], tool_version: str, git_sha: str | None) -> str:
    """tool-eval-bench's own cohort fingerprint
    (application/leaderboard.py `cohort_fingerprint`): the run's
    config without what identifies the model or endpoint, with the tool's version and commit."""
    comparable = {k: v for k, v in config.items() if k not in COHORT_EXCLUDED_KEYS}
    payload = {"config": comparable, "tool_version": tool_version, "git_sha": git_sha}
    return hashlib.sha256(
        json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()[:12]


def parse_quality(raw: bytes, path: str) -> QualityRun:
    """A tool-eval-bench `--json-file` result as a QualityRun;
    a FileFormatError naming path and JSON path."""
    env: TebEnvelope = _load(raw, path, TebEnvelope, TOOL)
    if env.metadata.tool_version != env.tool_eval_bench_version:
        raise BenchOutputError(
            path,
            None,
            f"$.metadata.tool_version {env.metadata.tool_version!r} is not "
            f"$.tool_eval_bench_version {env.tool_eval_bench_version!r}",
        )
    if env.status != "completed":
        raise BenchOutputError(
            path, None, f"$.status: the run is {redact(env.status)[:40]!r}, not completed"
        )
    for i, sid in enumerate([*env.config.scenario_ids, *env.scores.excluded_scenarios]):
        if not _SCENARIO.fullmatch(sid):
            raise BenchOutputError(
                path, None, f"scenario #{i + 1}: {redact(repr(sid))[:80]} is not a scenario ID"
            )
    total = env.total_scenarios
    graded = env.scores.max_points // 2  # 2 points a scenario; excluded ones leave max_points
    if graded + len(env.scores.excluded_scenarios) != total:
        raise BenchOutputError(
            path,
            None,
            f"$.scores.max_points {env.scores.max_points} grades {graded} scenarios, "
            f"but {len(env.scores.excluded_scenarios)} excluded of "
            f"$.total_scenarios {total} leaves {total - len(env.scores.excluded_scenarios)}",
        )
    config = dict(env.config.model_dump())
    config.update(env.config.model_extra or {})
    engine = (
        " ".join(x for x in (env.metadata.engine_name, env.metadata.engine_version) if x) or None
    )
    return QualityRun(
        tool_version=env.tool_eval_bench_version,
        run_id=env.run_id,
        seed=env.config.seed,
        final_score=env.scores.final_score,
        graded=graded,
        total=total,
        completion_rate=env.scores.completion_rate,
        excluded=list(env.scores.excluded_scenarios),
        config_fingerprint=env.config.config_fingerprint,
        cohort=cohort_of(config, env.tool_eval_bench_version, env.metadata.git_sha),
        engine=_cell(engine) if engine else None,
        categories=[
            CategoryScore(
                category=c.category,
                label=_cell(c.label),
                percent=c.percent,
                earned=c.earned,
                max=c.max,
            )
            for c in env.scores.category_scores
        ],
    )


def parse_perf(raw: bytes, path: str) -> PerfRun:
    """A llama-benchy `--format json` result as perf
    rows: pp and tg tokens/s at each concurrency."""
    env: BenchyEnvelope = _load(raw, path, BenchyEnvelope, "llama-benchy")
    rows: list[PerfRow] = []
    for b in env.benchmarks:
        if b.is_context_prefill_phase:
            continue
        depth = f"@d{b.context_size}" if b.context_size else ""
        rows.append(
            PerfRow(
                test=f"pp{b.prompt_size}{depth}",
                concurrency=b.concurrency,
                tokens_per_s=None if b.pp_throughput is None else round(b.pp_throughput.mean, 2),
            )
        )
        rows.append(
            PerfRow(
                test=f"tg{b.response_size}{depth}",
                concurrency=b.concurrency,
                tokens_per_s=None if b.tg_throughput is None else round(b.tg_throughput.mean, 2),
            )
        )
    return PerfRun(tool_version=env.version, rows=rows)


# ---- the baseline --------------------------------------------------------------------------------


class Baseline(Model):
    """`recipes/<lane>/baseline.json` in the build
    repo: the anchor run a person chose, as recorded."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = BASELINE_SCHEMA
    lane: str
    rev: str
    image_id: str
    recorded_at: datetime
    recorded_by: str  # who chose it (the commit author lockstep wrote it as)
    run: QualityRun


def baseline_path(lane: str) -> str:
    return f"recipes/{lane}/baseline.json"


def parse_baseline(raw: bytes, path: str) -> Baseline:
    doc = _json_doc(
        raw, path, FileFormatError, "record it again with `lockstep lane rebaseline REPORT`"
    )
    return _validated(Baseline, doc, path, FileFormatError, "")


def baseline_json(baseline: Baseline) -> str:
    return json.dumps(baseline.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


# ---- the gate ------------------------------------------------------------------------------------


class GateVerdict(Model):
    passed: bool
    comparable: bool
    floor: float | None
    description: str


def gate(run: QualityRun, baseline: Baseline | None, tolerance: float, *, lane: str) -> GateVerdict:
    """The quality gate: the run against the recorded baseline, only when the two are comparable."""
    graded = f"graded on {run.graded_text} scenarios (completion_rate {run.completion_rate:g}%)"
    if baseline is None:
        return GateVerdict(
            passed=False,
            comparable=False,
            floor=None,
            description=(
                f"no baseline for lane {lane} ({baseline_path(lane)} in the build repo): score "
                f"{run.final_score}, {graded}. "
                "Record one from a run you trust: `lockstep lane rebaseline "
                f"recipes/{lane}/reports/<report>.md` "
                "(this run's report is one)"
            ),
        )
    base = baseline.run
    why = []
    if (base.tool, base.tool_version) != (run.tool, run.tool_version):
        why.append(f"baseline is {base.tool} {base.tool_version}, this run is {run.tool_version}")
    elif base.cohort != run.cohort:
        why.append(
            f"baseline is cohort {base.cohort} (seed {base.seed}, {base.total} scenarios), this "
            "run is cohort "
            f"{run.cohort} (seed {run.seed}, {run.total} scenarios)"
        )
    if base.graded != run.graded:
        why.append(
            f"baseline was graded on {base.graded_text} scenarios, this run on {run.graded_text}"
        )
    if why:
        return GateVerdict(
            passed=False,
            comparable=False,
            floor=None,
            description=(
                "; ".join(why)
                + (
                    ": not comparable; re-baseline (`lockstep lane rebaseline "
                    f"recipes/{lane}/reports/<report>.md`)"
                )
            ),
        )
    floor = base.final_score - tolerance
    passed = run.final_score >= floor
    return GateVerdict(
        passed=passed,
        comparable=True,
        floor=floor,
        description=(
            f"quality {run.final_score} vs baseline {base.final_score} ({baseline.rev}, run "
            f"{base.run_id}) - tolerance "
            f"{tolerance:g} = {floor:g}, {graded}, {run.tool} {run.tool_version}, cohort "
            f"{run.cohort}"
            + (
                ""
                if passed
                else ": a regression — the lane goes back to the image it served before"
            )
        ),
    )


# ---- the report and the night-shift tables -------------------------------------------------------


def _cell(value: object) -> str:
    """A value safe inside a Markdown table cell and on
    one line (outside text may hold `|` or newlines)."""
    return re.sub(r"\s+", " ", str(value)).replace("|", "\\|").strip()


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def report_markdown(
    *,
    lane: str,
    rev: str,
    tag: str,
    image_id: str,
    node: str,
    stamp: str,
    quality: QualityRun,
    perf: PerfRun,
    verdict: GateVerdict,
    baseline: Baseline | None,
) -> str:
    # The record at the end is what `lockstep lane rebaseline`
    # reads back: the report is the run's only copy.
    """The runbook's report (`recipes/<lane>/reports/<UTC-stamp>_<label>.md`)."""
    lines = [
        f"# {lane}: {rev} ({stamp})",
        "",
        f"- served image: `{tag}` ID `{image_id}` (the running container's, on {node})",
        f"- {quality.tool} {quality.tool_version}, seed {quality.seed}, run `{quality.run_id}`",
        f"- graded {quality.graded_text} scenarios, completion_rate {quality.completion_rate:g}%"
        + (f" (excluded: {', '.join(quality.excluded)})" if quality.excluded else ""),
        f"- config_fingerprint `{quality.config_fingerprint}`, cohort `{quality.cohort}`"
        + (f", engine {quality.engine}" if quality.engine else ""),
        f"- quality: **{quality.final_score}**"
        + (
            (
                f" (baseline {baseline.run.final_score} from {baseline.rev}, run "
                f"`{baseline.run.run_id}`)"
            )
            if baseline
            else ""
        ),
        f"- gate: **{'pass' if verdict.passed else 'FAIL'}** — {_cell(verdict.description)}",
        "",
        "## Quality by category",
        "",
        "| category | label | score | points |",
        "|---|---|---:|---:|",
        *[
            f"| {c.category} | {c.label} | {c.percent}% | {c.earned}/{c.max} |"
            for c in quality.categories
        ],
        "",
        f"## Perf ({perf.tool} {perf.tool_version})",
        "",
        "| test | concurrency | tokens/s |",
        "|---|---:|---:|",
        *[f"| {r.test} | c{r.concurrency} | {_num(r.tokens_per_s)} |" for r in perf.rows],
        "",
    ]
    return "\n".join(lines) + "\n" + record_block(rev, image_id, quality)


SCORES_HEADING = "## Scores"
PERF_HEADING = "## Perf"
SCORES_HEADER = [
    "UTC",
    "lane",
    "rev",
    "image ID",
    "tool",
    "seed",
    "graded",
    "completion",
    "fingerprint",
    "score",
    "gate",
    "report",
]
PERF_HEADER = ["UTC", "lane", "rev", "test", "concurrency", "tokens/s"]


def _table(header: list[str]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]


def night_shift_rows(
    *,
    stamp: str,
    lane: str,
    rev: str,
    image_id: str,
    quality: QualityRun,
    perf: PerfRun,
    verdict: GateVerdict,
    report: str,
) -> tuple[list[str], list[str]]:
    short = image_id.removeprefix("sha256:")[:12]
    score = [
        (
            f"| {stamp} | {lane} | {rev} | `{short}` | {quality.tool} {quality.tool_version} | "
            f"{quality.seed} | "
            f"{quality.graded_text} | {quality.completion_rate:g}% | "
            f"`{quality.config_fingerprint}` | "
            f"{quality.final_score} | {'pass' if verdict.passed else 'FAIL'} | "
            f"[{report.rsplit('/', 1)[-1]}]"
            f"(../../{report}) |"
        )
    ]
    perf_rows = [
        f"| {stamp} | {lane} | {rev} | {r.test} | c{r.concurrency} | {_num(r.tokens_per_s)} |"
        for r in perf.rows
    ]
    return score, perf_rows


def _append_to_section(
    lines: list[str], heading: str, header: list[str], rows: list[str]
) -> list[str]:
    """`rows` after the last row of the table under
    `heading`; the section (heading + table) made at the end
    when the file has none. Nothing else in the file moves."""
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == heading)
    except StopIteration:
        while lines and not lines[-1].strip():
            lines.pop()
        return [*lines, "", heading, "", *_table(header), *rows]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    table = [i for i in range(start + 1, end) if lines[i].lstrip().startswith("|")]
    if not table:
        return [*lines[: start + 1], "", *_table(header), *rows, *lines[start + 1 :]]
    at = table[-1] + 1
    return [*lines[:at], *rows, *lines[at:]]


def update_night_shift(
    existing: str | None, *, date: str, score_rows: list[str], perf_rows: list[str]
) -> str:
    """`history/night-shifts/<date>.md` with this
    run's rows added to its score and perf tables; rows
    others wrote (an earlier run the same night, a person's note) are kept as they are."""
    lines = (
        existing.splitlines()
        if existing
        else [
            f"# Night shift {date}",
            "",
            "Combined score and perf tables of the night's bench runs.",
        ]
    )
    lines = _append_to_section(lines, SCORES_HEADING, SCORES_HEADER, score_rows)
    lines = _append_to_section(lines, PERF_HEADING, PERF_HEADER, perf_rows)
    return "\n".join(lines) + "\n"


# ---- what the asset records, and re-baselining from a filed report -------------------------------


class BenchReport(Model):
    """`jovian/bench_report`: the run, the image it
    scored, the gate, and where the report was filed."""

    rev: str
    lane: str
    node: str
    tag: str
    image_id: str  # the served container's (jovian/lane_serving), equal to the built image's
    quality: QualityRun
    perf: PerfRun
    verdict: GateVerdict
    baseline_rev: str | None
    report_path: str
    night_shift_path: str
    build_commit: str
    restored: str | None = None  # the image the lane went back to when the gate failed


RECORD_OPEN = "<!-- lockstep:run"
RECORD_CLOSE = "-->"


def record_block(rev: str, image_id: str, quality: QualityRun) -> str:
    """The run's record at the end of its report, so
    a person can re-baseline from any filed report."""
    doc = {"rev": rev, "image_id": image_id, "run": quality.model_dump(mode="json")}
    # `>` escaped inside JSON strings, so no value can close the comment early.
    body = json.dumps(doc, indent=1, sort_keys=True).replace(">", "\\u003e")
    return f"{RECORD_OPEN}\n{body}\n{RECORD_CLOSE}\n"


class _Record(Model):
    model_config = ConfigDict(extra="forbid")
    rev: str
    image_id: str
    run: QualityRun


def baseline_from_report(
    text: str, path: str, *, lane: str, recorded_at: datetime, recorded_by: str
) -> Baseline:
    """The Baseline a filed report's run record makes (`lockstep lane rebaseline REPORT`)."""
    start = text.rfind(RECORD_OPEN)
    end = text.find(RECORD_CLOSE, start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        raise FileFormatError(
            path,
            None,
            "no `<!-- lockstep:run ... -->` record: not a report lockstep filed "
            "(only those carry the run a baseline needs)",
        )
    line = text.count("\n", 0, start) + 1
    try:
        record = _Record.model_validate_json(text[start + len(RECORD_OPEN) : end])
    except ValidationError as exc:
        err = exc.errors()[0]
        raise FileFormatError(
            path, line, f"run record {_json_path(tuple(err['loc']))}: {err['msg']}"
        ) from None
    return Baseline(
        lane=lane,
        rev=record.rev,
        image_id=record.image_id,
        recorded_at=recorded_at,
        recorded_by=recorded_by,
        run=record.run,
    )


# ---- the site's bench commands -------------------------------------------------------------------


def render_command(argv: list[str], **values: str) -> list[str]:
    """A site bench command with its placeholders filled (the site checked at load that only
    PLACEHOLDERS appear); each value stays one argv word, never shell text."""
    return [word.format(**values) for word in argv]
