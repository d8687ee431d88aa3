"""What the iris CLI prints, read: help screens, job state (text or JSON), job lists, logs. Pure.

Every shape here is the real CLI's (the Marin monorepo `marin-community/marin`,
`lib/iris/src/iris/cli/job.py`, read at the commits named below, history up to 2dfb07943 of
2026-08-22; the `marin-iris` 0.2.20.dev202606180959 wheel for the 2026-06 shapes). The CLI changed
under the runbook, so each reader says which versions print what:

- ``job describe ID`` (2026-08-20, 43ea65e00,
  ``render_job_description_text``) and ``job summary ID``
  without ``--json`` (2026-04-09..2026-08-20, ``_render_job_summary_text``) print the same head::

      Job: /<user>/<name> (<name>)
      State: <state>  exit=<int>  failures=<int>  preemptions=<int>
      Tasks: <completed>/<total> completed  running=1 ...
      Error: <message>                      <- only when there is one
      <blank>
      TASK  STATE  EXIT  DURATION  PEAK MEM  CUR MEM  DIAGNOSTIC|ERROR   <- tabulate "plain"

  ``exit`` is the proto default 0 until the job is
  terminal: it is believed only in a terminal state.
- ``job summary ID --json`` (2026-04-09..2026-07-03,
  605baceb1..0361dfb98): ``build_job_summary``, one
  object with ``state`` lower-case, ``exit_code`` an int (0 while running), ``error`` ("" for none),
  ``failure_count``, ``preemption_count``, ``tasks`` [{index, state, exit_code, error}].
- ``job list [--prefix P]`` text (every 2026 version): a tabulate "plain" table ``JOB ID  STATE
  SUBMITTED  [REASON]``, SUBMITTED an ISO-8601 UTC
  time, REASON ``error or pending_reason`` cut to 60.
- ``job logs ID``: lines ``[HH:MM:SS] task=<id> [attempt=<n>] | <text>``.
- Job states (``resources/state.py``): ``unspecified
  pending building running succeeded failed killed
  worker_failed unschedulable``. OOM on the Kubernetes backend is ``failed`` (tasks.py:187), not
  ``killed``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from resources.errors import FileFormatError, LockstepError
from resources.model import Model
from resources.reader import loads_json
from resources.secrets import redact


class IrisError(LockstepError):
    """The iris CLI failed or answered something lockstep cannot read; secrets are redacted."""


class IrisUnreadable(IrisError):
    """iris answered, but a field of its answer is not
    what any iris version prints: the message names
    the field (a JSON path, or the text line) and the value. Asking again gets the same answer."""


class JobState(StrEnum):
    PENDING = "pending"
    BUILDING = "building"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    WORKER_FAILED = "worker_failed"
    UNSCHEDULABLE = "unschedulable"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @classmethod
    def parse(cls, value: object) -> JobState:
        """Read a state however iris spells it: ``succeeded``,
        ``JOB_STATE_SUCCEEDED``, ``worker-failed``.

        ``unspecified`` (the proto default: the controller has said nothing yet) reads as PENDING,
        which is not an end. Anything else unknown is an IrisError that shows the value iris
        printed: guessing a state could turn a failure into a success.
        """
        if not isinstance(value, str):
            raise IrisUnreadable(
                f"iris reported unknown state {value!r} ({type(value).__name__}, not a state name)"
            )
        text = re.sub(r"[\s-]+", "_", value.strip()).lower().removeprefix("job_state_")
        if text in ("", "unspecified"):
            return cls.PENDING
        try:
            return cls(text)
        except ValueError:
            known = ", ".join(s.value for s in cls)
            raise IrisUnreadable(
                f"iris reported unknown state {value!r}, which lockstep does not know (known: "
                f"{known}): "
                "the installed iris CLI ([iris] binary) is probably newer than this lockstep. "
                "Look at the "
                "job in iris yourself (`iris job describe <job>`; `job summary` on older CLIs), "
                "and upgrade "
                "lockstep or point [iris] binary at an iris release whose states it knows"
            ) from None


TERMINAL = frozenset(
    {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.KILLED,
        JobState.WORKER_FAILED,
        JobState.UNSCHEDULABLE,
    }
)


class TaskRow(Model):
    index: str
    state: str
    exit_code: int | None = None
    diagnostic: str = ""


class JobSummary(Model):
    """One reading of a job's state, from whichever command the installed iris has."""

    job_id: str
    state: JobState
    exit_code: int | None = Field(
        default=None, description="Only for a terminal job; 0 only for succeeded."
    )
    error: str | None = None
    failures: int = 0
    preemptions: int = 0
    tasks: list[TaskRow] = Field(default_factory=list)

    def diagnostics(self) -> str:
        """What iris says about the tasks (pending reasons,
        errors), one line per task that says anything."""
        return "; ".join(
            f"task {t.index} {t.state}: {t.diagnostic}" for t in self.tasks if t.diagnostic
        )


class ListedJob(Model):
    """One row of `job list`: the only place every iris version prints a job's submit time."""

    job_id: str
    state: str
    submitted: str = Field(description="ISO-8601 UTC as iris prints it; '-' when unknown.")
    reason: str = Field(
        default="", description="error or pending_reason, cut to 60 characters by iris."
    )

    def submitted_at(self) -> datetime | None:
        try:
            return datetime.fromisoformat(self.submitted)
        except ValueError:
            return None


# -- help screens ----------------------------------------------------------------------------------

_COMMAND_LINE = re.compile(r"^\s{2}([a-z][a-z0-9-]*)(?:\s{2,}|\s*$)")
_OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][a-zA-Z0-9-]*)")


def _section(text: str, header: str) -> list[str]:
    """The indented lines under a click help screen's ``Commands:`` or ``Options:`` header."""
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if line.strip().lower() == header), None)
    if at is None:
        return []
    out = []
    for line in lines[at + 1 :]:
        if line and not line.startswith(" "):
            break
        out.append(line)
    return out


def help_commands(text: str) -> frozenset[str]:
    """The sub-commands a click help screen lists under ``Commands:``."""
    return frozenset(
        m.group(1) for line in _section(text, "commands:") if (m := _COMMAND_LINE.match(line))
    )


def help_options(text: str) -> frozenset[str]:
    """Every option a click help screen lists under ``Options:`` (``--a / --no-a`` gives both)."""
    options: set[str] = set()
    for line in _section(text, "options:"):
        head = line.strip()
        if head.startswith("-"):
            # Only the flag column: the description may mention other flags.
            column = re.split(r"\s{2,}", head, maxsplit=1)[0]
            options.update(m.group(1) for m in _OPTION.finditer(column))
    return frozenset(options)


# -- job state -------------------------------------------------------------------------------------

_STATE_LINE = re.compile(r"^State:\s*(?P<state>\S+)(?P<fields>.*)$")
_STATE_FIELD = re.compile(r"^(?P<key>[a-z_]+)=(?P<value>\S*)$")
_STATE_INTS = {"exit": r"-?\d+", "failures": r"\d+", "preemptions": r"\d+"}
# An exit code is a process's status (0..255, or a negated signal as a local backend reports it); a
# count of failures past 2**31 is no job's. Outside
# these, iris's answer is garbled, not a fact to act on.
EXIT_RANGE = (-255, 255)
COUNT_RANGE = (0, 2**31 - 1)
_RANGES = {"exit": EXIT_RANGE, "failures": COUNT_RANGE, "preemptions": COUNT_RANGE}
# Timestamps a newer iris adds (`finished_at`, `submitted_at_ms`): not read, but a garbled one means
# the answer is, so each is checked: ISO-8601 text or epoch
# seconds for `*_at`, epoch milliseconds for `*_at_ms`.
_YEARS = (2000, 2200)
_DIAGNOSTIC_HEADERS = ("DIAGNOSTIC", "ERROR")


def _believed_exit(state: JobState, raw: object, tasks: Sequence[TaskRow] = ()) -> int | None:
    """iris prints the proto default 0 for a job that is not done, and the 2026-06 controller leaves
    the job's own exit at 0 even for a failed job (the
    task carries the code): a clean exit only when it
    succeeded, else the job's code, else the first non-zero task code."""
    if state is JobState.SUCCEEDED:
        return int(raw or 0)
    if not state.terminal:
        return None
    if raw not in (None, "", 0, "0"):
        return int(raw)  # type: ignore[arg-type]
    return next((t.exit_code for t in tasks if t.exit_code), None)


def parse_state_text(text: str, *, job_id: str, secrets: Iterable[str] = ()) -> JobSummary:
    """`job describe ID` or `job summary ID` (text)
    as a JobSummary; IrisError when it is neither."""
    lines = text.splitlines()
    state_at = next((i for i, line in enumerate(lines) if _STATE_LINE.match(line.strip())), None)
    if state_at is None:
        raise IrisError(
            f"iris printed no `State: ...` line for {job_id} (lines "
            f"1-{len(lines)}):\n{redact(text, secrets)[:2000]}"
        )
    m = _STATE_LINE.match(lines[state_at].strip())
    assert m is not None
    fields = _state_fields(state_at + 1, lines[state_at].strip(), m["fields"], job_id, secrets)
    try:
        state = JobState.parse(m["state"])
    except IrisUnreadable as exc:
        raise IrisUnreadable(
            f"{exc} (line {state_at + 1} for {job_id}: "
            f"{redact(lines[state_at].strip(), secrets)!r})"
        ) from None
    head_end = next(
        (i for i in range(state_at + 1, len(lines)) if not lines[i].strip()), len(lines)
    )
    error: list[str] = []
    for line in lines[state_at + 1 : head_end]:
        if line.startswith("Error:"):
            error.append(line.removeprefix("Error:").strip())
        elif error:
            error.append(line.strip())  # a message that runs over several lines
    table_at = next((i for i in range(head_end, len(lines)) if _is_header(lines[i])), None)
    tasks = _task_rows(lines[table_at:], table_at + 1) if table_at is not None else []
    message = "\n".join(error).strip()
    return JobSummary(
        job_id=job_id,
        state=state,
        exit_code=_believed_exit(state, fields["exit"], tasks),
        error=redact(message, secrets) or None,
        failures=int(fields.get("failures") or 0),
        preemptions=int(fields.get("preemptions") or 0),
        tasks=[t.model_copy(update={"diagnostic": redact(t.diagnostic, secrets)}) for t in tasks],
    )


def _state_fields(
    number: int, line: str, text: str, job_id: str, secrets: Iterable[str]
) -> dict[str, str]:
    """`exit=<int>  failures=<int>  preemptions=<int>` after the state; each one an integer."""
    fields: dict[str, str] = {}
    for word in text.split():
        f = _STATE_FIELD.match(word)
        if f is None or f["key"] not in _STATE_INTS:
            continue  # a field a newer iris adds is not ours to judge
        if not re.fullmatch(_STATE_INTS[f["key"]], f["value"]):
            raise IrisUnreadable(
                f"iris printed {f['key']}={f['value']!r} for {job_id}, not an integer "
                f"(line {number}: {redact(line, secrets)!r})"
            )
        lo, hi = _RANGES[f["key"]]
        if not lo <= int(f["value"]) <= hi:
            raise IrisUnreadable(
                f"iris printed {f['key']}={f['value'][:40]!r} for {job_id}, outside {lo}..{hi} "
                f"(line {number}: {redact(line[:200], secrets)!r})"
            )
        fields[f["key"]] = f["value"]
    if "exit" not in fields:
        raise IrisUnreadable(
            f"iris printed a State line without exit=<int> for {job_id} (line {number}: "
            f"{redact(line, secrets)!r})"
        )
    return fields


def _is_header(line: str) -> bool:
    words = line.split()
    return bool(words) and words[0] == "TASK" and "STATE" in words


def _task_rows(lines: list[str], first_line: int) -> list[TaskRow]:
    """The task table (tabulate "plain": columns start where their headers start)."""
    header = lines[0]
    starts = {name: header.index(name) for name in ("STATE", "EXIT", "DURATION") if name in header}
    diag_name = next((h for h in _DIAGNOSTIC_HEADERS if re.search(rf"\b{h}\b", header)), None)
    diag_at = header.index(diag_name) if diag_name else None
    rows = []
    for offset, line in enumerate(lines[1:], 1):
        if not line.strip():
            break
        parts = line.split()
        if len(parts) < 2:
            continue
        exit_text = (
            line[starts["EXIT"] : starts.get("DURATION", starts["EXIT"] + 6)].strip()
            if "EXIT" in starts
            else "-"
        )
        if (
            re.fullmatch(r"-?\d+", exit_text)
            and not EXIT_RANGE[0] <= int(exit_text) <= EXIT_RANGE[1]
        ):
            raise IrisUnreadable(
                f"iris printed task {parts[0]}'s EXIT {exit_text[:40]!r}, outside "
                f"{EXIT_RANGE[0]}..{EXIT_RANGE[1]} "
                f"(line {first_line + offset}: {line.strip()[:200]!r})"
            )
        rows.append(
            TaskRow(
                index=parts[0],
                state=parts[1],
                exit_code=int(exit_text) if re.fullmatch(r"-?\d+", exit_text) else None,
                diagnostic=line[diag_at:].strip()
                if diag_at is not None and len(line) > diag_at
                else "",
            )
        )
    return rows


def parse_state_json(data: object, *, job_id: str, secrets: Iterable[str] = ()) -> JobSummary:
    """`job summary ID --json` (2026-04..07) as a JobSummary."""
    if not isinstance(data, dict):
        raise IrisUnreadable(
            f"iris answered {type(data).__name__} for job {job_id} ($), expected a JSON object"
        )
    state_value = data.get("state")
    try:
        state = JobState.parse("" if state_value is None else state_value)
    except IrisUnreadable as exc:
        raise IrisUnreadable(f"{exc} ($.state for {job_id})") from None
    raw_tasks = data.get("tasks")
    if raw_tasks is not None and not isinstance(raw_tasks, list):
        raise IrisUnreadable(
            f"iris reported $.tasks {_shown(raw_tasks, secrets)} for {job_id}, not a list"
        )
    tasks = []
    for i, t in enumerate(raw_tasks or []):
        if not isinstance(t, dict):
            raise IrisUnreadable(
                f"iris reported $.tasks[{i}] {_shown(t, secrets)} for {job_id}, not an object"
            )
        _json_times(t, f"$.tasks[{i}]", job_id, secrets)
        tasks.append(
            TaskRow(
                index=str(t.get("index", "?")),
                state=str(t.get("state", "")),
                exit_code=_json_int(
                    t, "exit_code", f"$.tasks[{i}].exit_code", job_id, secrets, EXIT_RANGE
                ),
                diagnostic=redact(str(t.get("error") or ""), secrets),
            )
        )
    exit_raw = _json_int(data, "exit_code", "$.exit_code", job_id, secrets, EXIT_RANGE)
    _json_times(data, "$", job_id, secrets)
    error = data.get("error") or ""
    return JobSummary(
        job_id=str(data.get("job_id") or job_id),
        state=state,
        exit_code=_believed_exit(state, exit_raw, tasks),
        error=redact(str(error), secrets) or None,
        failures=_json_int(data, "failure_count", "$.failure_count", job_id, secrets, COUNT_RANGE)
        or 0,
        preemptions=_json_int(
            data, "preemption_count", "$.preemption_count", job_id, secrets, COUNT_RANGE
        )
        or 0,
        tasks=tasks,
    )


def _shown(value: object, secrets: Iterable[str]) -> str:
    return redact(repr(value), secrets)[:200]


def _json_int(
    obj: dict[str, Any],
    key: str,
    where: str,
    job_id: str,
    secrets: Iterable[str],
    bounds: tuple[int, int],
) -> int | None:
    """An integer field of iris's JSON (absent or null: None). A bool, a string or a number outside
    `bounds` is refused, not guessed."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        # `where` ends in the key: the message reads "... $.exit_code 'abc' ...".
        raise IrisUnreadable(
            f"iris reported {where} {_shown(value, secrets)} for {job_id}: not an integer"
        )
    if not bounds[0] <= value <= bounds[1]:
        raise IrisUnreadable(
            f"iris reported {where} {_shown(value, secrets)[:40]} for {job_id}: outside "
            f"{bounds[0]}..{bounds[1]}"
        )
    return value


def _json_times(obj: dict[str, Any], where: str, job_id: str, secrets: Iterable[str]) -> None:
    """Every `*_at` / `*_at_ms` field of one object is a time in 2000..2200, or null."""
    for key, value in obj.items():
        if value is None or not key.endswith(("_at", "_at_ms")):
            continue
        try:
            year = _year(value, milliseconds=key.endswith("_ms"))
        except (TypeError, ValueError, OverflowError, OSError):
            year = None
        if year is None or not _YEARS[0] <= year <= _YEARS[1]:
            kind = (
                "epoch milliseconds" if key.endswith("_ms") else "an ISO-8601 time or epoch seconds"
            )
            raise IrisUnreadable(
                f"iris reported {where}.{key} {_shown(value, secrets)[:80]} for {job_id}: not "
                f"{kind} "
                f"in {_YEARS[0]}..{_YEARS[1]}"
            )


def _year(value: object, *, milliseconds: bool) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value / 1000 if milliseconds else value, tz=UTC).year
    if isinstance(value, str) and not milliseconds:
        return datetime.fromisoformat(value).year
    return None


def parse_state_output(
    stdout: str, *, job_id: str, json_output: bool, secrets: Iterable[str] = ()
) -> JobSummary:
    if not json_output:
        return parse_state_text(stdout, job_id=job_id, secrets=secrets)
    try:
        # Strict: a state named twice (json.loads keeps the last: a `failed` hidden behind a
        # `succeeded`), deep nesting and NULs are refused with the line and JSON path.
        data: Any = loads_json(stdout, job_id)
    except FileFormatError as exc:
        # Cut-off output may be a one-off (a poll retries an
        # IrisError); a duplicate key reads the same every time.
        kind = IrisError if exc.message.startswith("not JSON") else IrisUnreadable
        raise kind(
            f"`job summary --json` for {job_id} printed something lockstep cannot read "
            f"(line {exc.line}): {redact(exc.message, secrets)}\n{redact(stdout, secrets)[:2000]}"
        ) from None
    return parse_state_json(data, job_id=job_id, secrets=secrets)


# -- job list --------------------------------------------------------------------------------------


def parse_list_text(text: str) -> list[ListedJob]:
    """`job list` as rows (the JSON form went away on 2026-07-03; the table is in every version)."""
    lines = [line for line in text.splitlines() if line.strip()]
    header_at = next(
        (i for i, line in enumerate(lines) if line.split()[:3] == ["JOB", "ID", "STATE"]), None
    )
    if header_at is None:
        return []
    header = lines[header_at]
    cols = [c for c in ("STATE", "SUBMITTED", "REASON") if c in header]
    at = {c: header.index(c) for c in cols}
    rows = []
    for line in lines[header_at + 1 :]:
        if not line.startswith("/") and not line.lstrip().startswith("/"):
            break  # the "Showing the N most recent jobs" note
        job_id = line.split()[0]
        state = line[at["STATE"] : at.get("SUBMITTED", len(line))].strip() if "STATE" in at else ""
        submitted = (
            line[at["SUBMITTED"] : at.get("REASON", len(line))].strip()
            if "SUBMITTED" in at
            else "-"
        )
        reason = line[at["REASON"] :].strip() if "REASON" in at and len(line) > at["REASON"] else ""
        rows.append(
            ListedJob(
                job_id=job_id,
                state=state.split()[0] if state else "",
                submitted=submitted or "-",
                reason=reason,
            )
        )
    return rows


# -- logs ------------------------------------------------------------------------------------------

_LOG_PREFIX = re.compile(r"^\[\d{2}:\d{2}:\d{2}\] task=\S+(?: attempt=\S+)? \| ")


def log_text(line: str) -> str:
    """What the job printed, without iris's ``[HH:MM:SS] task=... |`` prefix."""
    return _LOG_PREFIX.sub("", line, count=1)
