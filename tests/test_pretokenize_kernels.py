"""The compiled counting of pre-tokens against its slow twin, `regex` itself: counts on the fixture
texts, on the shared corpora and on hypothesis strings of tricky characters, special tokens cut
out, documents kept apart, tables merged, invalid UTF-8 under both policies."""

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from nbbpe.corpus import InvalidUTF8Error
from nbbpe.patterns import GPT2_PATTERN, special_token_regex
from nbbpe.pretokenize_kernels import PretokenCounter, count_pretokens, merge_counts
from nbbpe.scanners.classes import first_invalid_utf8
from nbbpe.scanners.gpt2 import (
    LETTER_CLASS,
    NUMBER_CLASS,
    OTHER_CLASS,
    SPACE_CLASS,
    class_table,
)

FIXTURES = Path(__file__).parent / "fixtures"
SHARED_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "multi_1M.txt"
FIXTURE_TEXTS = sorted(path.name for path in FIXTURES.glob("*.txt")) + ["corpus.en"]
EOT = "<|endoftext|>"
GPT2 = regex.compile(GPT2_PATTERN)

# Pieces that stress each rule of the pattern, weighted by how many times each is listed.
TRICKY_PIECES = {
    # contractions: lowercase only, and near misses
    "'": 8, "'s": 3, "'S": 2, "'t": 2, "'T": 1, "'d": 1, "'D": 1, "'m": 1, "'M": 1,
    "'ll": 2, "'LL": 1, "'Ll": 1, "'l": 1, "'ve": 2, "'VE": 1, "'v": 1, "'re": 2, "'RE": 1,
    "'r": 1,
    # letters (with combining marks), numbers of several kinds, other symbols
    "a": 6, "Zz": 2, "é": 2, "ß": 1, "e\u0301": 2, "\u0301": 2, "𝔘": 1, "中文": 1, "ا": 1,
    "한": 1, "7": 4, "٣": 1, "५": 1, "Ⅻ": 1, "½": 1, "²": 1, "𝟙": 1,
    "!": 3, ".": 2, "-": 1, "<": 1, "\x00": 1, "\ufffd": 1,
    "👍": 1, "👍🏽": 1, "👨\u200d👩\u200d👧": 1, "#\ufe0f\u20e3": 1,
    # whitespace, and characters some definitions count as whitespace and `regex` may not
    " ": 14, "  ": 3, "\n": 5, "\r\n": 2, "\r": 1, "\t": 2, "\x0b": 1, "\x0c": 1,
    "\x1c": 1, "\x1d": 1, "\x1e": 1, "\x1f": 1, "\x85": 1, "\u00a0": 2, "\u1680": 1,
    "\u2028": 1, "\u2029": 1, "\u3000": 1, "\u180e": 1, "\u200b": 1, "\ufeff": 1,
}
TRICKY_ALPHABET = [piece for piece, weight in TRICKY_PIECES.items() for _ in range(weight)]
tricky_texts = st.lists(st.sampled_from(TRICKY_ALPHABET), max_size=40).map("".join)
any_texts = st.one_of(tricky_texts, st.text(max_size=60))

SPECIAL_PIECES = [EOT, "<|end", "oftext|>", "<|eot|>", "<|", "é", "é!", "a"]
SPECIAL_SETS = [[EOT], [EOT, EOT + EOT], ["<|eot|>", EOT], ["é!", "é"], ["a"]]
texts_with_specials = st.lists(
    st.one_of(st.sampled_from(TRICKY_ALPHABET), st.sampled_from(SPECIAL_PIECES)), max_size=40
).map("".join)

INVALID_PIECES = [
    b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\x81", b"\xc3", b"\xe2\x82", b"\xe0\x80\xaf",
    b"\xed\xa0\x80", b"\xf0\x80\x80\x80", b"\xf4\x90\x80\x80", b"\xf5", b"\xff",
    b"\xf0\x9f\x98",
]
mixed_bytes = st.lists(
    st.one_of(st.sampled_from(TRICKY_ALPHABET).map(str.encode), st.sampled_from(INVALID_PIECES),
              st.sampled_from([EOT.encode()])),
    max_size=30,
).map(b"".join)


def read(name):
    return (FIXTURES / name).read_text(encoding="utf-8")


def regex_counts(text, special_tokens=(), documents=None):
    """Counter(findall) over the stretches between special tokens of each document, keyed by
    UTF-8 bytes."""
    specials = special_token_regex(special_tokens)
    counts = Counter()
    for document in documents if documents is not None else [text]:
        for segment in specials.split(document) if specials else [document]:
            counts.update(word.encode("utf-8") for word in GPT2.findall(segment))
    return counts


def count_gpt2(buf, special_tokens=(), errors="strict"):
    return count_pretokens(buf, "gpt2", special_tokens, errors)


def assert_well_formed(table):
    word_bytes, offsets, counts = table
    assert word_bytes.dtype == np.uint8 and offsets.dtype == np.int64 and counts.dtype == np.int64
    assert offsets[0] == 0 and offsets[-1] == len(word_bytes) and len(offsets) == len(counts) + 1
    assert (np.diff(offsets) > 0).all() and (counts > 0).all()
    assert len(table.to_dict()) == len(counts)  # each word once


# --- character classes ------------------------------------------------------------------------


def test_gpt2_classes_agree_with_regex_on_every_code_point():
    classes = class_table()
    assert classes.shape == (0x110000,) and classes.dtype == np.uint8
    every_char = np.arange(0x110000, dtype=np.uint32)
    for code, pattern in [(LETTER_CLASS, r"\p{L}"), (NUMBER_CLASS, r"\p{N}"),
                          (SPACE_CLASS, r"\s"), (OTHER_CLASS, r"[^\s\p{L}\p{N}]")]:
        members = every_char[classes == code].tobytes().decode("utf-32-le", "surrogatepass")
        others = every_char[classes != code].tobytes().decode("utf-32-le", "surrogatepass")
        assert members and regex.fullmatch(f"{pattern}+", members) is not None, pattern
        assert regex.search(pattern, others) is None, pattern


@pytest.mark.skipif(not SHARED_CORPUS.exists(), reason="the shared development corpora are absent")
def test_counts_match_regex_on_the_whole_shared_multilingual_corpus():
    text = SHARED_CORPUS.read_text(encoding="utf-8")
    assert count_gpt2(text.encode("utf-8"), [EOT]).to_dict() == regex_counts(text, [EOT])


# --- counting ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURE_TEXTS)
def test_counts_equal_counter_of_regex_findall_on_fixture_texts(name):
    text = read(name)
    table = count_gpt2(text.encode("utf-8"), [EOT])
    assert_well_formed(table)
    assert table.to_dict() == regex_counts(text, [EOT])


@settings(max_examples=300)
@given(texts_with_specials, st.sampled_from(SPECIAL_SETS + [[]]))
def test_counts_equal_counter_of_regex_findall_on_generated_texts(text, special_tokens):
    table = count_gpt2(text.encode("utf-8"), special_tokens)
    assert table.to_dict() == regex_counts(text, special_tokens)


def test_words_equal_but_for_nul_bytes_stay_apart():
    # Words of up to 8 bytes are keyed by their bytes packed little-endian, so "!" and "!\x00"
    # share a key and differ only in length. (Newlines, not spaces, between: no space prefix.)
    text = "\n".join(["!", "\x00!", "!\x00", "\x00\x00!", "!\x00\x00", "\x00"] * 3)
    assert count_gpt2(text.encode()).to_dict() == regex_counts(text)


def test_counts_grow_past_the_initial_table():
    # Many unique words, short and longer than 8 bytes, force every array to grow.
    text = "".join(f" w{i} longer_word_{i * 7919} {i}" for i in range(20_000))
    table = count_gpt2(text.encode())
    assert_well_formed(table)
    assert table.to_dict() == regex_counts(text)


def test_counter_over_chunks_equals_counting_the_whole():
    text = read("tinystories_sample.txt") + read("pretok_multilingual.txt")
    buf = text.encode("utf-8")
    cuts = [m.start() for m in regex.finditer(regex.escape(EOT.encode()), buf)]
    counter = PretokenCounter("gpt2", [EOT])
    for start, end in zip([0] + cuts, cuts + [len(buf)]):
        counter.add(buf[start:end])
    assert counter.result().to_dict() == regex_counts(text, [EOT])
    assert len(counter) == len(regex_counts(text, [EOT]))


@pytest.mark.parametrize("in_a_dict_up_to", [0, 10**9], ids=["kernel", "dict"])
def test_merge_counts_sums_tables_in_any_order(in_a_dict_up_to, monkeypatch):
    # small tables merge in a dict, large ones in the compiled counter: the same tables
    from nbbpe import pretokenize_kernels

    monkeypatch.setattr(pretokenize_kernels, "MERGE_IN_A_DICT_UP_TO", in_a_dict_up_to)
    texts = [read("corpus.en"), read("pretok_multilingual.txt"), read("german.txt"), ""]
    tables = [count_gpt2(text.encode("utf-8"), [EOT]) for text in texts]
    want = sum((regex_counts(text, [EOT]) for text in texts), Counter())
    merged = merge_counts(tables)
    assert_well_formed(merged)
    assert merged.to_dict() == want
    assert list(merged.to_dict()) == list(dict.fromkeys(  # words in order of first appearance
        word for table in tables for word in table.to_dict()))
    assert merge_counts(reversed(tables)).to_dict() == want
    assert merge_counts([merge_counts(tables[:2]), merge_counts(tables[2:])]).to_dict() == want
    # with one table holding words (e.g. one unit of work, the other threads' tables empty)
    # there is nothing to add: that table is the result, with no kernel run
    assert merge_counts([tables[3], tables[1], tables[3]]) is tables[1]
    assert merge_counts([tables[3]]).to_dict() == {}


@settings(max_examples=200)
@given(st.lists(st.one_of(tricky_texts, texts_with_specials), max_size=6))
def test_documents_are_texts_of_their_own(documents):
    data = [d.encode("utf-8") for d in documents]
    counter = PretokenCounter("gpt2", [EOT])
    counter.add(b"".join(data), np.cumsum([len(d) for d in data], dtype=np.int64))
    assert counter.result().to_dict() == regex_counts("", [EOT], documents)


def test_empty_inputs():
    for buf in [b"", EOT.encode(), (EOT * 3).encode()]:
        table = count_gpt2(buf, [EOT])
        assert table.counts.size == 0 and table.word_offsets.tolist() == [0]
    assert merge_counts([]).to_dict() == {}


# --- invalid UTF-8 ----------------------------------------------------------------------------


def python_first_invalid(buf):
    try:
        buf.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return -1


@settings(max_examples=300)
@given(st.one_of(mixed_bytes, st.binary(max_size=40)))
def test_first_invalid_utf8_agrees_with_python(buf):
    data = np.frombuffer(buf, dtype=np.uint8)
    assert first_invalid_utf8(data, 0, len(data)) == python_first_invalid(buf)


@settings(max_examples=300)
@given(mixed_bytes)
def test_replace_policy_equals_regex_on_the_replaced_text(buf):
    text = buf.decode("utf-8", errors="replace")
    assert count_gpt2(buf, [EOT], errors="replace").to_dict() == regex_counts(text, [EOT])


def test_strict_policy_raises_naming_the_place():
    buf = "héllo wörld ".encode() + b"\xe2\x82 more"
    with pytest.raises(InvalidUTF8Error, match="buffer byte 14: invalid UTF-8") as info:
        count_gpt2(buf)
    assert info.value.offset is None
    with pytest.raises(InvalidUTF8Error, match=r"corpus\.txt byte 1014: invalid UTF-8") as info:
        PretokenCounter().add(buf, place=lambda k: f"corpus.txt byte {1000 + k}", offset_base=1000)
    assert info.value.offset == 1014


def test_strict_failure_leaves_the_counter_unchanged():
    counter = PretokenCounter()
    counter.add(b"one two")
    with pytest.raises(InvalidUTF8Error):
        counter.add(b"three \xff")
    assert counter.result().to_dict() == {b"one": 1, b" two": 1}


# --- bad arguments ----------------------------------------------------------------------------


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="uint8"):
        count_gpt2(np.zeros(4, dtype=np.int32))
    with pytest.raises(ValueError, match="errors must be one of"):
        count_gpt2(b"a", errors="ignore")
    with pytest.raises(ValueError, match="more than once"):
        count_gpt2(b"a", [EOT, EOT])
    with pytest.raises(ValueError, match="non-empty"):
        count_gpt2(b"a", [""])
