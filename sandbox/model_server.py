"""The sandbox's served model: a small deterministic OpenAI-compatible server for one image.

Only the model is simulated (no GPU, no weights here); the bench tools that talk to it are the real
`tool-eval-bench` 3.0.0 and `llama-benchy` 0.4.0. It answers what their adapters ask
(tool_eval_bench/adapters/openai_compat.py,
tool_eval_bench/utils/metadata.py, llama_benchy/client.py):

    GET  /health /ping /version /v1/models
    POST /v1/chat/completions   (tools + tool_choice; `stream: true` as SSE with
    `stream_options.include_usage`) POST /v1/completions

and it starts the way vLLM's OpenAI API server does (vllm/entrypoints/openai/api_server.py under
uvicorn): the `GPU KV cache size: N tokens` line of the engine's profiling run, then uvicorn's
`Application startup complete.`; the port is bound only then, so nothing answers before startup.
Each answered request is one uvicorn-style access-log
line. SIGTERM exits 0 (uvicorn's graceful stop).

It is the image's ``vllm`` command: the sandbox lab's vLLM fork vendors this file as
``vllm/entrypoints/cli/main.py`` with the console script ``vllm = vllm.entrypoints.cli.main:main``
(where the real fork has vLLM's CLI), so the lane runs it in a real container with the image's own
Python, exactly as the recipe's serve command is written:

    vllm serve MODEL --served-model-name NAME --host 0.0.0.0 --port N [--headless --node-rank R] ...

What it serves comes from the installed ``vllm`` package: its version (the engine string) and, when
the lab committed one in the fork, ``vllm/sandbox_model.toml``: ``quality = "broken"`` serves a
model that never calls a tool and answers every question with the same refusal (it scores low);
``fault = "exit"`` dies at start with vLLM's CUDA out-of-memory error; ``fault = "hang"`` never
reaches its KV-cache line; ``cold_s``/``warm_s`` change the start delays. The GPU's JIT kernels are
the container's bind mounts under $HOME (the site's JIT cache dir): all populated is a warm start
(~9 min scaled to 0.3 s), otherwise cold (~45 min scaled to 2 s), and a start that got ready fills
them. Otherwise the model is "good": it calls the offered tool whose name and description best match
the user's words, fills the required arguments from the schema and the message, and after a tool
result answers with it. Same request, same answer: there is no randomness
but the request's own `seed`, which only breaks ties.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import importlib.util
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
# seconds to the KV-cache line, then to application startup: ~45 min scaled down
COLD_S = (1.5, 0.5)
WARM_S = (0.2, 0.1)  # ~9 min scaled down
MARKER = "sandbox_model.toml"
DECODE_S = 0.002  # per generated token on llama-benchy's load requests
MAX_BODY = 8 * 1024 * 1024
# the tokens it counts; the offline llama-benchy tokenizer splits alike
_WORD = re.compile(r"\w+|[^\w\s]")
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "to",
        "of",
        "for",
        "in",
        "on",
        "and",
        "or",
        "is",
        "are",
        "be",
        "me",
        "my",
        "i",
        "you",
        "your",
        "it",
        "this",
        "that",
        "with",
        "what",
        "please",
        "can",
        "could",
        "would",
        "should",
        "do",
        "does",
        "from",
        "at",
        "by",
        "as",
    ]
)


def count_tokens(text: str) -> int:
    return len(_WORD.findall(text))


@dataclass(frozen=True)
class Model:
    name: str
    quality: str  # "good" | "broken"
    engine_version: str
    # "exit": the engine dies at start; "hang": it never reaches its KV-cache line
    fault: str | None = None
    cold_s: tuple[float, float] = COLD_S
    warm_s: tuple[float, float] = WARM_S

    @classmethod
    def installed(cls, name: str) -> Model:
        """The model the image's installed vllm package serves: its version, and what its
        ``vllm/sandbox_model.toml`` (committed in the sandbox
        lab's fork when a rev is meant to misbehave) says."""
        spec = importlib.util.find_spec("vllm")
        pkg = Path(spec.origin).parent if spec and spec.origin else None
        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            version = "0.0.0"
        knobs: dict[str, Any] = {}
        if pkg is not None and (pkg / MARKER).is_file():
            knobs = tomllib.loads((pkg / MARKER).read_text(encoding="utf-8"))
        return cls(
            name=name,
            quality=str(knobs.get("quality", "good")),
            engine_version=version,
            fault=knobs.get("fault"),
            cold_s=tuple(knobs.get("cold_s", COLD_S)),  # type: ignore[arg-type]
            warm_s=tuple(knobs.get("warm_s", WARM_S)),
        )  # type: ignore[arg-type]


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
    if schema.get("enum"):
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
    # A name-like phrase (capitalised words) is what most
    # string arguments want: a city, a person, a file.
    caps = re.findall(r"\b[A-Z][\w.@-]*(?:\s+[A-Z][\w.@-]*)*", text)
    caps = [
        c
        for c in caps
        if c.lower() not in _STOP and c.split()[0] not in ("I", "What", "Please", "Can")
    ]
    if caps:
        return caps[0]
    hint = _words(name.replace("_", " "))
    words = [w for w in re.findall(r"\S+", text) if w.lower().strip(".,?!") not in _STOP]
    return next((w.strip(".,?!") for w in words if w.lower() in hint), " ".join(words[:6]) or name)


def _pick_tool(
    tools: list[dict[str, Any]], text: str, choice: Any, seed: int
) -> dict[str, Any] | None:
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
    user = next(
        (_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
    )
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
            args = {
                k: _value_for(k, props.get(k) or {}, user) for k in params.get("required") or []
            }
            call_id = (
                "call_"
                + hashlib.sha256(
                    json.dumps([fn.get("name"), args, len(messages)], sort_keys=True).encode()
                ).hexdigest()[:16]
            )
            return {
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": fn.get("name", ""), "arguments": json.dumps(args)},
                    }
                ]
            }
    return {"content": "I can answer that directly: " + " ".join(user.split()[:40])}


def filler(n: int) -> list[str]:
    """`n` deterministic tokens for generation benchmarks
    (each a word the token counter counts once)."""
    return [f" tok{i % 97}" for i in range(n)]


# ---- HTTP --------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    model: Model  # set on the class by serve()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _access(self, status: int) -> None:
        phrase = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            413: "Request Entity Too Large",
        }.get(status, "")
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
        self._json(
            status,
            {
                "object": "error",
                "message": message,
                "type": "BadRequestError",
                "param": None,
                "code": status,
            },
        )

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
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": self.model.name,
                            "object": "model",
                            "created": 0,
                            "owned_by": "vllm",
                            "root": self.model.name,
                            "parent": None,
                            "max_model_len": 32768,
                            "permission": [],
                        }
                    ],
                },
            )
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
            prompt = " ".join(
                _text(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict)
            )
            self._complete(
                body, count_tokens(prompt) + 2 * len(body.get("messages") or []), chat=True
            )

    def _complete(self, body: dict[str, Any], prompt_tokens: int, chat: bool) -> None:
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 256
        max_tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 256
        rid = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[
            :24
        ]
        if (
            chat
            and (body.get("messages") and not body.get("min_tokens"))
            and not _is_bench_load(body)
        ):
            message = answer(self.model, body)
        else:
            message = {"content": "".join(filler(max_tokens))}
        pieces = [m.group() for m in re.finditer(r"\s*\S+", message.get("content") or "")][
            :max_tokens
        ]
        if "content" in message:
            message["content"] = "".join(pieces)
        finish = (
            "tool_calls"
            if "tool_calls" in message
            else ("length" if len(pieces) >= max_tokens else "stop")
        )
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max(len(pieces), 1 if "tool_calls" in message else 0),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        base = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{rid}",
            "created": 0,
            "model": self.model.name,
        }
        if not body.get("stream"):
            if chat:
                choice = {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": message.get("content"),
                        "tool_calls": message.get("tool_calls", []),
                    },
                    "finish_reason": finish,
                    "logprobs": None,
                }
                self._json(
                    200, {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
                )
            else:
                self._json(
                    200,
                    {
                        **base,
                        "object": "text_completion",
                        "usage": usage,
                        "choices": [
                            {
                                "index": 0,
                                "text": message.get("content", ""),
                                "finish_reason": finish,
                            }
                        ],
                    },
                )
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
            self.wfile.write(
                b"data: " + json.dumps({**base, "object": obj, **chunk}).encode() + b"\n\n"
            )
            self.wfile.flush()
        if (body.get("stream_options") or {}).get("include_usage"):
            self.wfile.write(
                b"data: "
                + json.dumps({**base, "object": obj, "choices": [], "usage": usage}).encode()
                + b"\n\n"
            )
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self._access(200)


def _is_bench_load(body: dict[str, Any]) -> bool:
    """llama-benchy's generation requests ask for token
    ids; they get `max_tokens` tokens, as a GPU would."""
    return bool(body.get("return_token_ids"))


def _chunks(
    message: dict[str, Any], pieces: list[str], finish: str, chat: bool, want_ids: bool
) -> Iterator[dict[str, Any]]:
    if not chat:
        for piece in pieces:
            yield {"choices": [{"index": 0, "text": piece, "finish_reason": None}]}
        yield {"choices": [{"index": 0, "text": "", "finish_reason": finish}]}
        return
    yield {
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        ]
    }
    for i, call in enumerate(message.get("tool_calls", [])):
        yield {
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": i, **call}]}, "finish_reason": None}
            ]
        }
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


def jit_caches() -> list[Path]:
    """The JIT kernel caches this container was given:
    the bind mounts under $HOME (``-v DIR:/root/...``),
    read from /proc/self/mountinfo. Empty ones mean a
    cold start; a start that got ready fills them."""
    home = os.environ.get("HOME", "/root").rstrip("/") + "/"
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text(encoding="utf-8").splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(home) and Path(point).is_dir():
                found.append(Path(point))
    return found


def is_warm(caches: list[Path]) -> bool:
    return bool(caches) and all(any(c.iterdir()) for c in caches)


def fill_jit_caches(caches: list[Path], version: str) -> None:
    for cache in caches:
        with contextlib.suppress(OSError):
            kernels = cache / "sm121a"
            kernels.mkdir(parents=True, exist_ok=True)
            (kernels / f"flashinfer_jit_{version}.so").write_bytes(b"\x7fELF sandbox jit kernel\n")


def _stamp() -> str:
    return time.strftime("%m-%d %H:%M:%S")


def crash(model: Model) -> int:
    emit(f"INFO {_stamp()} [api_server.py] vLLM API server version {model.engine_version}")
    time.sleep(0.2)
    emit(f"ERROR {_stamp()} [core.py] EngineCore failed to start.")
    print(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity "
        "of 119.70 GiB of which 1.12 GiB is free.",
        file=sys.stderr,
        flush=True,
    )
    return 1


def headless(model: Model, rank: str, caches: list[Path], kv_s: float) -> int:
    """A multi-node worker (`--headless`): binds nothing, loads its shard, waits for SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    emit(
        f"INFO {_stamp()} [multiproc_executor.py] headless worker, node rank {rank}: waiting for "
        "the head"
    )
    if not stop.wait(kv_s):
        emit(f"INFO {_stamp()} [gpu_worker.py] JIT kernels ready")
        fill_jit_caches(caches, model.engine_version)
    stop.wait()
    return 0


def serve(model: Model, host: str, port: int, kv_after_s: float, startup_after_s: float) -> int:
    stop = threading.Event()
    server: list[ThreadingHTTPServer] = []

    def on_term(signum: int, frame: object) -> None:
        stop.set()
        if server:
            threading.Thread(target=server[0].shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    emit(f"INFO {_stamp()} [api_server.py] vLLM API server version {model.engine_version}")
    emit(
        f"INFO {time.strftime('%m-%d %H:%M:%S')} [api_server.py] args: model={model.name!r}, "
        f"host={host!r}, "
        f"port={port}, served_model_name=[{model.name!r}]"
    )
    if stop.wait(kv_after_s):
        return 0
    emit(
        f"INFO {time.strftime('%m-%d %H:%M:%S')} [kv_cache_utils.py] GPU KV cache size: "
        f"{KV_CACHE_TOKENS} tokens"
    )
    emit(
        f"INFO {time.strftime('%m-%d %H:%M:%S')} [kv_cache_utils.py] Maximum concurrency for "
        "32,768 tokens per "
        "request: 37.68x"
    )
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
    fill_jit_caches(jit_caches(), model.engine_version)
    emit(
        f"INFO:     Uvicorn running on http://{host}:{httpd.server_address[1]} (Press CTRL+C to "
        "quit)"
    )
    if not stop.is_set():
        httpd.serve_forever(poll_interval=0.1)
    httpd.server_close()
    emit("INFO:     Shutting down")
    emit("INFO:     Finished server process")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``vllm serve MODEL [--served-model-name N] [--host H] [--port P] [--headless] [--node-rank R]
    ...``: the options vLLM's CLI takes
    (vllm/entrypoints/cli/serve.py); the ones that only matter on a GPU
    (tensor parallelism, master address) are accepted and ignored."""
    parser = argparse.ArgumentParser(prog="vllm", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve")
    serve_p.add_argument("model")
    serve_p.add_argument("--host", default="0.0.0.0")
    serve_p.add_argument("--port", type=int, default=8000)
    serve_p.add_argument("--served-model-name")
    serve_p.add_argument("--headless", action="store_true")
    serve_p.add_argument("--node-rank", default="0")
    args, _ignored = parser.parse_known_args(argv)
    model = Model.installed(args.served_model_name or args.model)
    caches = jit_caches()
    kv_s, startup_s = model.warm_s if is_warm(caches) else model.cold_s
    if args.headless:
        return headless(model, args.node_rank, caches, kv_s)
    if model.fault == "exit":
        return crash(model)
    if model.fault == "hang":
        kv_s = 3600.0
    try:
        return serve(model, args.host, args.port, kv_s, startup_s)
    except OSError as exc:
        emit(
            f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
            f"({args.host!r}, {args.port}): "
            f"{exc.strerror}"
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
