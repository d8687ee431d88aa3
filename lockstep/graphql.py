"""The Dagster webserver's GraphQL API, as the `lockstep` command uses it: launch a job, follow its
run, read an asset's newest events.

Hand-written over `requests` rather than `dagster_graphql.DagsterGraphQLClient`: that client imports
`dagster` (about 1.9 s here), and a read command must answer in well under that from a fresh
process. It needs no database access: a laptop that reaches the webserver's URL can operate
lockstep. Every answer is untrusted input: shapes are checked where they are read, and an unexpected
one is an operational error naming the URL, never a traceback.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from resources.errors import LockstepError

DEFAULT_URL = "http://127.0.0.1:3000"
TERMINAL = frozenset({"SUCCESS", "FAILURE", "CANCELED"})
REPOSITORY = "__repository__"  # the repository name Dagster gives a location's `Definitions`


class WebserverError(LockstepError):
    """The webserver could not be reached, or answered something other than what was asked."""


_LAUNCH = """
mutation Launch($executionParams: ExecutionParams!) {
  launchRun(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on PythonError { message }
    ... on Error { message }
  }
}
"""

_RUN = """
query Run($runId: ID!, $after: String) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { status tags { key value } }
    ... on PythonError { message }
    ... on RunNotFoundError { message }
  }
  logsForRun(runId: $runId, afterCursor: $after) {
    __typename
    ... on EventConnection {
      cursor
      hasMore
      events {
        __typename
        ... on MessageEvent { message level timestamp stepKey }
        ... on ErrorEvent { error { className message cause { className message cause { className } } } }
      }
    }
    ... on PythonError { message }
  }
}
"""  # noqa: E501

_ASSET_EVENTS = """
query AssetEvents($key: AssetKeyInput!, $limit: Int!) {
  assetOrError(assetKey: $key) {
    __typename
    ... on Asset {
      assetObservations(limit: $limit) { timestamp runId metadataEntries { label ...Meta } }
      assetMaterializations(limit: $limit) { timestamp runId partition metadataEntries { label ...Meta } }
    }
  }
}
fragment Meta on MetadataEntry {
  __typename
  ... on JsonMetadataEntry { jsonString }
  ... on TextMetadataEntry { text }
  ... on BoolMetadataEntry { boolValue }
  ... on IntMetadataEntry { intValue }
  ... on FloatMetadataEntry { floatValue }
  ... on TimestampMetadataEntry { timestamp }
  ... on MarkdownMetadataEntry { mdStr }
  ... on UrlMetadataEntry { url }
}
"""  # noqa: E501


class RunEvent:
    """One message of a run's log, as the webserver gave it."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.kind = str(raw.get("__typename", ""))
        self.message = str(raw.get("message") or "")
        self.level = str(raw.get("level") or "")
        self.step = str(raw.get("stepKey") or "")
        # A failure's exception classes, outermost first, through its causes (Dagster wraps what an
        # op raised): how a caller tells a refusal the code raised on purpose from a crash.
        self.error_classes: list[str] = []
        self.error_message = ""  # the innermost message: what the op said, not Dagster's wrapper
        error = raw.get("error")
        while isinstance(error, dict) and len(self.error_classes) < 5:
            if isinstance(error.get("className"), str):
                self.error_classes.append(error["className"])
            if isinstance(error.get("message"), str) and error["message"].strip():
                self.error_message = error["message"].strip()
            error = error.get("cause")


def metadata_values(entries: object) -> dict[str, object]:
    """A GraphQL metadataEntries list as label -> value (JSON entries parsed)."""
    import json

    out: dict[str, object] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("label"), str):
            continue
        for field in (
            "jsonString",
            "text",
            "boolValue",
            "intValue",
            "floatValue",
            "timestamp",
            "mdStr",
            "url",
        ):
            if field in entry:
                value = entry[field]
                if field == "jsonString" and isinstance(value, str):
                    try:
                        value = json.loads(value)
                    except ValueError:
                        continue
                out[entry["label"]] = value
                break
    return out


class Webserver:
    """One Dagster webserver, by URL (its GraphQL endpoint is `<url>/graphql`)."""

    def __init__(self, url: str = DEFAULT_URL, *, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def query(self, query: str, variables: Mapping[str, object] | None = None) -> dict[str, Any]:
        import requests

        try:
            answer = requests.post(
                f"{self.url}/graphql",
                json={"query": query, "variables": dict(variables or {})},
                timeout=self.timeout_s,
            )
        except requests.RequestException as exc:
            raise WebserverError(
                f"the Dagster webserver at {self.url} did not answer ({type(exc).__name__}): "
                "is it running? (--url, default the local one)"
            ) from None
        if answer.status_code != 200:
            raise WebserverError(
                f"the Dagster webserver at {self.url} answered HTTP {answer.status_code} to a "
                "GraphQL query"
            )
        try:
            body = answer.json()
        except ValueError:
            raise WebserverError(
                f"{self.url}/graphql answered something that is not JSON: is this a Dagster "
                "webserver?"
            ) from None
        if not isinstance(body, dict):
            raise WebserverError(
                f"{self.url}/graphql answered a JSON {type(body).__name__}, not an object"
            )
        if body.get("errors"):
            first = (
                body["errors"][0]
                if isinstance(body["errors"], list) and body["errors"]
                else body["errors"]
            )
            message = first.get("message") if isinstance(first, dict) else first
            raise WebserverError(f"{self.url}/graphql refused the query: {str(message)[:300]}")
        data = body.get("data")
        if not isinstance(data, dict):
            raise WebserverError(f"{self.url}/graphql answered no data")
        return data

    def launch(
        self, *, location: str, job: str, run_config: Mapping[str, object], tags: Mapping[str, str]
    ) -> str:
        """Launch `job` of code location `location`; the new run's id."""
        params = {
            "selector": {
                "repositoryLocationName": location,
                "repositoryName": REPOSITORY,
                "jobName": job,
            },
            "runConfigData": dict(run_config),
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
        }
        result = self.query(_LAUNCH, {"executionParams": params}).get("launchRun") or {}
        kind = result.get("__typename")
        if kind == "LaunchRunSuccess":
            return str(result["run"]["runId"])
        if kind == "RunConfigValidationInvalid":
            errors = "; ".join(
                str(e.get("message")) for e in result.get("errors") or [] if isinstance(e, dict)
            )
            raise WebserverError(f"{location}/{job} refused its run config: {errors[:500]}")
        raise WebserverError(
            f"{location}/{job} was not launched ({kind}): {str(result.get('message') or '')[:500]}"
        )

    def run_events(
        self,
        run_id: str,
        *,
        poll_s: float = 1.0,
        deadline_s: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Iterator[RunEvent | str]:
        """The run's log messages as they come, then its
        final status (a str: SUCCESS, FAILURE, CANCELED)."""
        cursor: str | None = None
        started = time.monotonic()
        while True:
            data = self.query(_RUN, {"runId": run_id, "after": cursor})
            run = data.get("runOrError") or {}
            if run.get("__typename") != "Run":
                raise WebserverError(
                    f"run {run_id}: {run.get('__typename')}: {str(run.get('message') or '')[:300]}"
                )
            logs = data.get("logsForRun") or {}
            if logs.get("__typename") == "EventConnection":
                for event in logs.get("events") or []:
                    if isinstance(event, dict) and event.get("message") is not None:
                        yield RunEvent(event)
                cursor = logs.get("cursor") or cursor
                if logs.get("hasMore"):
                    continue
            if run.get("status") in TERMINAL:
                yield str(run["status"])
                return
            if deadline_s is not None and time.monotonic() - started > deadline_s:
                raise WebserverError(
                    f"run {run_id} is still {run.get('status')} after {deadline_s:.0f} s: "
                    f"follow it at {self.url}/runs/{run_id}"
                )
            sleep(poll_s)

    def asset_events(
        self, path: list[str], *, limit: int = 1
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The asset's newest observations and materializations (newest first), each with `metadata`
        parsed; two empty lists when the asset has none or is not defined."""
        data = (
            self.query(_ASSET_EVENTS, {"key": {"path": path}, "limit": limit}).get("assetOrError")
            or {}
        )
        if data.get("__typename") != "Asset":
            return [], []

        def parsed(events: object) -> list[dict[str, Any]]:
            return (
                [
                    {**e, "metadata": metadata_values(e.get("metadataEntries"))}
                    for e in events
                    if isinstance(e, dict)
                ]
                if isinstance(events, list)
                else []
            )

        return parsed(data.get("assetObservations")), parsed(data.get("assetMaterializations"))
