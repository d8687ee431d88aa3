"""A bare git repo plus a clone to make commits with, on the branch the site names."""

from __future__ import annotations

from pathlib import Path

import git

BRANCH = "penfever/working"


LOCAL = ["https", "ssh", "file"]  # the sandbox's schemes: these tests' remotes are local bare repos


class Upstream:
    """A bare repo plus a clone to make commits with."""

    def __init__(self, root: Path) -> None:
        self.bare = root / "up.git"
        git.Repo.init(self.bare, bare=True, initial_branch=BRANCH)
        self.work = git.Repo.init(root / "up-work", initial_branch=BRANCH)
        self.url = self.bare.as_uri()

    def commit(self, name: str, text: str) -> str:
        (Path(self.work.working_dir) / name).write_text(text)
        self.work.index.add([name])
        self.work.index.commit(
            f"edit {name}", author=git.Actor("u", "u@x"), committer=git.Actor("u", "u@x")
        )
        self.work.git.push(self.url, f"HEAD:refs/heads/{BRANCH}")
        return self.work.head.commit.hexsha
