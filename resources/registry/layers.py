"""Reading files out of image layers: tar streams, whiteouts, opaque dirs, symlinks, hardlinks.

Pure: no I/O beyond the layer streams it is handed (by base.py: the registry or the blob cache).
One scan answers many queries in ONE walk from the top layer down, each layer opened once:

- a path: read_file semantics. The first layer (from the top) that holds it, whites it out
  (``.wh.NAME``), hides its directory (``.wh..wh..opq``) or replaces a parent decides it. Symlinks
  (the path or a parent) are followed within the image, at most MAX_SYMLINK_HOPS times; a tar
  hardlink reads the member it names; a directory, device or fifo is not a file.
- a glob (``*`` does not cross ``/``): the matches in the TOP-most layer holding any, upper
  whiteouts honoured; optionally their contents and siblings' (METADATA and direct_url.json).

Every layer the walk reads to its end is checked against its descriptor: the byte count equals the
size and the sha256 of the compressed bytes equals the digest. So a short blob is an error naming
the layer, never a silent fall-through to a stale copy below. A scan may stop inside a layer once
every query is decided (that is the point of reading files out of layers); a layer it passes
through is always drained and checked.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import io
import posixpath
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

from resources.registry.refs import CHUNK, Descriptor, RegistryError

if TYPE_CHECKING:
    import tarfile

MAX_SYMLINK_HOPS = 8
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# tarfile's stream mode refills in bufsize reads: small enough that a file near the start of a big
# layer costs little, big enough that a GiB layer is not a million Python calls.
_TAR_BUFSIZE = 64 * 1024


def _decode_errors() -> tuple[type[BaseException], ...]:
    """What a broken layer stream raises. tarfile and
    zstandard load with the first scan, not with a location."""
    import tarfile

    import zstandard

    return (tarfile.TarError, EOFError, OSError, zlib.error, zstandard.ZstdError)


# -- what the scan is asked, and what it answers ---------------------------------------------------


@dataclass(frozen=True)
class GlobQuery:
    """Image paths matching `pattern`; `read`: also their contents (read_file semantics), and the
    contents of each `siblings` name in a match's
    directory (e.g. direct_url.json beside METADATA)."""

    pattern: str
    read: bool = False
    siblings: tuple[str, ...] = ()


@dataclass
class LayerSource:
    """One opened layer blob, as base.py hands it to the scan."""

    stream: BinaryIO
    remote: bool  # pulled from the registry (counted in bytes_read), not read from the local cache
    on_verified: Callable[[], None] | None = None  # read to its end and it matched its descriptor
    # it did not read or match (e.g. drop a bad cached copy)
    on_corrupt: Callable[[], None] | None = None
    note: str = ""  # added to the blob's name in errors, e.g. that it was read from the cache


@dataclass(frozen=True)
class Hit:
    data: bytes
    layer_index: int  # 0 is the bottom (base) layer


@dataclass
class ScanResult:
    # every path asked and every glob match read (or sibling), by image path
    files: dict[str, Hit | None]
    matches: dict[str, list[str]]  # glob pattern (an image path) -> the matches
    bytes_read: int = 0  # compressed bytes pulled from remote sources
    opened: dict[int, int] = field(default_factory=dict)  # layer index -> times opened in this scan
    remote_opens: dict[int, int] = field(default_factory=dict)  # ... of which from the registry


# -- names ---------------------------------------------------------------------------------------


def image_path(path: str) -> str:
    """'/etc/x', 'etc/x' and './etc/x' all name 'etc/x'; '..' cannot climb out of the root."""
    norm = posixpath.normpath("/" + path.strip()).lstrip("/")
    if norm in ("", "."):
        raise RegistryError(f"read_file path {path!r} names the image root, not a file")
    return norm


def member_path(name: str) -> str:
    """Tar members may be './x', '/x' or 'x'; directories may end in '/'."""
    norm = posixpath.normpath("/" + name).lstrip("/")
    return "" if norm == "." else norm


def _link_target(link_dir: str, linkname: str) -> str:
    """Where a symlink in `link_dir` points, as an image
    path (absolute links start at the image root)."""
    joined = linkname if linkname.startswith("/") else f"{link_dir}/{linkname}"
    return posixpath.normpath("/" + joined).lstrip("/")


def _is_under(path: str, parent: str) -> bool:
    return parent == "" or path.startswith(parent + "/")


def _is_whiteout(name: str) -> bool:
    return posixpath.basename(name).startswith(".wh.")


def _whiteout_hides(name: str, target: str) -> bool:
    parent, _, base = name.rpartition("/")
    if not base.startswith(".wh."):
        return False
    if base == ".wh..wh..opq":
        return _is_under(target, parent)
    hidden = f"{parent}/{base[4:]}" if parent else base[4:]
    return target == hidden or _is_under(target, hidden)


class _Pattern:
    """A glob over image paths where ``*`` does not cross ``/``."""

    def __init__(self, pattern: str) -> None:
        self.slashes = pattern.count("/")
        self.regex = re.compile(fnmatch.translate(pattern))

    def match(self, path: str) -> bool:
        return path.count("/") == self.slashes and self.regex.match(path) is not None


# -- one layer member, and one path being resolved through the layers -----------------------------


@dataclass(frozen=True)
class Member:
    name: str  # an image path ('' for the root)
    kind: str  # file | dir | symlink | hardlink | other
    link: str = ""  # a symlink's target as written, or the member path a hardlink names

    @classmethod
    def of(cls, info: tarfile.TarInfo) -> Member:
        if info.isreg():
            return cls(member_path(info.name), "file")
        if info.isdir():
            return cls(member_path(info.name), "dir")
        if info.issym():
            return cls(member_path(info.name), "symlink", info.linkname)
        if info.islnk():
            return cls(member_path(info.name), "hardlink", member_path(info.linkname))
        return cls(member_path(info.name), "other")


@dataclass
class _Here:
    """The layer holds the target as a regular file: this member."""


@dataclass
class _Absent:
    """The layer hides or replaces the path (whiteout, opaque dir, a file where a dir should be)."""


@dataclass
class _Redirect:
    path: str  # the path a symlink leads to, relative to the image root


@dataclass
class _HardLink:
    member: str  # the member of the same layer that holds the data


_Verdict = _Here | _Absent | _Redirect | _HardLink


@dataclass
class _Lookup:
    """One asked path on its way down the layers."""

    key: str  # the image path that was asked (where the answer is filed)
    target: str  # the path looked for now (differs from key after a symlink)
    hops: int = 0
    # Parents of the target that an upper layer holds as directories: a symlink or file at that
    # name in a lower layer is replaced by the directory, so it cannot redirect the path.
    dirs_above: set[str] = field(default_factory=set)
    dirs_here: set[str] = field(default_factory=set)
    hidden: bool = False  # a whiteout in this layer hides the path in the layers below

    def feed(self, m: Member) -> _Verdict | None:
        target = self.target
        if m.name == target:
            if m.kind == "file":
                return _Here()
            if m.kind == "symlink":
                return _Redirect(_link_target(posixpath.dirname(target), m.link))
            if m.kind == "hardlink":
                return _HardLink(m.link)
            return _Absent()  # a directory, device or fifo is not a file to read
        if m.name and _is_under(target, m.name):  # a parent directory of the target
            if m.kind == "dir":
                self.dirs_here.add(m.name)
            elif m.kind == "symlink" and m.name not in self.dirs_above:
                through = _link_target(posixpath.dirname(m.name), m.link)
                return _Redirect(member_path(f"{through}/{target[len(m.name) + 1 :]}"))
            else:
                return _Absent()
        elif _whiteout_hides(m.name, target):
            # A whiteout hides lower layers only; this layer may still hold the path itself.
            self.hidden = True
        return None

    def end_layer(self) -> _Verdict | None:
        hidden = self.hidden
        self.dirs_above |= self.dirs_here
        self.dirs_here, self.hidden = set(), False
        return _Absent() if hidden else None

    def restart(self, target: str) -> None:
        self.target, self.dirs_above, self.dirs_here, self.hidden = target, set(), set(), False


@dataclass
class _GlobState:
    query: GlobQuery
    pattern: _Pattern
    captures: list[_Pattern]  # the match pattern and its siblings': regular files read as streamed
    hides: list[str] = field(default_factory=list)  # whiteout names from the layers above
    found: list[str] = field(default_factory=list)
    whiteouts: list[str] = field(default_factory=list)

    def feed(self, m: Member) -> None:
        if _is_whiteout(m.name):
            self.whiteouts.append(m.name)
        elif (
            m.kind in ("file", "symlink", "hardlink")
            and self.pattern.match(m.name)
            and not self._hidden(m.name)
        ):
            self.found.append(m.name)

    def wants_data(self, m: Member) -> bool:
        return (
            self.query.read
            and m.kind == "file"
            and not _is_whiteout(m.name)
            and any(p.match(m.name) for p in self.captures)
            and not self._hidden(m.name)
        )

    def _hidden(self, name: str) -> bool:
        return any(_whiteout_hides(h, name) for h in self.hides)


# -- the scan --------------------------------------------------------------------------------------


def scan_layers(
    layers: list[Descriptor],
    open_layer: Callable[[int], LayerSource],
    *,
    paths: Iterable[str] = (),
    globs: Iterable[GlobQuery] = (),
    where_image: str,
    where_blob: Callable[[str], str],
    read_whole_layers: bool = False,
) -> ScanResult:
    """Answer every path (image paths, see image_path) and glob in one walk from the top layer down.

    `read_whole_layers`: read every opened layer to its end (checked, and so cacheable), even the
    one in which the last query was decided.
    """
    scan = _Scan(layers, open_layer, where_image, where_blob, read_whole_layers)
    return scan.run(list(paths), list(globs))


class _Scan:
    def __init__(
        self,
        layers: list[Descriptor],
        open_layer: Callable[[int], LayerSource],
        where_image: str,
        where_blob: Callable[[str], str],
        read_whole_layers: bool,
    ) -> None:
        self.layers = layers
        self.open_layer = open_layer
        self.where_image = where_image
        self.where_blob = where_blob
        self.read_whole = read_whole_layers
        self.result = ScanResult(files={}, matches={})
        self.listings: dict[int, list[Member]] = {}  # complete listings of the layers passed
        self.current: int | None = None  # the layer being streamed
        self.partial: list[Member] = []  # its members so far
        self.lookups: list[_Lookup] = []
        self.globs: list[_GlobState] = []
        self.asked: set[str] = set()
        self.captured: dict[tuple[int, str], bytes] = {}
        # (layer, member) -> [(key, how)]
        self.wanted: dict[tuple[int, str], list[tuple[str, str]]] = {}

    def run(self, paths: list[str], globs: list[GlobQuery]) -> ScanResult:
        for query in globs:
            if query.pattern not in self.result.matches and all(
                g.query.pattern != query.pattern for g in self.globs
            ):
                captures = [query.pattern] + [
                    f"{posixpath.dirname(query.pattern)}/{s}" for s in query.siblings
                ]
                self.globs.append(
                    _GlobState(query, _Pattern(query.pattern), [_Pattern(c) for c in captures])
                )
        for path in paths:
            self._ask(path)
        for index in range(len(self.layers) - 1, -1, -1):
            if not self._undecided():
                break
            self._stream(index)
        for lookup in self.lookups:  # through every layer and never decided: not in the image
            self.result.files[lookup.key] = None
        for g in self.globs:
            self.result.matches[g.query.pattern] = []
        self.lookups, self.globs = [], []
        self._read_wanted()
        return self.result

    def _undecided(self) -> bool:
        return bool(self.lookups or self.globs)

    # -- resolving one path ---------------------------------------------------------------------

    def _ask(self, key: str) -> None:
        if key in self.asked:
            return
        self.asked.add(key)
        self._resolve(_Lookup(key=key, target=key))

    def _resolve(self, lookup: _Lookup) -> None:
        """From the top: the passed layers' listings, the streamed layer's members so far, then it
        stays active for the rest of the walk."""
        for index in sorted(self.listings, reverse=True):
            for m in self.listings[index]:
                if (verdict := lookup.feed(m)) is not None:
                    return self._settle(lookup, verdict, index, m, None)
            if (verdict := lookup.end_layer()) is not None:
                return self._settle(lookup, verdict, index, None, None)
        if self.current is not None:
            for m in self.partial:
                if (verdict := lookup.feed(m)) is not None:
                    return self._settle(lookup, verdict, self.current, m, None)
        self.lookups.append(lookup)

    def _settle(
        self,
        lookup: _Lookup,
        verdict: _Verdict,
        index: int,
        m: Member | None,
        read: Callable[[], bytes] | None,
    ) -> None:
        if isinstance(verdict, _Redirect):
            lookup.hops += 1
            if lookup.hops > MAX_SYMLINK_HOPS:
                raise RegistryError(
                    f"{self.where_image}: /{lookup.key} goes through more than "
                    f"{MAX_SYMLINK_HOPS} symlinks "
                    "(a loop?); read the path the link finally names instead"
                )
            lookup.restart(verdict.path)
            return self._resolve(lookup)
        if isinstance(verdict, _Absent):
            self.result.files[lookup.key] = None
            return None
        assert m is not None
        member, how = (
            (m.name, "file") if isinstance(verdict, _Here) else (verdict.member, "hardlink")
        )
        if (index, member) not in self.captured and read is not None and how == "file":
            self.captured[(index, member)] = read()
        if (index, member) in self.captured:
            self.result.files[lookup.key] = Hit(self.captured[(index, member)], index)
        # a member already streamed past: read it again after the walk (from the cache, mostly)
        else:
            self.wanted.setdefault((index, member), []).append((lookup.key, how))
        return None

    # -- streaming one layer ----------------------------------------------------------------------

    def _stream(self, index: int) -> None:
        self.current, self.partial = index, []
        with self._opened(index) as (checked, source, where):
            with decoded_tar(checked, where) as tar:
                complete = True
                for info in tar or ():
                    m = Member.of(info)
                    self.partial.append(m)
                    self._feed(index, m, tar, info)  # type: ignore[arg-type]
                    if not self._undecided() and not self.read_whole:
                        # every query is decided: the rest of the layer is not needed
                        complete = False
                        break
            if complete:
                checked.finish(source)
                self._end_layer(index)
        self.current, self.partial = None, []

    def _feed(self, index: int, m: Member, tar: tarfile.TarFile, info: tarfile.TarInfo) -> None:
        def read() -> bytes:
            extracted = tar.extractfile(info)
            assert extracted is not None
            return extracted.read()

        for lookup in list(self.lookups):
            if (verdict := lookup.feed(m)) is not None:
                self.lookups.remove(lookup)
                self._settle(lookup, verdict, index, m, read)
        for g in self.globs:
            g.feed(m)
            if g.wants_data(m) and (index, m.name) not in self.captured:
                self.captured[(index, m.name)] = read()

    def _end_layer(self, index: int) -> None:
        self.listings[index] = self.partial
        self.current, self.partial = None, []
        for lookup in list(self.lookups):
            if (verdict := lookup.end_layer()) is not None:
                self.lookups.remove(lookup)
                self._settle(lookup, verdict, index, None, None)
        for g in list(self.globs):
            if not g.found:
                g.hides += g.whiteouts
                g.whiteouts = []
                continue
            self.globs.remove(g)
            matches = sorted(set(g.found))
            self.result.matches[g.query.pattern] = matches
            if g.query.read:
                for match in matches:
                    self._ask(match)
                    for sibling in g.query.siblings:
                        self._ask(f"{posixpath.dirname(match)}/{sibling}")

    @contextlib.contextmanager
    def _opened(self, index: int) -> Iterator[tuple[_Checked, LayerSource, str]]:
        source = self.open_layer(index)
        self.result.opened[index] = self.result.opened.get(index, 0) + 1
        if source.remote:
            self.result.remote_opens[index] = self.result.remote_opens.get(index, 0) + 1
        where = self.where_blob(self.layers[index].digest) + source.note
        checked = _Checked(source.stream, self.layers[index], where)
        try:
            yield checked, source, where
        except RegistryError:
            if source.on_corrupt is not None:
                # e.g. a bad cached copy: dropped, so the next read fetches it again
                source.on_corrupt()
            raise
        finally:
            if source.remote:
                self.result.bytes_read += checked.count
            with contextlib.suppress(Exception):
                source.stream.close()

    def _read_wanted(self) -> None:
        """Members the walk had streamed past when a
        symlink or hardlink named them: one more read of
        each such layer, stopping once they are all in hand."""
        by_layer: dict[int, set[str]] = {}
        for index, member in self.wanted:
            by_layer.setdefault(index, set()).add(member)
        for index, members in sorted(by_layer.items(), reverse=True):
            self._read_members(index, members)
        for (index, member), waiting in self.wanted.items():
            data = self.captured.get((index, member))
            for key, how in waiting:
                if data is None:
                    if how == "hardlink":
                        raise RegistryError(
                            f"{self.where_blob(self.layers[index].digest)}: /{key} is a hardlink "
                            f"to {member}, which "
                            "the layer does not hold as a regular file: the layer tar is malformed"
                        )
                    raise RegistryError(
                        f"{self.where_blob(self.layers[index].digest)}: {member} was listed but "
                        "could not be read again: the layer changed between two reads"
                    )
                self.result.files[key] = Hit(data, index)

    def _read_members(self, index: int, members: set[str]) -> None:
        left = {m for m in members if (index, m) not in self.captured}
        if not left:
            return
        with self._opened(index) as (checked, source, where):
            with decoded_tar(checked, where) as tar:
                complete = True
                for info in tar or ():
                    name = member_path(info.name)
                    if name in left and info.isreg():
                        extracted = tar.extractfile(info)
                        assert extracted is not None
                        self.captured[(index, name)] = extracted.read()
                        left.discard(name)
                        if not left:
                            complete = False
                            break
            if complete:
                checked.finish(source)


# -- the bytes of one layer ------------------------------------------------------------------------


class _Checked(io.RawIOBase):
    """Counts and hashes the compressed bytes pulled out of a layer blob, under every buffer."""

    def __init__(self, inner: BinaryIO, layer: Descriptor, where: str) -> None:
        self._inner = inner
        self._layer = layer
        self._where = where
        algorithm = layer.digest.partition(":")[0]
        self._hash = hashlib.new(algorithm if algorithm in ("sha256", "sha512") else "sha256")
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._inner.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self._hash.update(data)
        self.count += n
        return n

    def finish(self, source: LayerSource) -> None:
        """Read what the tar reader left (end-of-archive
        padding, trailing bytes) and check the whole blob."""
        buffer = bytearray(CHUNK)
        try:
            while self.readinto(buffer):
                pass
        except _decode_errors() as exc:
            raise RegistryError(
                f"{self._where}: layer blob broke off after {self.count} bytes ({exc})"
            ) from None
        size, digest = self._layer.size, self._layer.digest
        got = f"{digest.partition(':')[0]}:{self._hash.hexdigest()}"
        if self.count != size or got != digest:
            what = (
                f"is {self.count} bytes, but its descriptor says {size}"
                if self.count != size
                else f"hashes to {got}"
            )
            raise RegistryError(
                f"{self._where}: layer blob {what}: it is truncated or corrupt (in the registry "
                "or on the way), "
                "so nothing below it can be trusted either; push the image again, or check what "
                "sits between "
                "lockstep and the registry"
            )
        if source.on_verified is not None:
            source.on_verified()


@contextlib.contextmanager
def decoded_tar(raw: io.RawIOBase, where: str) -> Iterator[tarfile.TarFile | None]:
    """A streaming tar reader over a layer blob (None for an empty blob). gzip (one member or many,
    as eStargz writes), zstd or plain is told by the first bytes, not by the media type, which
    builders get wrong."""
    import gzip
    import tarfile

    import zstandard

    buffered = io.BufferedReader(raw, buffer_size=64 * 1024)
    magic = buffered.peek(4)[:4]
    if not magic:
        yield None
        return
    decoded: BinaryIO
    if magic.startswith(GZIP_MAGIC):
        # tarfile's own "r|gz" stops after the first gzip member; GzipFile reads every member.
        decoded = gzip.GzipFile(fileobj=buffered, mode="rb")  # type: ignore[assignment]
    elif magic.startswith(ZSTD_MAGIC):
        decoded = zstandard.ZstdDecompressor().stream_reader(
            buffered, read_across_frames=True, closefd=False
        )
    else:
        decoded = buffered  # type: ignore[assignment]
    try:
        # the caller streams it
        tar = tarfile.open(fileobj=decoded, mode="r|", bufsize=_TAR_BUFSIZE)  # noqa: SIM115
    except _decode_errors() as exc:
        raise RegistryError(
            f"{where}: layer is neither a gzip, zstd nor plain tar stream ({exc})"
        ) from None
    try:
        yield tar
    except _decode_errors() as exc:
        raise RegistryError(f"{where}: layer tar is truncated or corrupt ({exc})") from None
    finally:
        tar.close()
        # Leave the raw stream open: the caller drains and checks it after the tar reader is done.
        with contextlib.suppress(ValueError):
            buffered.detach()
