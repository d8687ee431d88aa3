"""Hostile names: what an outside party might put where lockstep expects a rev, branch, node or URL.

Every entry point's hostile-name test draws from here, so one list grows and every door sees it.
"""

from __future__ import annotations

HOSTILE_NAMES = [
    "r1;touch /tmp/lockstep-pwned",
    "$(touch /tmp/lockstep-pwned)",
    "`touch /tmp/lockstep-pwned`",
    "r1\ntouch /tmp/lockstep-pwned",
    "../../../../tmp/lockstep-escape",
    "..",
    "/tmp/lockstep-abs",
    "-rf",
    "--upload-pack=touch /tmp/lockstep-pwned",
    "ext::sh -c touch% /tmp/lockstep-pwned",
    "r1 r2",
    "r1|id",
    "r1&&id",
    "r1>out",
    "",
    ".hidden",
    "r" * 65,
]

HOSTILE_URLS = [
    "--upload-pack=touch /tmp/lockstep-pwned",
    "-oProxyCommand=touch /tmp/lockstep-pwned",
    "ext::sh -c touch% /tmp/lockstep-pwned",
    "fd::17",
    "file:///tmp/repo.git;touch /tmp/lockstep-pwned",
    "https://example.com/repo.git\n--upload-pack=x",
    "$(touch /tmp/lockstep-pwned)",
    "ssh://-oProxyCommand=touch%20/tmp/lockstep-pwned/repo.git",
    "ssh://-oProxyCommand=x@example.com/repo.git",
    "/tmp/plain-path.git",
    "../relative.git",
    "",
]
