"""Hostile names: what an outside party might put where lockstep expects a rev, branch, node or URL.

Every entry point's hostile-name test draws from here, so one list grows and every door sees it.
Each door must refuse with the place the value came from (file:line, the CLI argument or the site
key), never a bare message or ``file:None``.
"""

from __future__ import annotations

_SHELL = [
    "r1;touch /tmp/lockstep-pwned",
    "$(touch /tmp/lockstep-pwned)",
    "`touch /tmp/lockstep-pwned`",
    "r1\ntouch /tmp/lockstep-pwned",
    "r1|id",
    "r1&&id",
    "r1||id",
    "r1>out",
    "r1<in",
    "r1 r2",
    "r1;id",
    "r1&",
    "r1$IFS",
    "${IFS}r1",
    "r1${IFS}id",
    "r1'id'",
    'r1"id"',
    "r1\\id",
    "!r1",
    "r1#comment",
    "(r1)",
    "{r1,r2}",
    "r1=x",
]
_PATHS = [
    "../../../../tmp/lockstep-escape",
    "..",
    ".",
    "../r1",
    "r1/../..",
    "r1/..",
    "/tmp/lockstep-abs",
    "//tmp",
    "r1/",
    "r1/r2",
    "~",
    "~root",
    "%2e%2e",  # percent-encoded `..`
    "%2E%2E%2Ftmp",
    "..%2f..%2ftmp",
    "%252e%252e",  # encoded twice
    "r1%00",
    ".hidden",
    ".git",
]
_OPTIONS = [
    "-rf",
    "-",
    "--",
    "-c",
    "-o",
    "-oProxyCommand=touch /tmp/lockstep-pwned",
    "-c core.sshCommand=touch /tmp/lockstep-pwned",
    "--upload-pack=touch /tmp/lockstep-pwned",
    "--output=/tmp/lockstep-pwned",
    "-e",
    "ext::sh -c touch% /tmp/lockstep-pwned",
    "fd::17",
]
_CONTROL = [
    "",
    " ",
    "r1 ",
    " r1",
    "r1\r",
    "r1\rtouch /tmp/lockstep-pwned",
    "r1\r\n",
    "r1\n",  # a `$` that matches before a final newline would take this one
    "r1\t",
    "r1\tr2",
    "\tr1",
    "r1\x00",
    "r1\x1b[31m",
    "r1\x7f",
    "r1\x0b",
    "r1\x0c",
    "r1\u0085",  # NEL
    "r1\u2028",  # line separator
    "r1\u200b",  # zero-width space
    "r1\ufeff",  # byte-order mark
    "r1\u202e1r",  # right-to-left override
    "r1\u00a0",  # no-break space
    "r1\u3000r2",  # ideographic space
    "r1%0a",
    "r1%0d%0atouch",
    "r1%20r2",
]
_GLOBS_AND_REFS = [
    "r*",
    "r?",
    "r[1]",
    "r[",
    "*",
    "?",
    "[a-z]",
    "r1@{0}",
    "@{-1}",
    "@",
    "HEAD@{1}",
    "r1^",
    "r1^{}",
    "r1~1",
    "r1:r2",
    "refs/heads/main",
    "*?[",
    "r1,r2",
    "r1+r2",
]
_LOOKALIKES = [
    "r1\uff0ftmp",  # fullwidth solidus
    "\uff0e\uff0e",  # fullwidth full stops: a `..`
    "\uff0e\uff0e\uff0f\uff0e\uff0e",
    "r1\u2215tmp",  # division slash
    "r1\u2044tmp",  # fraction slash
    "\u2024\u2024",  # one dot leaders
    "r1\u3002",  # ideographic full stop
    "\uff0dr1",  # fullwidth hyphen-minus
    "\u2010r1",  # hyphen
    "\u2212rf",  # minus sign
    "\uff52\uff11",  # fullwidth r1
    "\u0433lm53",  # Cyrillic г
    "r\u0131",  # dotless i
    "r1\uff1btouch",  # fullwidth semicolon
    "r1\uff04(id)",  # fullwidth dollar
    "r\u00e9v",  # é: a letter, but not the ASCII a name is
    "r1\u0301",  # combining acute
    "\U0001f600",
]
_LONG = [
    "r" * 65,
    "r" * 129,
    "r" * 256,
    "a" * 4097,
    "r1/" * 100,
    "-" * 70,
    "." * 70,
]

HOSTILE_NAMES = [*_SHELL, *_PATHS, *_OPTIONS, *_CONTROL, *_GLOBS_AND_REFS, *_LOOKALIKES, *_LONG]

_PWN = "touch%20/tmp/lockstep-pwned"
HOSTILE_URLS = [
    "--upload-pack=touch /tmp/lockstep-pwned",
    "-oProxyCommand=touch /tmp/lockstep-pwned",
    "-c",
    "-o",
    "ext::sh -c touch% /tmp/lockstep-pwned",
    "fd::17",
    "file:///tmp/repo.git;touch /tmp/lockstep-pwned",
    "https://example.com/repo.git\n--upload-pack=x",
    "https://example.com/repo.git\r--upload-pack=x",
    "https://example.com/repo.git\t-c",
    "$(touch /tmp/lockstep-pwned)",
    # `-o` / `-c` smuggled as the host or user, in every URL form git takes for ssh:
    f"ssh://-oProxyCommand={_PWN}/repo.git",
    "ssh://-oProxyCommand=x@example.com/repo.git",
    f"ssh://[-oProxyCommand={_PWN}]/x.git",
    "ssh://[-oProxyCommand=x]/x.git",
    "ssh://[-oProxyCommand=x]:22/x.git",
    "ssh://git@-oProxyCommand=x/repo.git",
    "ssh://git@[-oProxyCommand=x]/repo.git",
    "ssh://-cx@example.com/repo.git",
    "ssh://git@-c/repo.git",
    "ssh://example.com:-oProxyCommand=x/repo.git",
    "ssh://%2doProxyCommand=x/repo.git",  # percent-encoded '-'
    "ssh://%2DoProxyCommand=x/repo.git",
    "ssh://git@%2doProxyCommand=x/repo.git",
    "ssh://%252doProxyCommand=x/repo.git",  # encoded twice
    "ssh://git@example.com%0a-oProxyCommand=x/repo.git",
    "ssh://git@example.com%20-oProxyCommand=x/repo.git",
    "git+ssh://-oProxyCommand=x/repo.git",
    "git+ssh://git@-oProxyCommand=x/repo.git",
    "ssh+git://-oProxyCommand=x/repo.git",
    "git@-oProxyCommand=x:org/repo.git",  # scp-like
    "-oProxyCommand=x@example.com:org/repo.git",
    "[-oProxyCommand=x]:org/repo.git",
    "git@[-oProxyCommand=x]:org/repo.git",
    "[git@-oProxyCommand=x:22]:org/repo.git",
    "%2doProxyCommand=x:org/repo.git",
    "https://-oProxyCommand=x/repo.git",
    "https://user@-c/repo.git",
    "http://%2dc/repo.git",
    "git://-oProxyCommand=x/repo.git",
    "ssh://-/repo.git",
    # neither a URL nor a scheme this site allows:
    "/tmp/plain-path.git",
    "../relative.git",
    "repo.git",
    "ftp://example.com/repo.git",
    "ext::ssh -oProxyCommand=x host",
    "transport::https://example.com/repo.git",
    "",
]
