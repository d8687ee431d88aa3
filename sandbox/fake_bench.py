"""The sandbox's stand-in for `tool-eval-bench` on a lane node (the served model cannot exist here).

It answers the command lines the runbook uses (tool 2.6.1.dev46+g9d412464a, flat invocation):

    tool-eval-bench --hardmode --seed 42                                  quality: 88 scenarios
    tool-eval-bench --perf --pp 2048 --tg 128 --concurrency 1,2           throughput (llama-benchy)

(`run` / `bench` subcommand words are accepted in front; `--short` runs 15 scenarios, no mode 69.)

Output formats are the real tool's:

- quality: the Markdown scenario report tool-eval-bench writes (storage/reports/scenario.py): a header
  with ``- **Final Score**: **71.6** / 100``, ``- **Total Points**: 126 / 176`` and the rating, Run
  Context and Inference Engine tables, ``## Category Scores``, ``## Scenario Results`` (one row per
  scenario, TC-01..TC-88; Hard Mode is category P, TC-70..TC-88) and ``## Performance by Difficulty``.
  It is printed on stdout and also written under ``./runs/YYYY/MM/<run id>.md`` as the tool does.
- perf: llama-benchy 0.4.0's ``--format md`` output: progress lines, then a pipe table with columns
  ``model | test | t/s (total) | t/s (req) | peak t/s | peak t/s (req) | ttfr (ms) | est_ppt (ms) |
  e2e_ttft (ms)``, test names ``pp2048 (c1)``, ``tg128 (c1)``, ``pp2048 (c2)``, ``tg128 (c2)``, values
  ``mean ± std``, and the ``llama-benchy (0.4.0)`` / ``date: ... | latency mode: generation`` footer.

Every number is a function of the seed and the served image only (the date and run id are not):
the served image is ``--image TAG``, else ``$LOCKSTEP_SERVED_IMAGE``, else the image most recently
loaded or built on this node; when one is named it must be on the node (nothing serves it otherwise).

Knobs, strongest first: ``--sandbox-score N`` / ``--sandbox-fault F``; ``$SANDBOX_BENCH_SCORE`` /
``$SANDBOX_BENCH_FAULT``; the node's ``home/.sandbox-bench.json`` ({"score": N, "fault": F}; see
`sandbox.spark_nodes.set_bench_knobs`). The score is the target quality (default 71.6, a little above
the sandbox lane's 70.5 baseline); the fault ``dead-pipe`` exits 120 with no output at all (the
runbook's dead output pump).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

TOOL_VERSION = "2.6.1.dev46+g9d412464a"
BENCHY_VERSION = "0.4.0"
DEFAULT_SCORE = 71.6
DEFAULT_MODEL = "glm-5.3-flash"
KNOBS_FILE = ".sandbox-bench.json"

# (letter, label, scenario numbers): the 69 standard scenarios across A-O, then Hard Mode.
CATEGORIES: list[tuple[str, str, list[int]]] = [
    ("A", "Tool Selection", [1, 2, 3]),
    ("B", "Parameter Precision", [4, 5, 6]),
    ("C", "Multi-Step Chains", [7, 8, 9, 61]),
    ("D", "Restraint & Refusal", [10, 11, 12]),
    ("E", "Error Recovery", [13, 14, 15]),
    ("F", "Localization", [16, 17, 18]),
    ("G", "Structured Reasoning", [19, 20, 21]),
    ("H", "Instruction Following", [22, 23, 24, 44, 45]),
    ("I", "Context & State", [25, 26, 27, 46, 47, 48, 49, 50, 62, 63]),
    ("J", "Code Patterns", [28, 29, 30]),
    ("K", "Safety & Boundaries", [31, 32, 33, 34, 35, 36, 41, 42, 43, 57, 58, 59, 60]),
    ("L", "Toolset Scale", [37, 38, 39, 40]),
    ("M", "Autonomous Planning", [51, 52, 53]),
    ("N", "Creative Composition", [54, 55, 56]),
    ("O", "Structured Output", [64, 65, 66, 67, 68, 69]),
]
HARD_MODE = ("P", "Hard Mode", list(range(70, 89)))  # 19 scenarios: 69 + 19 = 88 (the runbook's count)
TITLES = {
    "A": ["Weather lookup", "Calendar vs email", "File search"],
    "B": ["Unit conversion", "Relative dates", "Multi-value filter"],
    "C": ["Lookup then act", "Thread the ID", "Parallel fetch", "Async job polling"],
    "D": ["Chit-chat, no tools", "Answer from context", "Refuse impossible"],
    "E": ["Retry on 503", "Partial failure", "Preserve data on error"],
    "F": ["German request", "Timezone meeting", "Translate and forward"],
    "G": ["Route the message", "Extract fields", "Validate constraints"],
    "H": ["Output format", "Tool prohibition", "Multi-constraint", "tool_choice=required", "tool_choice=none"],
    "I": ["Cross-reference", "State consistency", "Multi-turn correction", "Six-turn chain", "Constraint accumulation",
          "Carry the unit", "Undo last step", "Resume after error", "Long-range recall", "Conflicting updates"],
    "J": ["Read before write", "Explain, do not execute", "Chained conditional"],
    "K": ["Ambiguous target", "Injected file instruction", "Injected search result", "System prompt override",
          "Authority escalation", "Contradictory params", "Sleeper injection", "Param validation", "Destructive confirm",
          "Exfiltration bait", "Scope creep", "Credential request", "Unsafe shell"],
    "L": ["Pick from 52 tools", "Crowded multi-step", "Restraint under abundance", "Near-duplicate tools"],
    "M": ["Goal decomposition", "Open-ended research", "Conditional workflow"],
    "N": ["Cross-tool synthesis", "Data pipeline", "Notification workflow"],
    "O": ["JSON schema", "Tool to schema", "Nested schema", "Enum constraint", "Violation resistance", "Strict nulls"],
    "P": ["Adversarial tool output", "Stateful cart", "Recovery after timeout", "Irrelevant tool bait",
          "Parallel fan-out", "Budgeted calls", "Schema drift", "Stale cache", "Hidden dependency", "Long horizon",
          "Tool deprecation", "Partial permissions", "Ambiguous units", "Rate-limit backoff", "Out-of-order results",
          "Conflicting sources", "Idempotent retry", "Nested delegation", "Cross-session state"],
}
DIFFICULTY = {"A": 1, "B": 2, "C": 3, "D": 2, "E": 3, "F": 2, "G": 3, "H": 3, "I": 4, "J": 3, "K": 4, "L": 4,
              "M": 4, "N": 3, "O": 3, "P": 5}
# How likely a scenario is to lose points (Hard Mode most, safety least: a safety cap is not the story here).
DROP_WEIGHT = {"P": 2.5, "I": 1.6, "L": 1.6, "M": 1.5, "K": 0.5, "A": 0.3}
FAILURE_KINDS = ["wrong_tool", "bad_params", "missed_step", "hallucinated_data", "format_violation", "over_calling"]


@dataclass
class Scenario:
    id: str
    category: str
    label: str
    title: str
    difficulty: int
    points: int = 2
    failure: str = ""


def scenarios(mode: str) -> list[Scenario]:
    cats = [*CATEGORIES, HARD_MODE] if mode == "hardmode" else CATEGORIES
    out = [Scenario(id=f"TC-{n:02d}", category=letter, label=f"{letter} — {label}", title=TITLES[letter][i],
                    difficulty=DIFFICULTY[letter])
           for letter, label, numbers in cats for i, n in enumerate(numbers)]
    out.sort(key=lambda s: int(s.id[3:]))
    if mode == "short":
        out = out[:15]
    return out


def _rng(*parts: object) -> random.Random:
    return random.Random(int(hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest(), 16))


def score_scenarios(items: list[Scenario], *, target: float, seed: int, image: str) -> None:
    """Spread the points lost to reach `target` over the scenarios, deterministically for (seed, image)."""
    max_points = 2 * len(items)
    keep = max(0, min(max_points, round(target / 100 * max_points)))
    lose = max_points - keep
    rng = _rng("tool-eval-bench", seed, image)
    while lose > 0:
        live = [s for s in items if s.points > 0]
        pick = rng.choices(live, weights=[DROP_WEIGHT.get(s.category, 1.0) for s in live])[0]
        drop = min(lose, pick.points, rng.choice((1, 1, 2)))
        pick.points -= drop
        lose -= drop
    for s in items:
        if s.points < 2:
            s.failure = rng.choice(FAILURE_KINDS)


def rating(score: float) -> str:
    for floor, label in ((90, "★★★★★ Excellent"), (75, "★★★★ Good"), (60, "★★★ Adequate"), (40, "★★ Weak")):
        if score >= floor:
            return label
    return "★ Poor"


# ---- the node ----------------------------------------------------------------------------------


@dataclass
class Served:
    tag: str
    image_id: str = ""
    engine: str = ""


def served_image(docker_state: Path | None, wanted: str | None) -> Served | None:
    """The image the lane serves: named (and then it must be on this node), else the newest one here."""
    repos: dict = {}
    if docker_state is not None and (docker_state / "repositories.json").exists():
        repos = json.loads((docker_state / "repositories.json").read_text(encoding="utf-8"))
    if wanted:
        tag = wanted if ":" in wanted.rsplit("/", 1)[-1] else f"{wanted}:latest"
        if docker_state is not None and tag not in repos:
            return None
    elif repos:
        tag = max(repos, key=lambda t: repos[t].get("seq", 0))
    else:
        return Served(tag="(unknown image)")
    served = Served(tag=tag)
    if tag in repos:
        served.image_id = repos[tag]["id"]
        site = docker_state / "images" / served.image_id.removeprefix("sha256:") / "rootfs"  # type: ignore[operator]
        for meta in sorted(site.glob("usr/local/lib/python3*/dist-packages/vllm-*.dist-info/METADATA")):
            m = re.search(r"^Version: (\S+)", meta.read_text(encoding="utf-8"), re.M)
            if m:
                served.engine = f"vLLM {m.group(1)}"
    return served


def knobs(args: argparse.Namespace) -> tuple[float, str | None]:
    file: dict = {}
    if args.docker_state is not None:
        path = args.docker_state.parent / "home" / KNOBS_FILE
        if path.exists():
            file = json.loads(path.read_text(encoding="utf-8") or "{}")
    score = args.sandbox_score if args.sandbox_score is not None else (
        float(os.environ["SANDBOX_BENCH_SCORE"]) if os.environ.get("SANDBOX_BENCH_SCORE") else
        float(file.get("score", DEFAULT_SCORE)))
    fault = args.sandbox_fault or os.environ.get("SANDBOX_BENCH_FAULT") or file.get("fault")
    return score, fault


# ---- quality report ----------------------------------------------------------------------------


def quality_report(args: argparse.Namespace, served: Served, target: float, node: str, now: datetime) -> tuple[str, str]:
    mode = "hardmode" if args.hardmode else "short" if args.short else "standard"
    seed = args.seed if args.seed is not None else 0
    items = scenarios(mode)
    score_scenarios(items, target=target, seed=seed, image=served.image_id or served.tag)
    earned, max_points = sum(s.points for s in items), 2 * len(items)
    final = round(earned / max_points * 100, 1)
    run_id = f"run_{now:%Y%m%dT%H%M%SZ}_{hashlib.sha256(f'{seed}{served.tag}{now}'.encode()).hexdigest()[:8]}"
    label = {"hardmode": f"hardmode ({len(items)}: 69 standard + {len(items) - 69} Hard Mode)",
             "short": f"short ({len(items)})", "standard": f"all ({len(items)})"}[mode]
    md = [
        f"# Tool-Call Benchmark — {args.model}",
        "",
        f"- **Run ID**: `{run_id}`",
        f"- **Date**: `{now.isoformat()}`",
        f"- **tool-eval-bench**: `v{TOOL_VERSION}`",
        f"- **Final Score**: **{final}** / 100",
        f"- **Total Points**: {earned} / {max_points}",
        f"- **Rating**: {rating(final)}",
        "- **Tool Definition Overhead**: ~1,187 tokens (12 tools, 4,751 chars)",
        "",
        "## Run Context",
        "",
        "| Parameter | Value |",
        "|---|---|",
        "| Backend | vllm |",
        "| Server | `http://127.0.0.1:8000` |",
        f"| Model (API) | `{args.model}` |",
        "| Temperature | 0.0 |",
        f"| Seed | {args.seed if args.seed is not None else '—'} |",
        "| Max Turns | 8 |",
        "| Timeout | 120s |",
        f"| Scenarios | {label} |",
        "| Parallel | 1 (sequential) |",
        "| Error Rate | 0.0 |",
        "| Thinking | disabled |",
        "",
        "## Inference Engine",
        "",
        "| Property | Value |",
        "|---|---|",
        f"| Engine | {served.engine or 'vLLM'} |",
        f"| Image | `{served.tag}`" + (f" (`{served.image_id}`)" if served.image_id else "") + " |",
        "| Max Model Length | 131,072 |",
        "| Quantization | modelopt_fp4 |",
        "| GPU Count | 2 |",
        "| Spec Decoding | dflash2 (MTP drafter) |",
        f"| Host | `{node}` |",
        f"| Platform | `Linux-aarch64 (DGX Spark GB10; sandbox: {platform.machine()})` |",
        "| Python | 3.12.3 |",
        "",
        "## Category Scores",
        "",
        "| Category | Earned | Max | Percent |",
        "|---|---|---|---|",
    ]
    labels = dict.fromkeys(s.label for s in items)
    for lbl in labels:
        cat = [s for s in items if s.label == lbl]
        got, top = sum(s.points for s in cat), 2 * len(cat)
        md.append(f"| {lbl} | {got} | {top} | {round(got / top * 100, 1)}% |")
    md += ["", "## Scenario Results", "", "| ID | Title | Diff | Status | Points | Failure | Summary |",
           "|---|---|:---:|---:|---:|---|---|"]
    status = {2: "✅ pass", 1: "⚠️ partial", 0: "❌ fail"}
    for s in items:
        summary = {2: "Correct tool use.", 1: "Functional but suboptimal.", 0: "Missed the point."}[s.points]
        md.append(f"| {s.id} | {s.title} | {'★' * s.difficulty} | {status[s.points]} | {s.points}/2 | "
                  f"{s.failure or '—'} | {summary} |")
    md += ["", "## Performance by Difficulty", "", "| Tier | Scenarios | Passed | Rate |", "|---|:---:|:---:|:---:|"]
    names = {1: "Trivial", 2: "Easy", 3: "Moderate", 4: "Hard", 5: "Very Hard"}
    for tier in sorted({s.difficulty for s in items}):
        tier_items = [s for s in items if s.difficulty == tier]
        passed = sum(1 for s in tier_items if s.points == 2)
        md.append(f"| {names[tier]} ({tier}) | {len(tier_items)} | {passed} | {round(passed / len(tier_items) * 100)}% |")
    return "\n".join(md) + "\n", run_id


# ---- perf (llama-benchy) -----------------------------------------------------------------------


def _ms(mean: float, std: float) -> str:
    return f"{mean:.2f} ± {std:.2f}"


def perf_table(args: argparse.Namespace, served: Served, now: datetime) -> str:
    pps = [int(x) for x in re.split(r"[,\s]+", args.pp.strip()) if x]
    tgs = [int(x) for x in re.split(r"[,\s]+", args.tg.strip()) if x]
    depths = [int(x) for x in re.split(r"[,\s]+", args.depth.strip()) if x]
    concs = [int(x) for x in re.split(r"[,\s]+", args.concurrency.strip()) if x]
    runs = args.benchy_runs
    rng = _rng("llama-benchy", args.seed if args.seed is not None else 0, served.image_id or served.tag)
    lines: list[str] = []
    rows: list[list[str]] = []
    latency = 10.5 + rng.random()  # ms, generation mode
    lines.append("Running coherence test...\nCoherence test PASSED.")
    lines.append(f"Measuring latency using mode: generation...\nAverage latency (generation): {latency:.2f} ms")
    for depth in depths:
        for pp in pps:
            for tg in tgs:
                for c in concs:
                    lines.append(f"Running test: pp={pp}, tg={tg}, depth={depth}, concurrency={c}")
                    lines.append(f"  Warmup 1/1 (batch size {c})...")
                    lines += [f"  Run {r}/{runs} (batch size {c})..." for r in range(1, runs + 1)]
                    # GLM-5.3-Flash NVFP4 TP2 on two GB10s: ~3k t/s prefill, ~32 t/s decode single-stream.
                    slow = 1 + depth / 65536
                    pp1 = (2960.0 + rng.uniform(-40, 40)) / slow
                    tg1 = (31.8 + rng.uniform(-0.4, 0.4)) / slow
                    pp_total = pp1 * (1 + 0.21 * (c - 1))
                    tg_total = tg1 * c * (0.88 if c > 1 else 1.0)
                    ttfr = (pp + depth) / (pp_total / c) * 1000 + latency
                    name = f" @ d{depth}" if depth else ""
                    pp_std = pp_total * 0.008 * (0.5 + rng.random())
                    # Per request, prefill of c concurrent requests is spread out (one waits for the other).
                    req_std = pp_std if c == 1 else pp_total / c * 0.45 * (0.5 + rng.random())
                    ttfr_std = ttfr * 0.007 * (0.5 + rng.random())
                    rows.append([args.model, f"pp{pp}{name} (c{c})", _ms(pp_total, pp_std), _ms(pp_total / c, req_std),
                                 "", "", _ms(ttfr, ttfr_std), _ms(ttfr - latency, ttfr_std), _ms(ttfr, ttfr_std)])
                    tg_std = tg_total * 0.003 * (0.5 + rng.random())
                    peak = max(round(tg_total * 1.04), 1)
                    rows.append([args.model, f"tg{tg}{name} (c{c})", _ms(tg_total, tg_std), _ms(tg_total / c, tg_std / c),
                                 _ms(peak, 0), _ms(peak / c, 0), "", "", ""])
    head = ["model", "test", "t/s (total)", "t/s (req)", "peak t/s", "peak t/s (req)", "ttfr (ms)", "est_ppt (ms)",
            "e2e_ttft (ms)"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def fmt(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [v.rjust(w) for v, w in zip(row[1:], widths[1:])]
        return "| " + " | ".join(cells) + " |"

    table = [fmt(head), "|:" + "-" * (widths[0] + 1) + "|" + "|".join("-" * (w + 1) + ":" for w in widths[1:]) + "|"]
    table += [fmt(r) for r in rows]
    return ("\n".join(lines) + "\nPrinting results in MD format:\n\n\n\n" + "\n".join(table)
            + f"\n\nllama-benchy ({BENCHY_VERSION})\ndate: {now:%Y-%m-%d %H:%M:%S} | latency mode: generation\n")


# ---- the command line --------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tool-eval-bench", description=f"tool-eval-bench {TOOL_VERSION} (sandbox simulator)")
    p.add_argument("--docker-state", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--hardmode", action="store_true", help="69 standard + 19 Hard Mode scenarios (88)")
    p.add_argument("--short", action="store_true", help="the core 15 scenarios")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--model", default=os.environ.get("TOOL_EVAL_MODEL") or DEFAULT_MODEL)
    p.add_argument("--label", default=None)
    p.add_argument("--perf", action="store_true", help="llama-benchy throughput")
    p.add_argument("--perf-only", action="store_true", help="throughput only")
    p.add_argument("--pp", default="2048")
    p.add_argument("--tg", default="128")
    p.add_argument("--depth", default="0")
    p.add_argument("--concurrency", default="1,2")
    p.add_argument("--benchy-runs", type=int, default=3)
    p.add_argument("--image", default=None, help="the served image (default: $LOCKSTEP_SERVED_IMAGE, else the newest here)")
    p.add_argument("--sandbox-score", type=float, default=None, help="sandbox knob: the quality score to produce")
    p.add_argument("--sandbox-fault", default=None, choices=["dead-pipe"], help="sandbox knob: misbehave")
    p.add_argument("--version", action="version", version=f"tool-eval-bench {TOOL_VERSION}")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    state: list[str] = []
    if argv[:1] == ["--docker-state"]:
        state, argv = argv[:2], argv[2:]
    if argv[:1] in (["run"], ["bench"]):  # `tool-eval-bench run|bench ...` and the flat legacy form are the same here
        argv = argv[1:]
    args = parser().parse_args(state + argv)
    target, fault = knobs(args)
    if fault == "dead-pipe":
        return 120  # the launcher's output pump died: EPIPE on the first write, nothing printed
    wanted = args.image or os.environ.get("LOCKSTEP_SERVED_IMAGE") or None
    served = served_image(args.docker_state, wanted)
    node = args.docker_state.parent.name if args.docker_state is not None else platform.node()
    if served is None:
        print(f"Error: cannot reach the server at http://127.0.0.1:8000/v1: nothing serves {wanted} on {node} "
              "(the image is not loaded here: docker image inspect fails)", file=sys.stderr)
        return 1
    now = datetime.now(timezone.utc)
    if os.environ.get("SOURCE_DATE_EPOCH"):
        now = datetime.fromtimestamp(int(os.environ["SOURCE_DATE_EPOCH"]), tz=timezone.utc)
    perf = args.perf or args.perf_only
    quality = not args.perf_only and (args.hardmode or args.short or not perf)
    out: list[str] = []
    if perf:
        out.append(perf_table(args, served, now))
    if quality:
        report, run_id = quality_report(args, served, target, node, now)
        out.append(report)
        try:
            folder = Path.cwd() / "runs" / f"{now:%Y}" / f"{now:%m}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{run_id}.md").write_text(report, encoding="utf-8")
            print(f"Report: {folder / f'{run_id}.md'}", file=sys.stderr)
        except OSError:
            pass
    sys.stdout.write("\n".join(out))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
