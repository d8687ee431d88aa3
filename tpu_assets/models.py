"""What the TPU assets record, as pydantic models (pickled by the IO manager, shown as metadata)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Finding(BaseModel):
    """The outcome of one verification, ready to become an asset check result."""

    passed: bool
    description: str
    facts: dict[str, str] = Field(default_factory=dict)


class HarborPin(BaseModel):
    commit: str
    version: str | None


class HarborLock(BaseModel):
    """The consumer repo's lock state after a re-lock (or the state found, when already current)."""

    consumer_repo: str
    consumer_branch: str
    consumer_base: str
    consumer_commit: str
    pushed: bool
    harbor_repo: str
    harbor_branch: str
    harbor_tip: str
    before: HarborPin
    after: HarborPin
    dockerfile: str
    dockerfile_line: int
    lock_diff: str = ""

    @property
    def commit_moved(self) -> bool:
        return self.before.commit != self.after.commit
