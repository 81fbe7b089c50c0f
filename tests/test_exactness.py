"""Exact or refused, for any pattern: the adversarial cases of the exactness review.

1. Patterns with capturing groups are refused by every entry point, before any work.
2. Cut rules: the whitespace cuts are proven here for the built-in patterns (hypothesis checks
   every place each rule allows against `regex` on the joined text); a custom pattern is cut
   only at special tokens and document boundaries, and its training, encoding, `encode_iterable`
   and `encode_file` equal the slow references for any chunk size, block size and worker count.
3. Special tokens holding U+FFFD are matched after replacement: in files (invalid bytes, under
   errors="replace") and in str (lone surrogates), at every chunk and block edge.
"""

import gzip
import itertools
from pathlib import Path

import numpy as np
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from nbbpe import (
    CL100K_PATTERN,
    GPT2_PATTERN,
    O200K_PATTERN,
    Tokenizer,
    encode_file,
    open_token_file,
    train_bpe,
    train_bpe_from_iterator,
)
from nbbpe import corpus
from nbbpe.corpus import WHITESPACE_CUT_PATTERNS, chunk_boundaries
from nbbpe.patterns import TIKTOKEN_GPT2_PATTERN
from reference_bpe import reference_pretoken_counts, reference_train_bpe
from reference_encode import ReferenceEncoder

BUILT_IN = [GPT2_PATTERN, TIKTOKEN_GPT2_PATTERN, CL100K_PATTERN, O200K_PATTERN]
# (chunk_bytes, num_workers): every place a cut may fall, small and large chunks, 1 and 2 workers.
RUNS = [(1, 2), (7, 1), (7, 2), (64, 2), (1 << 20, 1)]

# Custom patterns whose pre-tokens run across "letter, space" and "letter, newline", or whose
# matches depend on text far away (unbounded lookahead to the end, anchors, lookbehind, \b, \G).
CUSTOM = [
    r"[^\n]+|\n",
    r"\w+(?: \w+)*|\s+|[^\w\s]+",
    r"\w+(?=[^!]*\Z)|(?s:.)",  # a word is one pre-token only if no "!" follows in its stretch
    r"^\S+|\S+$|(?s:.)",
    r"(?<=\s)\w+|\b\w|(?s:.)",
    r"\G\w\w|(?s:.)",
    r"\w*|\s",  # matches the empty string too
]


def replaced(text: str) -> str:
    """Lone surrogates -> U+FFFD (pairs join), as tiktoken does."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def write(path, data) -> str:
    data = data.encode("utf-8") if isinstance(data, str) else data
    path = Path(path)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return str(path)


# --- 1. capturing groups --------------------------------------------------------------------

GROUPED = [r"(\w+)|\s+", r"(\w)(\w)|\s+|.", r"(?P<word>\w+)|\s+", r"(?:(a)|b)+|.", r"(?|(a)|(b))|."]
UNGROUPED = [r"(?:\w+)|\s+|.", r"(?>\w+)|\s+|.", r"\w+(?=\s)|(?<=\s)\w+|\s|.", r"(?i:ab)|\w|\s|.",
             r"(?!x)\w+|\s+|."]


@pytest.mark.parametrize("pattern", GROUPED)
@pytest.mark.parametrize("pretokenizer", ["auto", "regex"])
def test_capturing_groups_are_refused_before_any_work(tmp_path, pattern, pretokenizer):
    # A missing file: the pattern is refused before the source is even looked at.
    with pytest.raises(ValueError, match="capturing groups"):
        train_bpe(tmp_path / "missing.txt", 300, [], pattern=pattern, pretokenizer=pretokenizer)
    consumed = []

    def texts():
        consumed.append(1)
        yield "some text"

    with pytest.raises(ValueError, match="capturing groups"):
        train_bpe_from_iterator(texts(), 300, [], pattern=pattern, pretokenizer=pretokenizer)
    assert not consumed
    with pytest.raises(ValueError, match="capturing groups"):
        Tokenizer({i: bytes([i]) for i in range(256)}, [], pattern=pattern,
                  pretokenizer=pretokenizer)


@pytest.mark.parametrize("pattern", UNGROUPED)
def test_groups_that_capture_nothing_are_fine(tmp_path, pattern):
    text = "ab cab xab ab\nabab, ab" * 5
    expected = reference_train_bpe(text, 270, [], pattern=pattern)
    assert train_bpe(write(tmp_path / "t.txt", text), 270, [], pattern=pattern) == expected
    assert train_bpe_from_iterator([text], 270, [], pattern=pattern) == expected
    vocab, merges = expected
    ref = ReferenceEncoder(vocab, merges, [], pattern).encode(text)
    assert Tokenizer(vocab, merges, pattern=pattern, block_chars=4).encode(text) == ref


# --- 2a. the built-in patterns' cut rules, proven at every place they allow ----------------------

WHITESPACE = ["\t", "\n", "\x0b", "\x0c", "\r", " ", "  ", "\r\n", "\x1c", "\x1f", "\x85", "\xa0",
              "\u1680", "\u2000", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
NOT_QUITE_WHITESPACE = ["\u200b", "\u180e", "\ufeff", "\x00"]
LETTERS = ["a", "Z", "é", "ǅ", "ʰ", "中", "ß", "Σ", "a\u0301", "\u0301", "\u0903", "\u20dd"]
NUMBERS = ["1", "23", "4567", "٣", "Ⅻ", "½", "²"]
PUNCT = ["'", "'s", "'S", "'ll", "'LL", "'ve", "'re", "'d", "'m", "'t", "’s", ".", "-", "/", "!",
         "\"", "\ufffd", "🙂", "👩‍👩‍👧"]
TRICKY = WHITESPACE + NOT_QUITE_WHITESPACE + LETTERS + NUMBERS + PUNCT
tricky_texts = st.lists(st.one_of(st.sampled_from(WHITESPACE), st.sampled_from(WHITESPACE),
                                  st.sampled_from(LETTERS + NUMBERS), st.sampled_from(PUNCT),
                                  st.sampled_from(NOT_QUITE_WHITESPACE),
                                  st.characters(codec="utf-8")),
                        max_size=30).map("".join)


def file_rule_cuts(text: str) -> list[int]:
    """Character positions where `corpus` may cut text (between an ASCII letter or digit and a
    space or newline), found on the UTF-8 bytes exactly as the chunker finds them."""
    data = text.encode("utf-8")
    byte_cuts = {m.start() for m in corpus._WHITESPACE_BOUNDARY.finditer(data)}
    return [i for i in range(1, len(text)) if len(text[:i].encode("utf-8")) in byte_cuts]


def text_rule_cuts(text: str, pattern: str) -> list[int]:
    """Every place `corpus.safe_text_cut` may cut text with `pattern` (a batch's groups, a long
    text's pieces), no special tokens given."""
    cuts = (corpus.safe_text_cut(text, at, pattern=pattern) for at in range(1, len(text)))
    return sorted({cut for cut in cuts if cut is not None})


def tokenizer_rule_cuts(text: str, pattern: str) -> list[int]:
    """Every place `Tokenizer._safe_cut` may cut text with `pattern`: the last cut of the rule
    searched backwards (`corpus.last_text_cut_rule`) up to each place."""
    rule = corpus.last_text_cut_rule(pattern)
    matches = (rule.search(text, 0, end) for end in range(1, len(text) + 1))
    return sorted({m.start("cut") for m in matches if m is not None})


def assert_cuts_keep_pretokens(pattern: str, text: str, cuts: list[int]):
    findall = regex.compile(pattern).findall
    whole = findall(text)
    for c in cuts:
        assert findall(text[:c]) + findall(text[c:]) == whole, (text[:c], text[c:])
    bounds = [0, *cuts, len(text)]
    assert [t for a, b in zip(bounds, bounds[1:]) for t in findall(text[a:b])] == whole


def test_the_proven_patterns_are_the_built_in_ones():
    assert set(WHITESPACE_CUT_PATTERNS) == set(BUILT_IN)
    assert set(corpus._TEXT_CUT_RULES) == set(corpus._LAST_TEXT_CUT_RULES) == set(BUILT_IN)
    for pattern in CUSTOM:
        assert not corpus.whitespace_cuts_allowed(pattern)
        assert Tokenizer({i: bytes([i]) for i in range(256)}, [], pattern=pattern)._cut is None
        # a batch's groups: cut only at special tokens, not by the default ASCII rule
        assert corpus.safe_text_cut("ab cd\nef <s> gh", 1, ["<s>"], pattern=pattern) == 9


@settings(max_examples=400)
@given(text=tricky_texts, pattern=st.sampled_from(BUILT_IN))
def test_whitespace_cuts_keep_the_pretokens_of_built_in_patterns(text, pattern):
    assert_cuts_keep_pretokens(pattern, text, file_rule_cuts(text))
    assert_cuts_keep_pretokens(pattern, text, tokenizer_rule_cuts(text, pattern))
    assert_cuts_keep_pretokens(pattern, text, text_rule_cuts(text, pattern))


def test_the_rules_would_be_wrong_for_custom_patterns():
    # What the review found: the whitespace cut changes the pre-tokens of such patterns.
    text = "ab cd\nef gh"
    for pattern in CUSTOM[:2]:
        with pytest.raises(AssertionError):
            assert_cuts_keep_pretokens(pattern, text, file_rule_cuts(text))


# --- 2b. custom patterns: training and encoding equal the references ---------------------------

SPECIALS = ["<s>", "x<s>"]
custom_pieces = st.one_of(
    # words next to spaces and newlines: where the built-in rules would cut
    st.sampled_from(["ab ", "a b", "word ", "1 ", "Z\n", "cd\n", "x y z", " ab", "ab!", "é ",
                     "中 "]),
    st.sampled_from(["a", "b", "Z", "1", " ", "  ", "\n", "\t", "!", ".", "é", "中", "\ufffd"]),
    st.sampled_from(["<s>", "x<s>", "<s", "s>", "x"]),
)
custom_texts = st.lists(custom_pieces, min_size=3, max_size=60).map("".join)


@pytest.mark.parametrize("pattern", CUSTOM)
def test_a_custom_pattern_is_cut_only_at_special_tokens(tmp_path, pattern):
    text = ("lorem ipsum dolor sit amet\n" * 400).encode()
    path = write(tmp_path / "t.txt", text)
    assert chunk_boundaries(path, 100, [], pattern=pattern) == [0, len(text)]  # one unit
    with_specials = write(tmp_path / "s.txt", text.replace(b"amet\n", b"amet<s>"))
    bounds = chunk_boundaries(with_specials, 100, ["<s>"], pattern=pattern)
    assert len(bounds) > 100
    data = Path(with_specials).read_bytes()
    assert all(data[b:b + 3] == b"<s>" for b in bounds[1:-1])
    assert len(chunk_boundaries(path, 100, [], pattern=GPT2_PATTERN)) > 100


@settings(max_examples=40)
@given(text=custom_texts, pattern=st.sampled_from(CUSTOM), specials=st.sampled_from([[], SPECIALS]),
       suffix=st.sampled_from([".txt", ".gz"]), extra=st.sampled_from([3, 30, 300]))
def test_custom_pattern_training_equals_the_reference(tmp_path_factory, text, pattern, specials,
                                                      suffix, extra):
    path = write(tmp_path_factory.mktemp("c") / f"t{suffix}", text)
    vocab_size = 256 + len(specials) + extra
    expected = reference_train_bpe(text, vocab_size, specials, pattern=pattern)
    for chunk_bytes, workers in RUNS:
        assert_counts_equal_the_reference(path, text, specials, pattern, chunk_bytes, workers)
        got = train_bpe(path, vocab_size, specials, pattern=pattern, chunk_bytes=chunk_bytes,
                        num_workers=workers)
        assert got == expected, (chunk_bytes, workers)


def test_custom_pattern_training_on_a_corpus_over_the_default_chunk_size(tmp_path):
    # The review's case: a corpus over 2 MiB, which the default chunking used to cut between "b"
    # and " ". After merging ("a", "b"), ("ab", " ") and (" ", "ab") tie and the first wins;
    # one line cut in two would give the second one count more.
    text = "ab ab\n" * ((2 << 20) // 6 + 1000)
    pattern = r"[^\n]+|\n"
    expected = reference_train_bpe(text, 259, [], pattern=pattern)
    assert expected[1] == [(b"a", b"b"), (b"ab", b" "), (b"ab ", b"ab")]
    path = write(tmp_path / "big.txt", text)
    assert train_bpe(path, 259, [], pattern=pattern, num_workers=2) == expected


@pytest.fixture(scope="module")
def small_model():
    """A small (vocab, merges), trained on text with the characters the tests use."""
    text = ("a b ab aab abab Z1 1 11 word words  \n\t!.é中 x<s> \ufffd\ufffd a \ufffd "
            "🙂 the cat\n") * 4
    return reference_train_bpe(text, 300, [])


_tokenizers = {}


def tokenizer_for(model, specials, pattern, block_chars, pretokenizer="auto"):
    key = (tuple(specials), pattern, block_chars, pretokenizer)
    if key not in _tokenizers:
        _tokenizers[key] = Tokenizer(*model, specials, pattern=pattern, block_chars=block_chars,
                                     pretokenizer=pretokenizer, cache_size=16)
    return _tokenizers[key]


def splits_of(text: str, sizes: list[int]) -> list[str]:
    out, i = [], 0
    for size in itertools.cycle(sizes or [len(text) + 1]):
        if i >= len(text):
            return out
        out.append(text[i:i + size])
        i += size


@settings(max_examples=60)
@given(text=custom_texts, pattern=st.sampled_from(CUSTOM + BUILT_IN),
       specials=st.sampled_from([[], SPECIALS]), sizes=st.lists(st.integers(1, 9), max_size=5))
def test_custom_pattern_encoding_equals_the_reference(small_model, text, pattern, specials, sizes):
    expected = ReferenceEncoder(*small_model, specials, pattern).encode(text)
    for block_chars in (1, 3, 16, 1 << 20):
        tok = tokenizer_for(small_model, specials, pattern, block_chars, "regex")
        assert tok.encode(text) == expected, block_chars
        assert list(tok.encode_iterable(splits_of(text, sizes))) == expected, block_chars


@settings(max_examples=25)
@given(text=custom_texts, pattern=st.sampled_from(CUSTOM),
       specials=st.sampled_from([[], SPECIALS]), suffix=st.sampled_from([".txt", ".gz"]))
def test_custom_pattern_encode_file_equals_the_reference(tmp_path_factory, small_model, text,
                                                         pattern, specials, suffix):
    tmp = tmp_path_factory.mktemp("e")
    expected = ReferenceEncoder(*small_model, specials, pattern).encode(text)
    tok = tokenizer_for(small_model, specials, pattern, 4)
    source = write(tmp / f"in{suffix}", text)
    for chunk_bytes, workers in RUNS:
        out = tmp / f"out{chunk_bytes}-{workers}.bin"
        encode_file(tok, source, out, chunk_bytes=chunk_bytes, num_workers=workers)
        assert np.asarray(open_token_file(out)).tolist() == expected, (chunk_bytes, workers)


# --- 3. special tokens holding U+FFFD ---------------------------------------------------------

FFFD_SPECIALS = [["\ufffd"], ["a \ufffd", "<s>"], ["\ufffd<s>", "<s>"], ["x\ufffd<s>", "<s>"],
                 ["\ufffd b", "\ufffd\ufffd"], ["1\n\ufffd2"]]
# Invalid sequences of 1, 2 and 3 bytes (each one U+FFFD), the valid U+FFFD, what surrounds the
# special tokens above, and those special tokens spelled with invalid bytes.
INVALID = [b"\xff", b"\x80", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x99", b"\xed\xa0\x80"]
RAW_PIECES = [b"a", b"b", b"1", b"2", b"x", b" ", b"\n", b"a ", b" b", b"1\n", b"<s>", b"<s", b"s>",
              "\ufffd".encode(), "é".encode(), b"word "]


@st.composite
def fffd_cases(draw):
    """(specials, bytes): special tokens holding U+FFFD, and a file with them spelled with
    invalid bytes (1 to 3 of them make one U+FFFD) among the text around them."""
    specials = draw(st.sampled_from(FFFD_SPECIALS))
    spelled = st.builds(lambda special, bad: special.encode().replace("\ufffd".encode(), bad),
                        st.sampled_from(specials), st.sampled_from(INVALID))
    pieces = st.one_of(st.sampled_from(RAW_PIECES), st.sampled_from(INVALID), spelled)
    return specials, b"".join(draw(st.lists(pieces, min_size=3, max_size=60)))


def assert_counts_equal_the_reference(path, text, specials, pattern, chunk_bytes, workers,
                                      errors="strict"):
    """The pre-token counts (what training learns from) are those of the whole text."""
    from nbbpe.pretokenize import count_pretokens_in_source
    from nbbpe.workers import LocalExecutor

    counts = count_pretokens_in_source(path, specials, pattern=pattern, chunk_bytes=chunk_bytes,
                                       executor=LocalExecutor(workers), errors=errors).to_dict()
    expected = reference_pretoken_counts(text, specials, pattern)
    # A pattern matching the empty string finds it once more in the empty stretch before a
    # special token that starts a chunk: b"" has no pairs, so it cannot change the merges.
    counts.pop(b"", None)
    expected.pop(b"", None)
    assert counts == expected, (chunk_bytes, workers)


@settings(max_examples=40)
@given(case=fffd_cases(), pattern=st.sampled_from([GPT2_PATTERN, CL100K_PATTERN, CUSTOM[1]]),
       suffix=st.sampled_from([".txt", ".gz"]), extra=st.sampled_from([3, 30, 300]))
def test_training_with_fffd_specials_over_invalid_bytes(tmp_path_factory, case, pattern, suffix,
                                                        extra):
    specials, data = case
    path = write(tmp_path_factory.mktemp("f") / f"t{suffix}", data)
    vocab_size = 256 + len(specials) + extra
    text = data.decode("utf-8", errors="replace")
    expected = reference_train_bpe(text, vocab_size, specials, pattern=pattern)
    for chunk_bytes, workers in RUNS:
        assert_counts_equal_the_reference(path, text, specials, pattern, chunk_bytes, workers,
                                          errors="replace")
        got = train_bpe(path, vocab_size, specials, pattern=pattern, chunk_bytes=chunk_bytes,
                        num_workers=workers, errors="replace")
        assert got == expected, (chunk_bytes, workers)


@settings(max_examples=30)
@given(case=fffd_cases(), pattern=st.sampled_from([GPT2_PATTERN, CUSTOM[1]]),
       suffix=st.sampled_from([".txt", ".gz"]))
def test_encode_file_with_fffd_specials_over_invalid_bytes(tmp_path_factory, small_model, case,
                                                           pattern, suffix):
    specials, data = case
    tmp = tmp_path_factory.mktemp("g")
    expected = ReferenceEncoder(*small_model, specials, pattern).encode(
        data.decode("utf-8", errors="replace"))
    tok = tokenizer_for(small_model, specials, pattern, 4)
    source = write(tmp / f"in{suffix}", data)
    for chunk_bytes, workers in RUNS:
        out = tmp / f"out{chunk_bytes}-{workers}.bin"
        encode_file(tok, source, out, chunk_bytes=chunk_bytes, num_workers=workers,
                    errors="replace")
        assert np.asarray(open_token_file(out)).tolist() == expected, (chunk_bytes, workers)


def test_no_boundary_within_the_longest_special_of_invalid_utf8(tmp_path):
    # "a \xff" is "a \ufffd" after replacement: the cut between "a" and " " would split it.
    data = b"word a \xf0\x9f\x99 word " * 50
    path = write(tmp_path / "t.txt", data)
    bounds = chunk_boundaries(path, 1, ["a \ufffd"])
    longest = len("a \ufffd".encode())
    bad = [m.start() for m in regex.finditer(rb"\xf0\x9f\x99", data)]
    assert len(bounds) >= 50
    assert all(abs(b - p) > longest for b in bounds for p in bad)
    # Without a special token holding U+FFFD nothing is given up.
    assert len(chunk_boundaries(path, 1, ["<s>"])) > 2 * len(bounds) - 10


def test_the_search_reads_on_past_its_window_with_what_it_looks_back_at(tmp_path):
    # No safe place in the first window: the search reads on, keeping the bytes it looks back at,
    # so "<s>" inside "x<s>" (or inside "\ufffd<s>" spelled "\xff<s>") is no boundary, wherever
    # the window ends.
    specials = ["x<s>", "<s>", "\ufffd<s>"]
    window = 64 << 10
    for offset in range(-16, 8):
        head = b"y" * (window + offset)
        for filler, expected in [(b"x<s>", [len(head)]), (b"\xff<s>", [])]:
            data = head + filler + b"y" * 10 + b"<s>" + b"z" * 20
            path = write(tmp_path / "t.txt", data)
            bounds = chunk_boundaries(path, 1, specials)
            assert bounds == [0, *expected, len(head) + len(filler) + 10, len(data)], offset


SURROGATES = ["\ud800", "\udfff", "\ud83d", "\ude00"]  # the last two make a pair when adjacent


@st.composite
def surrogate_cases(draw):
    """(specials, text): special tokens holding U+FFFD, and a str with them spelled with a lone
    surrogate among the text around them."""
    specials = draw(st.sampled_from(FFFD_SPECIALS))
    spelled = st.builds(lambda special, lone: special.replace("\ufffd", lone),
                        st.sampled_from(specials), st.sampled_from(SURROGATES))
    pieces = st.one_of(st.sampled_from(["a", "b", " ", "a ", " b", "1", "2", "\n", "<s>", "<s",
                                        "s>", "x", "\ufffd", "é", "word "]),
                       st.sampled_from(SURROGATES), spelled)
    return specials, "".join(draw(st.lists(pieces, min_size=3, max_size=60)))


@settings(max_examples=60)
@given(case=surrogate_cases(),
       pattern=st.sampled_from([GPT2_PATTERN, CL100K_PATTERN, O200K_PATTERN, CUSTOM[1]]),
       sizes=st.lists(st.integers(1, 9), max_size=5))
def test_lone_surrogates_next_to_fffd_specials(small_model, case, pattern, sizes):
    specials, text = case
    expected = ReferenceEncoder(*small_model, specials, pattern).encode(replaced(text))
    for pretokenizer, block_chars in [("regex", 1), ("regex", 3), ("regex", 1 << 20),
                                      ("auto", 2), ("auto", 1 << 20)]:
        tok = tokenizer_for(small_model, specials, pattern, block_chars, pretokenizer)
        assert tok.encode(text) == expected, (pretokenizer, block_chars)
        assert list(tok.encode_iterable(splits_of(text, sizes))) == expected, (pretokenizer,
                                                                                block_chars)
