"""The site cache: an unchanged site file is parsed once; any edit of it, or of a key file it names,
is read on the next load, and a broken edit raises its error on every load until it is fixed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from resources.errors import FileFormatError
from resources.site.cache import SiteCache
from resources.site.load import load_site
from tests.support.site_text import GOOD  # the minimal valid site every site test starts from


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The files here are written moments before they are read, which the cache never keeps (file
    times tick in steps): let it keep them, so what these
    tests see is the cache's, not a re-read's. Every
    edit below changes the size or the inode, which no time step can hide."""
    monkeypatch.setattr(SiteCache, "SETTLED_NS", 0)


def site(tmp_path: Path, text: str = GOOD) -> Path:
    path = tmp_path / "site.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.usefixtures("settled")
def test_an_unchanged_site_file_is_parsed_once(tmp_path: Path) -> None:
    path = site(tmp_path)
    first = load_site(path)
    assert load_site(path) is first and load_site(str(path)) is first


@pytest.mark.usefixtures("settled")
def test_an_edit_in_place_is_read_on_the_next_load(tmp_path: Path) -> None:
    path = site(tmp_path)
    assert load_site(path).tpu.harbor_branch == "penfever/working"
    inode = path.stat().st_ino
    path.write_text(GOOD.replace("penfever/working", "penfever/next", 1), encoding="utf-8")
    assert path.stat().st_ino == inode  # the same file, rewritten
    assert load_site(path).tpu.harbor_branch == "penfever/next"


@pytest.mark.usefixtures("settled")
def test_a_same_size_file_moved_over_it_is_read_on_the_next_load(tmp_path: Path) -> None:
    path = site(tmp_path)
    assert load_site(path).tpu.harbor_branch == "penfever/working"
    new = tmp_path / "site.toml.new"
    new.write_text(GOOD.replace("penfever/working", "penfever/wurking", 1), encoding="utf-8")
    os.replace(new, path)  # how editors and config managers save: same size, another inode
    assert load_site(path).tpu.harbor_branch == "penfever/wurking"


@pytest.mark.usefixtures("settled")
def test_a_broken_edit_raises_on_every_load_not_the_stale_config(tmp_path: Path) -> None:
    path = site(tmp_path)
    load_site(path)
    path.write_text(
        GOOD.replace('harbor_branch = "penfever/working"', 'harbor_branch = "-rf"'),
        encoding="utf-8",
    )
    for _ in range(2):
        with pytest.raises(FileFormatError, match=rf"{path}:6: \[tpu\] harbor_branch"):
            load_site(path)
    path.write_text(GOOD, encoding="utf-8")
    assert load_site(path).tpu.harbor_branch == "penfever/working"


@pytest.mark.usefixtures("settled")
def test_an_edited_trusted_key_file_is_read_on_the_next_load(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    pub = tmp_path / "trusted.pub"
    pub.write_bytes(
        key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    path = site(
        tmp_path, GOOD + '\n[attest]\nkey_env = "ATTEST_KEY"\ntrusted_keys = ["trusted.pub"]\n'
    )
    first = load_site(path)
    assert load_site(path) is first
    pub.write_text("not a key\n", encoding="utf-8")
    with pytest.raises(FileFormatError, match=r"\[attest\] trusted_keys #1"):
        load_site(path)


def test_a_file_written_within_the_time_step_is_read_again(tmp_path: Path) -> None:
    # A second write inside the file system's time step of the first could leave every stamp as it
    # was: a file that changed moments before the read is not kept. (Its time is set ahead here, so
    # the test does not depend on how fast it runs.)
    path = site(tmp_path)
    ahead = time.time_ns() + 3600 * 10**9
    os.utime(path, ns=(ahead, ahead))
    assert load_site(path) is not load_site(path)
