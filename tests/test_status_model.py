"""lockstep/status_model.py, pure: each mismatch warning appears (and none when the facts agree),
the record survives its JSON round trip, a bad record
is refused naming the URL, and the plans read it.
`lockstep status` itself against a real webserver is tests/tpu/test_status.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from lockstep.graphql import Webserver
from lockstep.status_cmd import NoStatus, plan_text, read_status, status
from lockstep.status_model import (
    ConsumerLock,
    Hold,
    LaneFacts,
    NewestBuild,
    Refusal,
    RollbackFacts,
    Status,
    TpuFacts,
    mismatch_warnings,
    render,
)

HARBOR_A, HARBOR_B = "a" * 40, "b" * 40
ID_1, ID_2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
DIGEST = "sha256:" + "d" * 64


def facts(
    *, baked: str = HARBOR_A, locked: str = HARBOR_A, nodes: dict[str, str] | None = None
) -> tuple[TpuFacts, ConsumerLock, list[LaneFacts]]:
    tpu = TpuFacts(
        image="127.0.0.1:5000/lockstep/tpu-runtime",
        tag="tpu",
        digest=DIGEST,
        build="c" * 40,
        baked_harbor=baked,
        baked_from="verified record",
    )
    consumer = ConsumerLock(branch="main", head="e" * 40, harbor_commit=locked)
    lane = LaneFacts(
        name="glm53-2x",
        action="boot",
        rev="r28",
        tag="jovian-judgement:r28-glm53",
        expected_image_id=ID_1,
        nodes=nodes or {"spark-a": ID_1, "spark-b": ID_1},
        ready_since=1.0e9,
    )
    return tpu, consumer, [lane]


def a_status(**kwargs: object) -> Status:
    tpu, consumer, lanes = facts(**kwargs)  # type: ignore[arg-type]
    return Status(
        as_of=1.7e9,
        tpu=tpu,
        consumer=consumer,
        tag_hold=Hold(held=True, reason="rollback to build 12345678", since=1.6e9, by="run abc"),
        harbor_hold=Hold(held=False),
        newest_build=NewestBuild(
            build="f" * 40,
            digest=ID_2.replace("2", "9"),
            harbor_commit=HARBOR_B,
            verified_at=1.6e9,
            promotable=False,
            refusals=[Refusal(rule="soak", message="soak: wait until 12:00")],
            attestation="attested: referrer signed by trusted key 0123456789abcdef",
            changelog="harbor aaaaaaaa -> bbbbbbbb: 2 commits added",
        ),
        rollback=RollbackFacts(
            target_build="1" * 40,
            target_digest=DIGEST,
            explanation=":tpu is at x.\n  build 11111111: -> TARGET",
            scopes="What each scope changes:\n  image: ...",
        ),
        lanes=lanes,
        warnings=mismatch_warnings(tpu, consumer, lanes),
    )


def test_no_warning_when_the_image_bakes_the_locked_harbor_and_every_node_serves_the_distributed_image() -> (  # noqa: E501
    None
):
    assert mismatch_warnings(*facts()) == []


def test_an_image_baking_another_harbor_than_the_lock_is_a_warning_naming_both() -> None:
    (warning,) = mismatch_warnings(*facts(baked=HARBOR_A, locked=HARBOR_B))
    assert (
        "bakes harbor aaaaaaaa" in warning
        and "pins harbor bbbbbbbb" in warning
        and ":tpu" in warning
    )


def test_a_lane_node_serving_another_image_id_is_a_warning_naming_the_node() -> None:
    (warning,) = mismatch_warnings(*facts(nodes={"spark-a": ID_1, "spark-b": ID_2}))
    assert "node spark-b serves image sha256:222222222222" in warning and "r28" in warning
    assert "spark-a" not in warning


def test_unknown_facts_are_not_mismatches() -> None:
    tpu, consumer, lanes = facts(baked=HARBOR_A, locked=HARBOR_B, nodes={"spark-a": ID_2})
    tpu.baked_harbor = None
    lanes[0].expected_image_id = None
    assert mismatch_warnings(tpu, consumer, lanes) == []


def test_the_record_round_trips_through_json_and_renders_warnings_first() -> None:
    found = a_status(baked=HARBOR_A, locked=HARBOR_B)
    again = Status.model_validate(json.loads(found.model_dump_json()))
    assert again == found and again.fingerprint_json() == found.fingerprint_json()
    # time left out
    assert found.model_copy(update={"as_of": 2.0e9}).fingerprint_json() == found.fingerprint_json()
    text = render(found, now=found.as_of + 40)
    assert text.splitlines()[0].startswith(
        "WARNING: :tpu (sha256:dddddddddddd) bakes harbor aaaaaaaa"
    )
    assert "as of 40 s ago" in text and "tag hold   : HELD (rollback to build 12345678" in text
    assert "NOT promotable: soak" in text and "spark-b: sha256:111111111111" in text


# -- the command, against a stand-in webserver that answers one GraphQL document -------------------


class _Answer(BaseHTTPRequestHandler):
    body: bytes = b"{}"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webserver() -> Iterator[tuple[str, type[_Answer]]]:
    handler = type("Answer", (_Answer,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def answering(handler: type[_Answer], metadata: object | None) -> None:
    observations = (
        []
        if metadata is None
        else [
            {
                "timestamp": "1700000000000",
                "runId": "",
                "metadataEntries": [
                    {
                        "__typename": "JsonMetadataEntry",
                        "label": "status",
                        "jsonString": json.dumps(metadata),
                    }
                ],
            }
        ]
    )
    handler.body = json.dumps(
        {
            "data": {
                "assetOrError": {
                    "__typename": "Asset",
                    "assetObservations": observations,
                    "assetMaterializations": [],
                }
            }
        }
    ).encode()


def test_status_exit_codes_follow_the_warnings_and_a_bad_record_is_an_operational_error(
    webserver: tuple[str, type[_Answer]],
) -> None:
    url, handler = webserver
    runner = CliRunner()
    answering(handler, json.loads(a_status().model_dump_json()))
    ok = runner.invoke(status, ["--url", url, "--json"])
    assert ok.exit_code == 0, ok.output
    assert Status.model_validate_json(ok.stdout).tpu.digest == DIGEST
    assert ok.stderr.startswith("as of ") and ok.stderr.rstrip().endswith("ago, status_sensor")

    answering(handler, json.loads(a_status(baked=HARBOR_A, locked=HARBOR_B).model_dump_json()))
    warned = runner.invoke(status, ["--url", url])
    assert warned.exit_code == 1 and warned.output.startswith("WARNING: ")

    broken = json.loads(a_status().model_dump_json())
    broken["tpu"]["digest"] = 7
    answering(handler, broken)
    bad = runner.invoke(status, ["--url", url])
    assert bad.exit_code == 3 and url in bad.output and "tpu.digest" in bad.output

    answering(handler, None)
    with pytest.raises(NoStatus, match="no lockstep/status observation yet: turn on status_sensor"):
        read_status(Webserver(url))
    assert runner.invoke(status, ["--url", url]).exit_code == 3


def test_plan_text_answers_promote_and_rollback_from_the_record(
    webserver: tuple[str, type[_Answer]],
) -> None:
    url, handler = webserver
    answering(handler, json.loads(a_status().model_dump_json()))
    promote, may = plan_text(Webserver(url), action="promote")
    assert not may and "promote build ffffffff" in promote and "soak: wait until 12:00" in promote
    assert (
        "changelog: harbor aaaaaaaa -> bbbbbbbb" in promote
        and "attestation: attested: referrer" in promote
    )
    rollback, target = plan_text(Webserver(url), action="rollback")
    assert target and "rollback to build 11111111" in rollback and "-> TARGET" in rollback
    assert "What each scope changes" in rollback


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1:3000", "http://127.0.0.1:3000/\x1b[31m", "-rf", ""]
)
def test_a_url_that_is_not_a_webserver_is_refused_before_anything_is_asked(url: str) -> None:
    said = CliRunner().invoke(status, ["--url", url])
    assert said.exit_code == 2 and "--url" in said.output, said.output
