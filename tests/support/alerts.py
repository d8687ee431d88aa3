"""An HTTP receiver for alert posts, the sandbox site
with a webhook, and a ticker of the alert sensor."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dagster as dg

from sandbox.world import Sandbox
from tests.conftest import sandbox_resources
from tpu_assets.definitions import defs as tpu_defs

HOOK_ENV = "LOCKSTEP_TEST_ALERT_HOOK"


SECRET_PATH = "/services/T0KEN-s3cret-alert-hook"


class Receiver:
    """Answers each POST with the next scripted status
    (then 200) and keeps the bodies it answered 2xx."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.delivered: list[dict[str, object]] = []
        self.requests = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.requests += 1
                if status < 300:
                    receiver.delivered.append(body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{SECRET_PATH}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


SANDBOX_ALERTS = '[alerts]\nbase_url = "http://127.0.0.1:3000/"\nwebhook = []\n'


def with_webhook(sb: Sandbox, events: str = "") -> None:
    """The sandbox's site, whose [alerts] names no webhook, with one."""
    text = sb.site_file.read_text()
    assert SANDBOX_ALERTS in text
    sb.site_file.write_text(
        text.replace(
            SANDBOX_ALERTS,
            (
                '[alerts]\nbase_url = "http://dagster.example:3000"\n\n[[alerts.webhook]]\nname '
                '= "ops"\n'
                f'url_env = "{HOOK_ENV}"\n{events}\n'
            ),
        )
    )


class Ticker:
    def __init__(self, sb: Sandbox, instance: dg.DagsterInstance, tmp_path: Path) -> None:
        res = sandbox_resources(sb, tmp_path / "cache")
        self.resources = {"site": res["site"], "git": res["git"]}
        self.instance = instance
        self.cursor: str | None = None
        self.seen: list[str] = []  # everything a tick hands back: cursors and skip reasons

    def __call__(self) -> dg.SensorResult:
        with dg.build_sensor_context(
            cursor=self.cursor, instance=self.instance, resources=self.resources
        ) as ctx:
            result = tpu_defs.resolve_sensor_def("alert_sensor")(ctx)
        self.cursor = result.cursor
        self.seen += [
            result.cursor or "",
            result.skip_reason.skip_message if result.skip_reason else "",
        ]
        return result
