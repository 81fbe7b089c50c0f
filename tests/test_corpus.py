"""Chunking: every boundary must leave the pre-tokens exactly as `regex` finds them on the whole."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbbpe.corpus import chunk_boundaries, safe_boundary_after
from nbbpe.patterns import CL100K_PATTERN, GPT2_PATTERN
from nbbpe.pretokenize import PreTokenizer

EOT = "<|endoftext|>"
ALPHABET = ["a", "Z", "9", " ", "  ", "\n", "\r\n", "\t", "'", "'s", "'ll", ".", "-", "é", "中",
            "🙂", "\u00a0", "\u3000", "\u2028", "\x85", "<|endoftext|>", "<|end", "oftext|>", "<|x|>",
            "x<|x|>"]


def pieces_of(data: bytes, bounds):
    return [data[a:b].decode("utf-8") for a, b in zip(bounds[:-1], bounds[1:])]


@settings(max_examples=200)
@given(
    parts=st.lists(st.sampled_from(ALPHABET), max_size=200),
    chunk_bytes=st.integers(1, 40),
    specials=st.sampled_from([[], [EOT], [EOT, "<|x|>", "x<|x|>"], ["a a"]]),
    pattern=st.sampled_from([GPT2_PATTERN, CL100K_PATTERN]),
)
def test_boundaries_never_change_pretokens(tmp_path_factory, parts, chunk_bytes, specials, pattern):
    text = "".join(parts) or "a"
    data = text.encode("utf-8")
    path = tmp_path_factory.mktemp("c") / "t.txt"
    path.write_bytes(data)
    bounds = chunk_boundaries(path, chunk_bytes, specials)
    assert bounds[0] == 0 and bounds[-1] == len(data)
    assert all(a < b for a, b in zip(bounds[:-1], bounds[1:]))
    pretokenizer = PreTokenizer(pattern, specials)
    whole = pretokenizer.pretokens(text)
    joined = [t for piece in pieces_of(data, bounds) for t in pretokenizer.pretokens(piece)]
    assert joined == whole


def test_boundaries_prefer_special_tokens(tmp_path):
    doc = "word " * 50
    data = (doc + EOT + "\n") * 20
    path = tmp_path / "t.txt"
    path.write_text(data)
    bounds = chunk_boundaries(path, 600, [EOT])
    assert len(bounds) > 5
    for b in bounds[1:-1]:
        assert data.encode()[b : b + len(EOT)] == EOT.encode()


def test_overlapped_special_occurrence_is_not_a_boundary():
    specials = [b"x<|x|>", b"<|x|>"]
    buf = b"aaaa x<|x|> bbbb <|x|> cccc dddd"
    # "<|x|>" at offset 6 lies inside "x<|x|>" at 5, so the first safe boundary is 5.
    assert safe_boundary_after(buf, 1, specials) == 5
    assert safe_boundary_after(buf, 6, specials) == 17


def test_many_chunks_on_a_large_file_without_specials(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("lorem ipsum dolor sit amet " * 40_000)
    bounds = chunk_boundaries(path, 10_000, [])
    sizes = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    assert len(sizes) > 100 and max(sizes) < 10_100


def test_chunk_bytes_must_be_positive(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abc")
    with pytest.raises(ValueError, match="chunk_bytes"):
        chunk_boundaries(path, 0, [])
