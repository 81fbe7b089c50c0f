"""The compiled GPT-2 pre-tokenizer against its slow twin, `regex` itself: the character classes on
every code point, pre-token boundaries on the fixture texts and on hypothesis strings of tricky
characters, special-token splitting, fused counts and their merging, invalid UTF-8."""

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from nbbpe.corpus import InvalidUTF8Error
from nbbpe.pretokenize import GPT2_PATTERN, special_token_regex
from nbbpe.pretokenize_kernels import (
    LETTER,
    NUMBER,
    OTHER,
    SPACE,
    PretokenCounter,
    char_classes,
    classify_utf8,
    count_gpt2,
    first_invalid_utf8,
    merge_counts,
    scan_gpt2,
    split_special_tokens,
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


def utf8_offsets(text):
    """UTF-8 byte offset of every character index of `text`, and of its end."""
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    lengths = 1 + (code_points >= 0x80) + (code_points >= 0x800) + (code_points >= 0x10000)
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def regex_spans(text):
    """(starts, ends) of `regex.finditer(GPT2_PATTERN, text)`, in UTF-8 bytes."""
    spans = np.array([m.span() for m in GPT2.finditer(text)], dtype=np.int64).reshape(-1, 2)
    offsets = utf8_offsets(text)
    return offsets[spans[:, 0]], offsets[spans[:, 1]]


def regex_counts(text, special_tokens=()):
    """Counter(findall) over the stretches between special tokens, keyed by UTF-8 bytes."""
    specials = special_token_regex(special_tokens)
    counts = Counter()
    for segment in specials.split(text) if specials else [text]:
        counts.update(word.encode("utf-8") for word in GPT2.findall(segment))
    return counts


def assert_scan_matches_regex(text):
    starts, ends = scan_gpt2(text.encode("utf-8"))
    want_starts, want_ends = regex_spans(text)
    np.testing.assert_array_equal(starts, want_starts)
    np.testing.assert_array_equal(ends, want_ends)


def assert_well_formed(table):
    word_bytes, offsets, counts = table
    assert word_bytes.dtype == np.uint8 and offsets.dtype == np.int64 and counts.dtype == np.int64
    assert offsets[0] == 0 and offsets[-1] == len(word_bytes) and len(offsets) == len(counts) + 1
    assert (np.diff(offsets) > 0).all() and (counts > 0).all()
    assert len(table.to_dict()) == len(counts)  # each word once


# --- character classes ------------------------------------------------------------------------


def test_char_classes_agree_with_regex_on_every_code_point():
    classes = char_classes()
    assert classes.shape == (0x110000,) and classes.dtype == np.uint8
    every_char = np.arange(0x110000, dtype=np.uint32)
    for code, pattern in [(LETTER, r"\p{L}"), (NUMBER, r"\p{N}"), (SPACE, r"\s"),
                          (OTHER, r"[^\s\p{L}\p{N}]")]:
        members = every_char[classes == code].tobytes().decode("utf-32-le", "surrogatepass")
        others = every_char[classes != code].tobytes().decode("utf-32-le", "surrogatepass")
        assert members and regex.fullmatch(f"{pattern}+", members) is not None, pattern
        assert regex.search(pattern, others) is None, pattern


# --- boundaries -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURE_TEXTS)
def test_scan_matches_regex_on_fixture_texts(name):
    assert_scan_matches_regex(read(name))


@pytest.mark.skipif(not SHARED_CORPUS.exists(), reason="the shared development corpora are absent")
def test_scan_and_counts_match_regex_on_the_whole_shared_multilingual_corpus():
    text = SHARED_CORPUS.read_text(encoding="utf-8")
    assert_scan_matches_regex(text)
    assert count_gpt2(text.encode("utf-8"), [EOT]).to_dict() == regex_counts(text, [EOT])


@settings(max_examples=400)
@given(any_texts)
def test_scan_matches_regex_on_generated_texts(text):
    assert_scan_matches_regex(text)


@pytest.mark.parametrize("text", [
    "", " ", "   ", "a", " a", "  a", "\n a", "\n\na", " \n", "a \t", "a  ", "don't", "DON'T",
    "x 's", "''s", "'''", "'ll've", " 'll", "a\u00a0b", "a \u00a0b", "1 2  3", "x\x1c\x1dy",
])
def test_scan_matches_regex_on_small_cases(text):
    assert_scan_matches_regex(text)


def test_scan_of_segments_scans_each_stretch_alone():
    text = read("pretok_multilingual.txt")
    buf = text.encode("utf-8")
    seg_starts, seg_ends, _ = split_special_tokens(buf, [EOT])
    starts, ends = scan_gpt2(buf, segments=(seg_starts, seg_ends))
    got = [buf[a:b].decode("utf-8") for a, b in zip(starts.tolist(), ends.tolist())]
    want = [word for segment in text.split(EOT) for word in GPT2.findall(segment)]
    assert got == want


# --- special tokens ---------------------------------------------------------------------------


@settings(max_examples=300)
@given(texts_with_specials, st.sampled_from(SPECIAL_SETS))
def test_split_special_tokens_matches_regex_split(text, special_tokens):
    buf = text.encode("utf-8")
    starts, ends, which = split_special_tokens(buf, special_tokens)
    specials = special_token_regex(special_tokens)
    assert [buf[a:b].decode("utf-8") for a, b in zip(starts, ends)] == specials.split(text)
    assert [special_tokens[t] for t in which] == specials.findall(text)


def test_split_without_special_tokens_is_the_whole_buffer():
    starts, ends, which = split_special_tokens(b"a <|endoftext|> b", [])
    assert starts.tolist() == [0] and ends.tolist() == [17] and which.tolist() == []


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
    counter = PretokenCounter([EOT])
    for start, end in zip([0] + cuts, cuts + [len(buf)]):
        counter.add(buf[start:end])
    assert counter.result().to_dict() == regex_counts(text, [EOT])
    assert len(counter) == len(regex_counts(text, [EOT]))


def test_merge_counts_sums_tables_in_any_order():
    texts = [read("corpus.en"), read("pretok_multilingual.txt"), read("german.txt"), ""]
    tables = [count_gpt2(text.encode("utf-8"), [EOT]) for text in texts]
    want = sum((regex_counts(text, [EOT]) for text in texts), Counter())
    merged = merge_counts(tables)
    assert_well_formed(merged)
    assert merged.to_dict() == want
    assert merge_counts(reversed(tables)).to_dict() == want
    assert merge_counts([merge_counts(tables[:2]), merge_counts(tables[2:])]).to_dict() == want


def test_empty_inputs():
    starts, ends = scan_gpt2(b"")
    assert starts.size == 0 and ends.size == 0
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
    assert first_invalid_utf8(buf) == python_first_invalid(buf)


@settings(max_examples=300)
@given(mixed_bytes)
def test_replace_policy_equals_regex_on_the_replaced_text(buf):
    text = buf.decode("utf-8", errors="replace")
    assert count_gpt2(buf, [EOT], errors="replace").to_dict() == regex_counts(text, [EOT])
    replaced, _ = classify_utf8(buf, "replace")
    assert replaced.tobytes() == text.encode("utf-8")
    starts, ends = scan_gpt2(replaced)
    np.testing.assert_array_equal(np.stack([starts, ends]), np.stack(regex_spans(text)))


def test_strict_policy_raises_naming_the_byte_offset():
    buf = "héllo wörld ".encode() + b"\xe2\x82 more"
    with pytest.raises(InvalidUTF8Error, match="byte offset 14"):
        scan_gpt2(buf)
    with pytest.raises(InvalidUTF8Error, match="byte offset 14"):
        count_gpt2(buf)
    with pytest.raises(InvalidUTF8Error, match=r"corpus\.txt: invalid UTF-8 at byte offset 1014"):
        PretokenCounter().add(buf, source="corpus.txt", offset=1000)


def test_strict_failure_leaves_the_counter_unchanged():
    counter = PretokenCounter()
    counter.add(b"one two")
    with pytest.raises(InvalidUTF8Error):
        counter.add(b"three \xff")
    assert counter.result().to_dict() == {b"one": 1, b" two": 1}


# --- bad arguments ----------------------------------------------------------------------------


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="uint8"):
        scan_gpt2(np.zeros(4, dtype=np.int32))
    with pytest.raises(ValueError, match="errors must be one of"):
        count_gpt2(b"a", errors="ignore")
    with pytest.raises(ValueError, match="more than once"):
        count_gpt2(b"a", [EOT, EOT])
    with pytest.raises(ValueError, match="non-empty"):
        split_special_tokens(b"a", [""])
