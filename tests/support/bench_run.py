"""The real bench tools (.tools/bench: tool-eval-bench
3.0.0, llama-benchy 0.4.0) against sandbox/model_server.py.

Used by tests/jovian/test_bench_tools.py's module fixture, and to (re)make the committed outputs in
tests/corpus/bench/ (`.venv/bin/python -m tests.support.bench_run tests/corpus/bench`): the same
commands, so the corpus is what the current tools write.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support.servers import ServerNotReady, start_on_free_port, stop_process, wait_until_ready

PROJECT = Path(__file__).resolve().parents[2]
BENCH_BIN = PROJECT / ".tools" / "bench" / "bin"
MODEL = "glm-5.3-flash"
SEED = 42
VERSION = "0.1.dev0+glm53.r27.63a82f8d"


def bench_installed() -> bool:
    return (BENCH_BIN / "tool-eval-bench").is_file() and (BENCH_BIN / "llama-benchy").is_file()


def make_site(root: Path, *, broken: bool, delays_s: tuple[float, float] = (0.0, 0.0)) -> Path:
    """A site-packages dir as a rev's image installs it:
    the vllm package and its dist-info, with the knobs
    the served model reads (vllm/sandbox_model.toml: a broken rev's quality, the start delays)."""
    vllm = root / "vllm"
    vllm.mkdir(parents=True, exist_ok=True)
    (vllm / "__init__.py").write_text("", encoding="utf-8")
    (root / f"vllm-{VERSION}.dist-info").mkdir(exist_ok=True)
    (root / f"vllm-{VERSION}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.4\nName: vllm\nVersion: {VERSION}\n", encoding="utf-8"
    )
    knobs = f"cold_s = {list(delays_s)}\nwarm_s = {list(delays_s)}\n" + (
        'quality = "broken"\n' if broken else ""
    )
    (vllm / "sandbox_model.toml").write_text(knobs, encoding="utf-8")
    return root


def model_server_argv(port: int, name: str = MODEL) -> list[str]:
    """The served model as the image's `vllm serve` runs
    it, here on the host (the site dir on PYTHONPATH)."""
    return [
        sys.executable,
        "-m",
        "sandbox.model_server",
        "serve",
        "/models/glm-5.3-flash",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        name,
    ]


def model_server_env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{PROJECT}{os.pathsep}{site}", "HOME": str(site)}


@dataclass
class ModelServer:
    proc: subprocess.Popen[bytes]
    base_url: str
    log: Path

    def stop(self) -> None:
        stop_process(self.proc, grace_s=5)


def start_model_server(site: Path, log: Path) -> ModelServer:
    def start(port: int) -> ModelServer:
        fh = log.open("wb")
        proc = subprocess.Popen(
            model_server_argv(port),
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=PROJECT,
            env=model_server_env(site),
        )
        fh.close()
        url = f"http://127.0.0.1:{port}"

        def probe() -> bool:
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until_ready(
            proc,
            probe,
            timeout_s=30,
            interval_s=0.05,
            log=log,
            tail_chars=2000,
            message=lambda code, tail: f"model server exited {code}: {tail}",
            stop=lambda: stop_process(proc, grace_s=5),
        )
        return ModelServer(proc, url, log)

    return start_on_free_port(start)


def quality_argv(base_url: str, out: Path) -> list[str]:
    return [
        str(BENCH_BIN / "tool-eval-bench"),
        "run",
        "--short",
        "--seed",
        str(SEED),
        "--base-url",
        base_url,
        "--model",
        MODEL,
        "--no-live",
        "--json-file",
        str(out),
    ]


def perf_argv(base_url: str, out: Path, tokenizer: Path, book_url: str) -> list[str]:
    return [
        str(BENCH_BIN / "llama-benchy"),
        "--base-url",
        f"{base_url}/v1",
        "--model",
        MODEL,
        "--tokenizer",
        str(tokenizer),
        "--book-url",
        book_url,
        "--pp",
        "64",
        "--tg",
        "8",
        "--runs",
        "1",
        "--concurrency",
        "1",
        "2",
        "--latency-mode",
        "none",
        "--skip-coherence",
        "--format",
        "json",
        "--save-result",
        str(out),
    ]


def offline(home: Path) -> tuple[Path, str]:
    """The node-home setup that makes llama-benchy run offline (sandbox/bench_offline.py)."""
    from sandbox.bench_offline import BOOK_URL

    tokenizer = home / "llama-benchy-tokenizer"
    subprocess.run(
        [
            str(BENCH_BIN / "python"),
            str(PROJECT / "sandbox" / "bench_offline.py"),
            "--home",
            str(home),
            "--tokenizer",
            str(tokenizer),
        ],
        check=True,
        capture_output=True,
    )
    return tokenizer, BOOK_URL


def run_tool(argv: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def make_corpus(dest: Path) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        home = work / "home"
        home.mkdir()
        tokenizer, book = offline(home)
        for name, broken in (("good", False), ("broken", True)):
            server = start_model_server(make_site(work / name, broken=broken), work / f"{name}.log")
            try:
                done = run_tool(
                    quality_argv(server.base_url, dest / f"teb_short_{name}.json"), work, home
                )
                assert done.returncode == 0, done.stderr[-2000:]
                if not broken:
                    done = run_tool(
                        perf_argv(
                            server.base_url, dest / "benchy_pp64_tg8_c1c2.json", tokenizer, book
                        ),
                        work,
                        home,
                    )
                    assert done.returncode == 0, done.stdout[-2000:]
            finally:
                server.stop()
        # What the tool itself calls this run's cohort (its
        # leaderboard's), for lockstep's cohort to match.
        own = subprocess.run(
            [str(BENCH_BIN / "python"), "-c", OWN_COHORT, str(dest / "teb_short_good.json")],
            capture_output=True,
            text=True,
            check=True,
        )
        (dest / "teb_short_good.cohort").write_text(own.stdout, encoding="utf-8")


OWN_COHORT = (
    "import json, sys; from tool_eval_bench.application.leaderboard import cohort_fingerprint; "
    "d = json.load(open(sys.argv[1])); print(cohort_fingerprint(d['config'], d['metadata']))"
)


if __name__ == "__main__":
    try:
        make_corpus(Path(sys.argv[1]).resolve())
    except ServerNotReady as exc:
        raise SystemExit(str(exc)) from None
