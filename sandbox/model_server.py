"""The sandbox's served model: a small deterministic OpenAI-compatible server for one image.

Only the model is simulated (no GPU, no weights here); the bench tools that talk to it are the real
`tool-eval-bench` 3.0.0 and `llama-benchy` 0.4.0. It answers what their adapters ask
(tool_eval_bench/adapters/openai_compat.py, tool_eval_bench/utils/metadata.py, llama_benchy/client.py):

    GET  /health /ping /version /v1/models
    POST /v1/chat/completions   (tools + tool_choice; `stream: true` as SSE with `stream_options.include_usage`)
    POST /v1/completions

and it starts the way vLLM's OpenAI API server does (vllm/entrypoints/openai/api_server.py under
uvicorn): the `GPU KV cache size: N tokens` line of the engine's profiling run, then uvicorn's
`Application startup complete.`; the port is bound only then, so nothing answers before startup.
Each answered request is one uvicorn-style access-log line. SIGTERM exits 0 (uvicorn's graceful stop).

    python -m sandbox.model_server --rootfs DIR --host 127.0.0.1 --port N --served-model-name NAME \\
        --kv-after-s F --startup-after-s F

What it answers depends on the request and on the image it serves: `--rootfs` is the image's unpacked
root. A rev whose vLLM tree carries ``vllm/sandbox_model.toml`` with ``quality = "broken"`` (the sandbox
lab commits it in the fork, the sandbox docker build installs the package directory, so it lands at
``<site-packages>/vllm/sandbox_model.toml``) serves a model that never calls a tool and answers every
question with the same refusal, so it scores low. Otherwise the model is "good": it calls the offered
tool whose name and description best match the user's words, fills the required arguments from the
schema and the message, and after a tool result answers with it. Same request, same answer: there is no
randomness but the request's own `seed`, which only breaks ties.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

KV_CACHE_TOKENS = "1,234,560"
MARKER = "sandbox_model.toml"
DECODE_S = 0.002  # per generated token on llama-benchy's load requests
MAX_BODY = 8 * 1024 * 1024
_WORD = re.compile(r"\w+|[^\w\s]")  # the tokens it counts; the offline llama-benchy tokenizer splits alike
_STOP = frozenset("a an the to of for in on and or is are be me my i you your it this that with what please "
                  "can could would should do does from at by as".split())


def count_tokens(text: str) -> int:
    return len(_WORD.findall(text))


@dataclass(frozen=True)
class Model:
    name: str
    quality: str  # "good" | "broken"
    engine_version: str

    @classmethod
    def from_rootfs(cls, rootfs: Path, name: str) -> Model:
        quality, version = "good", "0.0.0"
        for marker in sorted(rootfs.glob(f"usr/local/lib/python3*/dist-packages/vllm/{MARKER}")):
            quality = str(tomllib.loads(marker.read_text(encoding="utf-8")).get("quality", "good"))
        for info in sorted(rootfs.glob("usr/local/lib/python3*/dist-packages/vllm-*.dist-info/METADATA")):
            for line in info.read_text(encoding="utf-8").splitlines():
                if line.startswith("Version: "):
                    version = line.removeprefix("Version: ").strip()
        return cls(name=name, quality=quality, engine_version=version)


# ---- what the model says -----------------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP}


def _tool_words(tool: dict[str, Any]) -> set[str]:
    fn = tool.get("function") or {}
    name = str(fn.get("name", ""))
    return _words(name.replace("_", " ") + " " + str(fn.get("description", "")))


def _value_for(name: str, schema: dict[str, Any], text: str) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if "enum" in schema and schema["enum"]:
        lowered = text.lower()
        return next((v for v in schema["enum"] if str(v).lower() in lowered), schema["enum"][0])
    if kind in ("integer", "number"):
        m = re.search(r"-?\d+(?:\.\d+)?", text)
        num = float(m.group()) if m else 1
        return int(num) if kind == "integer" else num
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        return {}
    quoted = re.findall(r"[\"']([^\"']{1,80})[\"']", text)
    if quoted:
        return quoted[0]
    # A name-like phrase (capitalised words) is what most string arguments want: a city, a person, a file.
    caps = re.findall(r"\b[A-Z][\w.@-]*(?:\s+[A-Z][\w.@-]*)*", text)
    caps = [c for c in caps if c.lower() not in _STOP and c.split()[0] not in ("I", "What", "Please", "Can")]
    if caps:
        return caps[0]
    hint = _words(name.replace("_", " "))
    words = [w for w in re.findall(r"\S+", text) if w.lower().strip(".,?!") not in _STOP]
    return next((w.strip(".,?!") for w in words if w.lower() in hint), " ".join(words[:6]) or name)


def _pick_tool(tools: list[dict[str, Any]], text: str, choice: Any, seed: int) -> dict[str, Any] | None:
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        return next((t for t in tools if (t.get("function") or {}).get("name") == wanted), None)
    asked = _words(text)
    scored = []
    for i, tool in enumerate(tools):
        overlap = len(asked & _tool_words(tool))
        tie = hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()
        scored.append((overlap, tie, tool))
    best = max(scored, key=lambda s: (s[0], s[1]), default=None)
    if best is None or (best[0] == 0 and choice != "required"):
        return None
    return best[2]


def answer(model: Model, body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message for a chat request: {"content": str} or {"tool_calls": [...]}."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    last = messages[-1] if messages else {}
    user = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    if model.quality == "broken":
        return {"content": "I am sorry, I cannot help with that."}
    if "capital of france" in user.lower():
        return {"content": "Paris"}
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    choice = body.get("tool_choice", "auto")
    if last.get("role") == "tool":
        start = max(i for i, m in enumerate(messages) if m.get("role") != "tool") + 1
        results = [_text(m.get("content")) for m in messages[start:]]
        return {"content": "Here is what I found: " + " ".join(r[:400] for r in results)}
    if tools and choice != "none":
        seed = body.get("seed") if isinstance(body.get("seed"), int) else 0
        tool = _pick_tool(tools, user, choice, seed)
        if tool is not None:
            fn = tool.get("function") or {}
            params = fn.get("parameters") or {}
            props = params.get("properties") or {}
            args = {k: _value_for(k, props.get(k) or {}, user) for k in params.get("required") or []}
            call_id = "call_" + hashlib.sha256(json.dumps([fn.get("name"), args, len(messages)],
                                                          sort_keys=True).encode()).hexdigest()[:16]
            return {"tool_calls": [{"id": call_id, "type": "function",
                                    "function": {"name": fn.get("name", ""), "arguments": json.dumps(args)}}]}
    return {"content": "I can answer that directly: " + " ".join(user.split()[:40])}


def filler(n: int) -> list[str]:
    """`n` deterministic tokens for generation benchmarks (each a word the token counter counts once)."""
    return [f" tok{i % 97}" for i in range(n)]


# ---- HTTP --------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    model: Model  # set on the class by serve()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _access(self, status: int) -> None:
        phrase = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Request Entity Too Large"}.get(status, "")
        host, port = self.client_address[:2]
        emit(f'INFO:     {host}:{port} - "{self.command} {self.path} HTTP/1.1" {status} {phrase}')

    def _json(self, status: int, doc: Any) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self._access(status)

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"object": "error", "message": message, "type": "BadRequestError", "param": None,
                            "code": status})

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/health", "/ping"):
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()
            self._access(200)
        elif path == "/version":
            self._json(200, {"version": self.model.engine_version})
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{
                "id": self.model.name, "object": "model", "created": 0, "owned_by": "vllm", "root": self.model.name,
                "parent": None, "max_model_len": 32768, "permission": []}]})
        else:
            self._error(404, "Not Found")

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_BODY:
            self._error(413, "request too large")
            return None
        try:
            doc = json.loads(self.rfile.read(length) or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._error(400, "body is not JSON")
            return None
        if not isinstance(doc, dict):
            self._error(400, "body is not a JSON object")
            return None
        if doc.get("model") not in (None, self.model.name):
            self._error(404, f"The model `{doc.get('model')}` does not exist.")
            return None
        return doc

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._error(404, "Not Found")
            return
        body = self._body()
        if body is None:
            return
        if path == "/v1/completions":
            prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else ""
            self._complete(body, count_tokens(prompt), chat=False)
        else:
            prompt = " ".join(_text(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict))
            self._complete(body, count_tokens(prompt) + 2 * len(body.get("messages") or []), chat=True)

    def _complete(self, body: dict[str, Any], prompt_tokens: int, chat: bool) -> None:
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 256
        max_tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 256
        rid = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:24]
        if chat and (body.get("messages") and not body.get("min_tokens")) and not _is_bench_load(body):
            message = answer(self.model, body)
        else:
            message = {"content": "".join(filler(max_tokens))}
        pieces = [m.group() for m in re.finditer(r"\s*\S+", message.get("content") or "")][:max_tokens]
        if "content" in message:
            message["content"] = "".join(pieces)
        finish = "tool_calls" if "tool_calls" in message else ("length" if len(pieces) >= max_tokens else "stop")
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max(len(pieces), 1 if "tool_calls" in message else 0)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        base = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{rid}", "created": 0, "model": self.model.name}
        if not body.get("stream"):
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": message.get("content"),
                                                  "tool_calls": message.get("tool_calls", [])},
                          "finish_reason": finish, "logprobs": None}
                self._json(200, {**base, "object": "chat.completion", "choices": [choice], "usage": usage})
            else:
                self._json(200, {**base, "object": "text_completion", "usage": usage,
                                 "choices": [{"index": 0, "text": message.get("content", ""), "finish_reason": finish}]})
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        obj = "chat.completion.chunk" if chat else "text_completion"
        want_ids = bool(body.get("return_token_ids"))
        for chunk in _chunks(message, pieces, finish, chat, want_ids):
            if want_ids:
                time.sleep(DECODE_S)  # a token at a time, so llama-benchy measures a decode rate
            self.wfile.write(b"data: " + json.dumps({**base, "object": obj, **chunk}).encode() + b"\n\n")
            self.wfile.flush()
        if (body.get("stream_options") or {}).get("include_usage"):
            self.wfile.write(b"data: " + json.dumps({**base, "object": obj, "choices": [], "usage": usage}).encode()
                             + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self._access(200)


def _is_bench_load(body: dict[str, Any]) -> bool:
    """llama-benchy's generation requests ask for token ids; they get `max_tokens` tokens, as a GPU would."""
    return bool(body.get("return_token_ids"))


def _chunks(message: dict[str, Any], pieces: list[str], finish: str, chat: bool,
            want_ids: bool) -> Iterator[dict[str, Any]]:
    if not chat:
        for piece in pieces:
            yield {"choices": [{"index": 0, "text": piece, "finish_reason": None}]}
        yield {"choices": [{"index": 0, "text": "", "finish_reason": finish}]}
        return
    yield {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    for i, call in enumerate(message.get("tool_calls", [])):
        yield {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, **call}]}, "finish_reason": None}]}
    for n, piece in enumerate(pieces):
        choice: dict[str, Any] = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
        if want_ids:
            choice["token_ids"] = [n]
        yield {"choices": [choice]}
    yield {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}


_emit_lock = threading.Lock()


def emit(line: str) -> None:
    with _emit_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def serve(model: Model, host: str, port: int, kv_after_s: float, startup_after_s: float) -> int:
    stop = threading.Event()
    server: list[ThreadingHTTPServer] = []

    def on_term(signum: int, frame: object) -> None:
        stop.set()
        if server:
            threading.Thread(target=server[0].shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    emit(f"INFO {time.strftime('%m-%d %H:%M:%S')} [api_server.py] vLLM API server version {model.engine_version}")
    emit(f"INFO {time.strftime('%m-%d %H:%M:%S')} [api_server.py] args: model={model.name!r}, host={host!r}, "
         f"port={port}, served_model_name=[{model.name!r}]")
    if stop.wait(kv_after_s):
        return 0
    emit(f"INFO {time.strftime('%m-%d %H:%M:%S')} [kv_cache_utils.py] GPU KV cache size: {KV_CACHE_TOKENS} tokens")
    emit(f"INFO {time.strftime('%m-%d %H:%M:%S')} [kv_cache_utils.py] Maximum concurrency for 32,768 tokens per "
         "request: 37.68x")
    if stop.wait(startup_after_s):
        return 0
    Handler.model = model
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.allow_reuse_address = True
    httpd = ThreadingHTTPServer((host, port), Handler)
    server.append(httpd)
    emit(f"INFO:     Started server process [{os.getpid()}]")
    emit("INFO:     Waiting for application startup.")
    emit("INFO:     Application startup complete.")
    emit(f"INFO:     Uvicorn running on http://{host}:{httpd.server_address[1]} (Press CTRL+C to quit)")
    if not stop.is_set():
        httpd.serve_forever(poll_interval=0.1)
    httpd.server_close()
    emit("INFO:     Shutting down")
    emit("INFO:     Finished server process")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.model_server", description=__doc__.split("\n")[0])
    parser.add_argument("--rootfs", required=True, type=Path, help="the served image's unpacked root")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--kv-after-s", type=float, default=0.0)
    parser.add_argument("--startup-after-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    if not args.rootfs.is_dir():
        parser.error(f"--rootfs {args.rootfs}: not a directory")
    model = Model.from_rootfs(args.rootfs, args.served_model_name)
    try:
        return serve(model, args.host, args.port, args.kv_after_s, args.startup_after_s)
    except OSError as exc:
        emit(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address ({args.host!r}, {args.port}): "
             f"{exc.strerror}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
