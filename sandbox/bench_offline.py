"""llama-benchy without the internet: a local tokenizer
and a local book, for the sandbox's lane nodes and tests.

llama-benchy 0.4.0 (llama_benchy/corpus.py) needs two things it fetches by default:
- a tokenizer: `--tokenizer` takes a local directory holding `tokenizer.json`
  (`tokenizers.Tokenizer.from_file`);
  this writes one made with the `tokenizers` library: a word-level vocabulary over the book, split
  like the sandbox's model server counts tokens (`\\w+|[^\\w\\s]`),
  so the prompt sizes it asks for are the ones served;
- a book: it downloads `--book-url` once and then reads `~/.cache/llama-benchy/<md5(book-url)>.txt`;
  writing that file under the node's HOME makes any `--book-url` (here BOOK_URL) a local read.

Run it with the bench tools' python (it imports
`tokenizers`, which lives in .tools/bench, not in lockstep):

    .tools/bench/bin/python sandbox/bench_offline.py
    --home NODE_HOME --tokenizer DIR [--book-url URL]
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

# never fetched: the cache file answers for it
BOOK_URL = "http://127.0.0.1/lockstep-sandbox-book.txt"
TOKENIZER_DIR = "llama-benchy-tokenizer"  # in the node's home
WORDS = 512


def book_text(lines: int = 4000) -> str:
    """A deterministic text, long enough for the pp sizes
    a sandbox bench asks for (~12 tokens a line)."""
    vocab = [f"w{i}" for i in range(WORDS)]
    return (
        "\n".join(
            " ".join(vocab[(i * 7 + j * 13) % WORDS] for j in range(11)) + "." for i in range(lines)
        )
        + "\n"
    )


def cache_file(home: Path, book_url: str) -> Path:
    return home / ".cache" / "llama-benchy" / f"{hashlib.md5(book_url.encode()).hexdigest()}.txt"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--home", type=Path, required=True, help="the HOME llama-benchy runs with")
    parser.add_argument(
        "--tokenizer", type=Path, required=True, help="directory to write tokenizer.json into"
    )
    parser.add_argument("--book-url", default=BOOK_URL)
    args = parser.parse_args(argv)
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    text = book_text()
    book = cache_file(args.home, args.book_url)
    book.parent.mkdir(parents=True, exist_ok=True)
    book.write_text(text, encoding="utf-8")
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([text], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    args.tokenizer.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.tokenizer / "tokenizer.json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
