"""The binary protocol between the loader and its launch module is defined once (runtime/_protocol.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tkc import pack
from tkc.native import SOURCES, protocol_header
from tkc.runtime import _protocol


def _codes() -> dict[str, int]:
    return {name: value for name, value in vars(_protocol).items() if name.isupper() and type(value) is int}


def test_the_header_defines_every_code_of_the_protocol_module() -> None:
    defined = dict(re.findall(r"^#define (\w+) (-?\d+)$", protocol_header(), re.MULTILINE))
    assert {name: int(value) for name, value in defined.items()} == _codes()


def test_the_launch_module_defines_no_code_itself_and_uses_the_header() -> None:
    header, *parts = SOURCES
    assert '#include "_protocol.h"' in header.read_text()
    assert all('#include "_launch.h"' in part.read_text() for part in parts)
    source = "\n".join(part.read_text() for part in SOURCES)
    own = set(re.findall(r"^#define (\w+)", source, re.MULTILINE))
    assert not own & set(_codes()), "a protocol code defined twice"
    unused = [name for name in _codes() if not re.search(rf"\b{name}\b", source)]
    assert unused == [], f"codes the launch module never reads: {unused}"


def test_packed_words_carry_the_protocol_versions() -> None:
    words = pack.contract((("x", "float32", ("n",), pack.ROW_MAJOR),), sizes=(("n", "x", "shape", 0, 0),))
    assert words is not None and words[:8] == _protocol.CONTRACT_VERSION.to_bytes(8, "little")
    assert pack.contract((("x", "complex64", (4,), None),)) is None  # no DLPack code: check() could never accept
    table = pack.pack_table([words, None, b""])
    assert _protocol.unpack_table(table) == [words, None, b""]


def test_a_damaged_cached_launch_module_is_rebuilt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The compiled module is cached with its sha256; a hit checks it, so a damaged module is named on stderr and
    compiled again (one cached before its hash was recorded is compiled again quietly), never packaged."""
    import hashlib

    from tkc.native import build_launch_module

    first = build_launch_module(tmp_path)
    if first.data is None:
        pytest.skip(first.reason)
    (cached,) = (tmp_path / "launch").glob("*.so")
    digest = cached.with_name(cached.name + ".sha256")
    assert digest.read_text().strip() == hashlib.sha256(first.data).hexdigest()
    assert build_launch_module(tmp_path).data == first.data  # a hit
    cached.write_bytes(b"\x7fELF" + bytes(2000))
    capsys.readouterr()
    assert build_launch_module(tmp_path).data == first.data == cached.read_bytes()
    warned = capsys.readouterr().err
    assert f"tkc: cache entry {cached}: not the launch module the build wrote" in warned and "rebuilding it" in warned
    digest.unlink()
    cached.write_bytes(b"junk")
    assert build_launch_module(tmp_path).data == first.data and capsys.readouterr().err == ""
