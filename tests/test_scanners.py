"""The compiled scanners of every pattern family against `regex` itself: pre-token spans (in UTF-8
bytes) on the fixture texts, the shared corpora and hypothesis strings weighted toward what makes
each pattern tricky; segments scanned as texts of their own; the tables' classes on every code
point; the claims the scanners rely on (pre-tokens tile the text; tiktoken's spelling of GPT-2's
pattern finds the same pre-tokens); the block scanners of cl100k and o200k against their own
scanners, at every pre-token start of long ASCII-heavy texts."""

import functools
import random
from pathlib import Path

import numpy as np
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from nbbpe.patterns import CL100K_PATTERN, GPT2_PATTERN, O200K_PATTERN, TIKTOKEN_GPT2_PATTERN
from nbbpe.scanners import cl100k, gpt2, o200k
from nbbpe.scanners.classes import (N_CODE_POINTS, AsciiBlock, ascii_block, byte_mask,
                                    every_code_point)
from nbbpe.scanners.spans import WINDOW, scan_window_visiting
from nbbpe.scanners.specials import make_specials, next_special

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE_TEXTS = sorted(path.name for path in FIXTURES.glob("*.txt")) + ["corpus.en"]
CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"
CORPUS_NAMES = ["web_5M.txt", "multi_1M.txt", "tinystories_real.txt"]
CORPUS_CHARS = 1_000_000  # of each corpus: enough for every kind of text in it, and fast

# Family -> (spans kernel, its table); pattern -> family, every spelling a family implements.
FAMILIES = {
    "gpt2": (gpt2.gpt2_spans, gpt2.class_table),
    "cl100k": (cl100k.cl100k_spans, cl100k.class_table),
    "o200k": (o200k.o200k_spans, o200k.class_table),
}
PATTERNS = {
    "gpt2": GPT2_PATTERN,
    "gpt2-tiktoken": TIKTOKEN_GPT2_PATTERN,
    "cl100k": CL100K_PATTERN,
    "o200k": O200K_PATTERN,
}
FAMILY_OF = {"gpt2": "gpt2", "gpt2-tiktoken": "gpt2", "cl100k": "cl100k", "o200k": "o200k"}
COMPILED = {name: regex.compile(pattern) for name, pattern in PATTERNS.items()}

# Pieces that stress each rule of the patterns, weighted by how many times each is listed.
TRICKY_PIECES = {
    # contractions: the apostrophe, every suffix letter in every case, the letters `regex` folds
    # to them (U+017F long s; U+212A Kelvin sign folds to k, no suffix letter), near misses
    "'": 16, "s": 3, "S": 2, "\u017f": 3, "t": 2, "T": 2, "d": 2, "D": 1, "m": 2, "M": 1,
    "l": 2, "L": 2, "ll": 2, "LL": 1, "lL": 1, "Ll": 1, "v": 1, "V": 1, "ve": 2, "VE": 1, "vE": 1,
    "r": 1, "R": 1, "re": 2, "RE": 1, "Re": 1, "e": 2, "E": 1, "\u212a": 1, "k": 1,
    "'s": 3, "'S": 2, "'\u017f": 2, "'T": 1, "'ll": 2, "'LL": 1, "'Ve": 1, "'rE": 1, "'D": 1,
    "\u2019": 1, "\u2019s": 1,
    # letters: lower, upper, title case (U+01C5, U+01C8), modifier (Lm) and other (Lo) letters,
    # combining marks (Mn, Mc, Me) alone and after letters, Devanagari with vowel signs
    "a": 6, "b": 2, "Zz": 2, "A": 3, "HTML": 1, "é": 2, "ß": 1, "\u01c5": 2, "\u01c8": 1,
    "\u02b0": 1, "\u30fc": 1, "\u3005": 1, "\u00aa": 1, "中文": 2, "中": 1, "ا": 1, "한": 1,
    "𝔘": 1, "\u0301": 4, "e\u0301": 2, "E\u0301": 1, "\u0300\u0301": 1, "\u20dd": 1,
    "नमस्ते": 1, "क": 1, "ि": 1, "\u0903": 1, "ǅx": 1, "Ǆ": 1, "ǆ": 1,
    # numbers in groups of 1 to 7, and numbers of other kinds
    "1": 4, "12": 2, "123": 2, "1234": 2, "12345": 1, "123456": 1, "1234567": 1, "٣": 1,
    "५": 1, "Ⅻ": 1, "½": 1, "²": 1, "𝟙": 1,
    # other characters, `/` after punctuation, emoji with ZWJ and variation selectors
    "!": 3, ".": 2, ",": 2, "-": 1, "/": 3, "//": 1, "</": 1, "\"": 1, "(": 1, "<": 1,
    "\x00": 1, "\ufffd": 1, "👍": 1, "👍🏽": 1, "👨\u200d👩\u200d👧": 1, "#\ufe0f\u20e3": 1,
    "\u200d": 1, "\ufe0f": 1,
    # whitespace: runs and mixes of \r, \n, spaces, other whitespace (ASCII and not), and
    # characters some definitions count as whitespace and `regex` may not
    " ": 16, "  ": 3, "   ": 1, "\n": 6, "\n\n": 2, "\r\n": 3, "\r": 2, "\r\n\r\n": 1, "\t": 2,
    "\x0b": 1, "\x0c": 1, "\x1c": 1, "\x1d": 1, "\x1e": 1, "\x1f": 1, "\x85": 1, "\u00a0": 2,
    "\u1680": 1, "\u2000": 1, "\u2028": 1, "\u2029": 1, "\u202f": 1, "\u3000": 2, "\u180e": 1,
    "\u200b": 1, "\ufeff": 1,
}
TRICKY_ALPHABET = [piece for piece, weight in TRICKY_PIECES.items() for _ in range(weight)]
tricky_pieces = st.sampled_from(TRICKY_ALPHABET)
# Short texts, and long ones (hypothesis keeps lists short unless told a minimum size).
tricky_texts = st.one_of(st.lists(tricky_pieces, max_size=10),
                         st.lists(tricky_pieces, min_size=10, max_size=60)).map("".join)
# Trailing whitespace decides `\s++$` and `\s+(?!\S)`: end some texts with it.
TRAILING = ["", " ", "  ", "\n", " \n", "\n ", "\r\n", "\t", "\u00a0", "\u3000 "]
tricky_texts_with_ends = st.tuples(tricky_texts, st.sampled_from(TRAILING)).map("".join)
any_texts = st.one_of(tricky_texts_with_ends, st.text(max_size=60))


def read(name):
    return (FIXTURES / name).read_text(encoding="utf-8")


def utf8_offsets(text):
    """UTF-8 byte offset of every character index of `text`, and of its end."""
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    lengths = 1 + (code_points >= 0x80) + (code_points >= 0x800) + (code_points >= 0x10000)
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def regex_spans(name, text):
    """The spans of `regex.finditer(PATTERNS[name], text)`, in UTF-8 bytes, shape (n, 2)."""
    spans = np.array([m.span() for m in COMPILED[name].finditer(text)], dtype=np.int64)
    return utf8_offsets(text)[spans.reshape(-1, 2)]


def scan_spans(family, buf, segments):
    """The spans the family's kernel finds in each (start, end) segment of `buf`, shape (n, 2)."""
    spans_kernel, class_table = FAMILIES[family]
    buf = np.frombuffer(buf, dtype=np.uint8)
    seg_starts = np.array([start for start, _ in segments], dtype=np.int64)
    seg_ends = np.array([end for _, end in segments], dtype=np.int64)
    starts = np.empty(buf.size, dtype=np.int64)
    ends = np.empty(buf.size, dtype=np.int64)
    n = spans_kernel(buf, class_table(), seg_starts, seg_ends, starts, ends)
    return np.stack([starts[:n], ends[:n]], axis=1)


def text_segments(texts, gaps):
    """(UTF-8 buffer, (start, end) of each text in it): the texts in order, each followed by its
    gap (what lies between segments, e.g. a special token)."""
    buf = b""
    segments = []
    for text, gap in zip(texts, gaps):
        start = len(buf)
        buf += text.encode("utf-8")
        segments.append((start, len(buf)))
        buf += gap.encode("utf-8")
    return buf, segments


def assert_scan_matches_regex(name, text):
    buf = text.encode("utf-8")
    got = scan_spans(FAMILY_OF[name], buf, [(0, len(buf))])
    want = regex_spans(name, text)
    if not np.array_equal(got, want):  # show the first pre-token that differs, as text
        k = next((k for k in range(min(len(got), len(want))) if tuple(got[k]) != tuple(want[k])),
                 min(len(got), len(want)))

        def pieces(spans):
            return [buf[a:b].decode("utf-8", "replace") for a, b in spans[k:k + 3]]

        pytest.fail(f"{name}: pre-token {k} differs: scanner {pieces(got)!r}, regex "
                    f"{pieces(want)!r}, after {buf[max(0, want[k][0] - 40):want[k][0]]!r}"
                    if k < len(want) else f"{name}: the scanner finds more pre-tokens")


# --- the fixture texts and the shared corpora -------------------------------------------------


@pytest.mark.parametrize("name", PATTERNS)
@pytest.mark.parametrize("fixture", FIXTURE_TEXTS)
def test_scanner_matches_regex_on_fixture_texts(name, fixture):
    assert_scan_matches_regex(name, read(fixture))


@pytest.fixture(scope="module", params=CORPUS_NAMES)
def corpus_text(request):
    path = CORPORA / request.param
    if not path.exists():
        pytest.skip("the shared development corpora are absent")
    with path.open(encoding="utf-8") as f:
        return f.read(CORPUS_CHARS)


@pytest.mark.parametrize("name", PATTERNS)
def test_scanner_matches_regex_on_shared_corpora(name, corpus_text):
    assert_scan_matches_regex(name, corpus_text)


# --- generated texts ----------------------------------------------------------------------------


@settings(max_examples=600)
@given(text=any_texts)
def test_scanners_match_regex_on_generated_texts(text):
    for name in PATTERNS:  # one text for all (generating it costs more than checking it)
        assert_scan_matches_regex(name, text)


@pytest.mark.parametrize("name", PATTERNS)
@pytest.mark.parametrize("text", [
    "", " ", "   ", "a", " a", "  a", "\n a", "\n\na", " \n", "a \t", "a  ", "don't", "DON'T",
    "x 's", "''s", "'''", "'ll've", " 'll", "a\u00a0b", "a \u00a0b", "1 2  3", "x\x1c\x1dy",
    "'\u017f", "x'\u017f", "X'LL", "'\u212a", "..hello", " ..hello", "(hello", "\u00a0hello",
    "\thello", "\r\nhello", "\nhello", "  \n  ", "a\n  ", "a \n\n  \n  b", " \r\n\r\n x",
    "1234567", " 1234", "a1234b", "!\n/x", "!!\r\n//\n/a", " /\n", "e\u0301", "\u0301",
    " \u0301", "\u0301\u0301a", "\u0301AB", "\u0301AB c", ".AB", "ABc", "ABC中DEF",
    "中文abc", "abc中文", "\u01c5x", "x\u01c5", "\u01c5", "HTMLParser", "नमस्ते दुनिया",
    "a'S", "A'Ll", "ab'VE", "\u0301's", "xyz'", "x'", "'", "👨\u200d👩\u200d👧 ok",
])
def test_scanner_matches_regex_on_small_cases(name, text):
    assert_scan_matches_regex(name, text)


def test_contraction_letters_in_every_position():
    """Every pair of the letters `regex` folds to a suffix letter (and their ASCII neighbours)
    after an apostrophe, alone and after a word, in each family."""
    folded = set()
    for letter in "sdmtlverk":
        folded.update(map(chr, cl100k.case_insensitive_matches(letter).tolist()))
    letters = sorted(folded | set("abcxyzABCXYZ") | {"\u00df", "\u0131", "\u0130"})
    pairs = [a + b for a in letters for b in letters] + letters
    for prefix in ["\n'", "\nx'", "\nX'", "\n\u0301'"]:
        text = "".join(prefix + pair for pair in pairs)
        for name in PATTERNS:
            assert_scan_matches_regex(name, text)


# --- segments -----------------------------------------------------------------------------------


def assert_segments_match_regex(texts, gaps, names):
    """Scanning the texts as segments of one buffer (`text_segments`) gives, for each pattern of
    `names` (a family's name is its own pattern's), the spans `regex` finds in each text alone."""
    buf, segments = text_segments(texts, gaps)
    for name in names:
        want = [regex_spans(name, text) + start for text, (start, _) in zip(texts, segments)]
        got = scan_spans(FAMILY_OF[name], buf, segments)
        np.testing.assert_array_equal(got, np.concatenate(want).reshape(-1, 2), name)

@settings(max_examples=150)
@given(texts=st.lists(any_texts, min_size=1, max_size=5),
       gaps=st.lists(st.sampled_from(["", "<|endoftext|>", "x", " ", "\n", "1", "'s", "\u0301"]),
                     min_size=5, max_size=5))
def test_segments_are_each_matched_as_a_text_of_their_own(texts, gaps):
    # What lies between segments (here `gaps`, e.g. a special token) is never looked at: the
    # end of a segment is the end of its text for `$`, lookaheads and possessive quantifiers.
    assert_segments_match_regex(texts, gaps, FAMILIES)


@njit(inline="always")
def _record_span(context, t, start, end):
    starts, ends = context
    starts[t] = start
    ends[t] = end


@njit
def _gpt2_window_visited(buf, table, i, stop, window, starts, ends):
    return scan_window_visiting(gpt2.gpt2_pretoken_end, gpt2.gpt2_block_boundaries, _record_span,
                                (starts, ends), buf, table, i, stop, window)


@pytest.mark.parametrize("text", [read("web_sample.txt"), read("multi_sample.txt"),
                                  "Héllo wörld, it's 2024!\n\n  " * 300])
def test_scan_window_visiting_visits_each_pre_token_as_found(text):
    # The encode loop keys each pre-token and prefetches its slot in `visit` (blocks of ASCII
    # and one pre-token at a time alike): each is visited once, in order, with its own span,
    # the spans `regex` gives, window after window.
    buf = np.frombuffer(text.encode("utf-8") + b" " * 64, dtype=np.uint8)  # a block past the end
    stop = len(text.encode("utf-8"))
    table = gpt2.class_table()
    window = np.empty(WINDOW, dtype=np.int64)
    starts = np.full(WINDOW, -1, dtype=np.int64)
    ends = np.full(WINDOW, -1, dtype=np.int64)
    found = []
    i = 0
    while i < stop:
        n = _gpt2_window_visited(buf, table, i, stop, window, starts, ends)
        assert 0 < n <= WINDOW
        np.testing.assert_array_equal(ends[:n], window[:n])
        np.testing.assert_array_equal(starts[:n], np.concatenate([[i], window[: n - 1]]))
        found.extend(zip(starts[:n].tolist(), ends[:n].tolist()))
        starts[:] = ends[:] = -1
        i = int(window[n - 1])
    np.testing.assert_array_equal(np.array(found), regex_spans("gpt2", text))


# --- the claims the scanners rely on ------------------------------------------------------------


@settings(max_examples=400)
@given(text=any_texts)
def test_pre_tokens_tile_the_text_and_both_gpt2_spellings_agree(text):
    # Every character starts a non-empty match, so each match starts where the previous ended and
    # no character is left out: the scanners only need to find where each pre-token ends.
    for name, pattern in COMPILED.items():
        position = 0
        for match in pattern.finditer(text):
            assert match.start() == position and match.end() > position, name
            position = match.end()
        assert position == len(text), name
    # Why both spellings of GPT-2's pattern are recognised as the gpt2 family.
    assert COMPILED["gpt2-tiktoken"].findall(text) == COMPILED["gpt2"].findall(text)


# --- the tables ---------------------------------------------------------------------------------


@functools.cache
def members(char_class):
    """Which code points `regex` puts in `char_class` (bool over 0..0x10FFFF)."""
    found = np.zeros(N_CODE_POINTS, dtype=bool)
    for match in regex.finditer(f"{char_class}+", every_code_point()):
        found[match.start():match.end()] = True
    return found


def test_cl100k_table_agrees_with_regex_on_every_code_point():
    table = cl100k.class_table()
    assert table.dtype == np.uint8 and table.shape == (N_CODE_POINTS,)
    assert not table.flags.writeable and cl100k.class_table() is table
    for bit, char_class in [(cl100k.LETTER, r"\p{L}"), (cl100k.NUMBER, r"\p{N}"),
                            (cl100k.SPACE, r"\s")]:
        np.testing.assert_array_equal((table & bit) != 0, members(char_class), char_class)
    codes = table >> cl100k.CONTRACTION_SHIFT
    for code, letter in enumerate(cl100k.CONTRACTION_LETTERS, 1):
        np.testing.assert_array_equal(codes == code, members(f"(?i:{letter})"), letter)


def test_o200k_table_agrees_with_regex_on_every_code_point():
    table = o200k.class_table()
    assert table.dtype == np.uint16 and table.shape == (N_CODE_POINTS,)
    assert not table.flags.writeable and o200k.class_table() is table
    for bit, char_class in [(o200k.IN_UPPER, r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"),
                            (o200k.IN_LOWER, r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"),
                            (o200k.MARK, r"\p{M}"), (o200k.NUMBER, r"\p{N}"),
                            (o200k.SPACE, r"\s"), (o200k.OTHER, r"[^\s\p{L}\p{N}]")]:
        np.testing.assert_array_equal((table & bit) != 0, members(char_class), char_class)
    codes = table >> o200k.CONTRACTION_SHIFT
    for code, letter in enumerate(o200k.CONTRACTION_LETTERS, 1):
        np.testing.assert_array_equal(codes == code, members(f"(?i:{letter})"), letter)


# --- the block scanners ---------------------------------------------------------------------------

# Family -> (scanner, block scanner, table): each block scanner is tested against its own scanner.
BLOCK_SCANNERS = {
    "gpt2": (gpt2.gpt2_pretoken_end, gpt2.gpt2_block_boundaries, gpt2.class_table),
    "cl100k": (cl100k.cl100k_pretoken_end, cl100k.cl100k_block_boundaries, cl100k.class_table),
    "o200k": (o200k.o200k_pretoken_end, o200k.o200k_block_boundaries, o200k.class_table),
}
ASCII_WHITESPACE = b"\t\n\x0b\x0c\r "

# ASCII-heavy pieces for texts long enough to hold many 64-byte blocks: contractions in and after
# words in every case, words in every case mix, numbers of every length, runs of whitespace with
# and without \r\n before everything, others alone and in runs before words and newlines, `/` after
# newlines (o200k's `[\r\n/]*`), a few non-ASCII characters (a block's ASCII ends before them).
BLOCK_PIECES = {
    "'": 6, "'s": 4, "'S": 2, "'t": 2, "'LL": 2, "'ll": 2, "'re": 2, "'Ve": 1, "'d": 1, "'M": 1,
    "'l": 1, "'v": 1, "they're": 2, "DON'T": 1, "it's": 2, "x's's": 1, "a'll": 1, "l": 1, "s": 1,
    "a": 4, "the": 4, "word": 3, "Hello": 3, "HTML": 2, "iPhone": 2, "HTMLParser": 1, "aBc": 1,
    "Z": 1, "e": 1,
    "0": 2, "12": 2, "123": 2, "1234": 2, "12345": 1, "123456": 1, "1234567": 1, "1" * 20: 1,
    " ": 24, "  ": 4, "   ": 2, "    ": 2, "\t": 3, " \t": 1, "\t ": 1, "\x0b": 1, "\x0c": 1,
    "\n": 8, "\n\n": 3, "\r\n": 4, "\r": 2, "\r\n\r\n": 2, " \n": 2, "\n ": 2, "\n  \n": 2,
    "\n    ": 2, " \r\n ": 1, "\n\t\n": 1,
    ".": 4, ",": 4, "!": 2, "!!": 2, "(": 2, ")": 1, "\"": 2, "-": 2, "/": 3, "//": 2, "</": 1,
    "\n/": 2, "}\n//": 1, "{": 1, "#": 1, "*": 1, "\x00": 1, "\x1c": 1, "\x7f": 1,
    "\u00e9": 1, "\u00a0": 1, "\u2019": 1, "\u4e2d": 1,
}
BLOCK_ALPHABET = [piece for piece, weight in BLOCK_PIECES.items() for _ in range(weight)]
ascii_heavy_texts = st.lists(st.sampled_from(BLOCK_ALPHABET), min_size=40,
                             max_size=200).map("".join)


def test_ascii_block_masks_every_byte_value_at_every_alignment():
    # The vector classification against a byte-by-byte one: all 256 values, unaligned loads.
    @njit
    def masks(buf, p):
        return ascii_block(buf, p)

    buf = np.frombuffer(bytes(range(256)) * 2 + bytes(range(255, -1, -1)), dtype=np.uint8)
    rules = [lambda b: b >= 0x80, lambda b: 0x41 <= b <= 0x5A, lambda b: 0x61 <= b <= 0x7A,
             lambda b: 0x30 <= b <= 0x39, lambda b: 9 <= b <= 13 or b == 32, lambda b: b == 32,
             lambda b: b in (10, 13), lambda b: b == 39, lambda b: b == 47]
    assert len(rules) == len(AsciiBlock._fields)
    for p in range(0, buf.size - 64, 7):
        block = [int(b) for b in buf[p:p + 64]]
        want = tuple(sum(1 << k for k, b in enumerate(block) if rule(b)) for rule in rules)
        assert tuple(int(m) for m in masks(buf, p)) == want, p


def test_byte_mask_finds_every_byte_value_at_every_alignment():
    @njit
    def mask(buf, p, byte):
        return byte_mask(buf, p, byte)

    buf = np.frombuffer(bytes(range(256)) * 2 + bytes(range(255, -1, -1)), dtype=np.uint8)
    for p in range(0, buf.size - 64, 5):
        for byte in (0, 1, 60, 0x7F, 0x80, 0xC3, 0xFF, int(buf[p + 63])):
            want = sum(1 << k for k in range(64) if buf[p + k] == byte)
            assert int(mask(buf, p, byte)) == want, (p, byte)


def reference_next_special(data: bytes, i: int, end: int, tokens: list[bytes]):
    """(where, which) as `next_special` promises: the first place in data[i:end] where a token
    starts, the longest there, by its index in `tokens` (longest first)."""
    for at in range(i, end):
        for which, token in enumerate(tokens):
            if data.startswith(token, at) and at + len(token) <= end:
                return at, which
    return end, -1


@pytest.mark.parametrize("tokens", [["<|endoftext|>"], ["<|endoftext|>", "<|fim|>", "<"],
                                    ["\u00e9t\u00e9", "[SEP]", "<s>"]])
def test_next_special_finds_the_first_occurrence(tokens):
    # Tokens dropped at random places of random bytes (many of them a token's first byte), so
    # the 64- and 8-byte skips meet occurrences at every offset, near ends and cut by `end`.
    specials = make_specials([(token, 1000 + k) for k, token in enumerate(tokens)])
    encoded = [bytes(specials.data[specials.offsets[t]:specials.offsets[t + 1]])
               for t in range(len(specials.ids))]
    rng = random.Random(7)
    alphabet = b"ab <|\xc3\xa9e[t"
    for _ in range(300):
        data = bytearray(rng.choice(alphabet) for _ in range(rng.randrange(0, 300)))
        for _ in range(rng.randrange(0, 3)):
            at = rng.randrange(0, len(data) + 1)
            data[at:at] = rng.choice(encoded)
        data = bytes(data)
        buf = np.frombuffer(data, dtype=np.uint8)
        i = rng.randrange(0, len(data) + 1)
        end = rng.randrange(i, len(data) + 1)
        got = next_special(buf, i, end, specials)
        assert (int(got[0]), int(got[1])) == reference_next_special(data, i, end, encoded), (data, i, end)


def scalar_starts(family, buf, stop=None):
    """Where the family's scanner starts pre-tokens in the text buf[:stop] (its end included)."""
    scanner, _, class_table = BLOCK_SCANNERS[family]
    table = class_table()
    stop = buf.size if stop is None else stop
    starts = [0]
    while starts[-1] < stop:
        starts.append(scanner(buf, table, starts[-1], stop))
    return np.array(starts, dtype=np.int64)


def expected_block_bits(buf, starts, p, stop):
    """What the block scanners promise at the pre-token start p of the text buf[:stop]: the
    starts in buf[p + 1:p + n - 2] where buf[p:p + n] is ASCII and in the text (n <= 64), except
    those inside a whitespace run reaching byte p + n - 1 (what follows the run decides how it is
    cut), as bits of a uint64."""
    block = bytes(buf[p:min(p + 64, stop)])
    n = next((k for k, byte in enumerate(block) if byte >= 0x80), len(block))
    run = len(block[:n].rstrip(ASCII_WHITESPACE))  # where a trailing whitespace run starts
    last = n - 3 if run == n else min(n - 3, run)  # the last bit that may be set
    found = starts[np.searchsorted(starts, p, "right"):np.searchsorted(starts, p + last, "right")]
    return sum(1 << int(k) for k in found - p)


def assert_blocks_match_scanner(family, text, after=""):
    """At every pre-token start p of `text` with 64 bytes from p in the buffer (`text`, then
    `after`: what follows the text's end, which the block scanner reads but must not use), the
    block scanner's bits are the expected ones; returns how many blocks gave starts."""
    _, block_scanner, class_table = BLOCK_SCANNERS[family]
    table = class_table()
    stop = len(text.encode("utf-8"))
    buf = np.frombuffer((text + after).encode("utf-8"), dtype=np.uint8)
    starts = scalar_starts(family, buf, stop)
    handled = 0
    for p in starts[(starts + 64 <= buf.size) & (starts < stop)]:
        got = int(block_scanner(buf, table, p, stop))
        want = expected_block_bits(buf, starts, p, stop)
        if got != want:
            pytest.fail(f"{family} block at {p} {bytes(buf[p:p + 64])!r}, text ending at "
                        f"{stop}: bits {[k for k in range(64) if got >> k & 1]}, the scanner's "
                        f"{[k for k in range(64) if want >> k & 1]}")
        handled += got != 0
    return handled


@settings(max_examples=200)
@given(text=ascii_heavy_texts)
def test_block_scanners_match_their_scanners(text):
    for family in BLOCK_SCANNERS:
        assert_blocks_match_scanner(family, text)
    for name in PATTERNS:  # and the spans kernels, which use them, match `regex`
        assert_scan_matches_regex(name, text)


@pytest.mark.parametrize("family", BLOCK_SCANNERS)
def test_block_scanners_match_their_scanners_on_long_random_texts(family):
    # Many more blocks than hypothesis draws cheaply: texts of 1,000 pieces from a seeded random.
    rng = random.Random(64)
    for _ in range(40):
        assert_blocks_match_scanner(family, "".join(rng.choices(BLOCK_ALPHABET, k=1000)))


@pytest.mark.parametrize("family", BLOCK_SCANNERS)
@pytest.mark.parametrize("text", [
    "x" * 70, "1" * 70, " " * 70, "\n" * 70, "." * 70, "a" * 61 + "'s'll",
    "a" * 60 + "'ll" + "x" * 9,
    "ab " * 30, "a \n" * 30, "a\n  \n  b " * 10, "x\r\n\r\n  y\t\tz  \n" * 6, "!\n/!x (y !!z " * 7,
    "don't DON'T they'RE x's's a'll 'tis " * 4, "iPhone HTMLParser aBcD's ABC'S " * 4,
    "12345678901234567890 1234 12 1 " * 4, "x" * 58 + "\n\n  \n   ", "x" * 60 + "\u00e9" + "y" * 9,
    "(word !!word  \tword\t word ,word\n" * 5,
])
def test_block_scanners_on_chosen_texts(family, text):
    # Blocks of one class, or cut at their end, give no start: the expected bits are 0 then.
    assert_blocks_match_scanner(family, text)


@settings(max_examples=100)
@given(texts=st.lists(ascii_heavy_texts, min_size=2, max_size=4),
       gaps=st.lists(st.sampled_from(["", "<|endoftext|>", "x", " ", "\n", "1", "'s", "ll"]),
                     min_size=4, max_size=4))
def test_long_segments_are_each_matched_as_a_text_of_their_own(texts, gaps):
    # Segments long enough that the block scanners cut them, their last 64 bytes included (the
    # buffer goes on after all but the last): nothing after a segment's end changes its spans.
    assert_segments_match_regex(texts, gaps, PATTERNS)


# What follows a text in a buffer: the next document, a special token, more of the same classes.
AFTER_TEXTS = ["x" * 64, " " * 64, "\n" * 64, "1" * 64, "'s" * 32, "<|endoftext|>" + "a b " * 13,
               "\u00e9" * 32, "!" * 64, "ll" * 32, " \n" * 32]


@settings(max_examples=200)
@given(text=ascii_heavy_texts, after=st.sampled_from(AFTER_TEXTS))
def test_block_scanners_do_not_look_past_the_end_of_the_text(text, after):
    # The last 64 bytes of a text of a batch are cut a block at a time too: the buffer goes on
    # after the text, and whatever it holds, the bits are those of the text alone.
    for family in BLOCK_SCANNERS:
        assert_blocks_match_scanner(family, text, after)


@pytest.mark.parametrize("family", BLOCK_SCANNERS)
@pytest.mark.parametrize("text", ["ab " * 20 + "cd  ", "word's" * 11, "x" * 10 + "  \n  ",
                                  "12345" * 13, "a \r\n" * 16, "don't" * 12 + "'", "hi" * 31 + "'"])
@pytest.mark.parametrize("after", ["s", " x", "\n", "ll", "9", "\u00e9"])
def test_block_scanners_at_the_end_of_chosen_texts(family, text, after):
    # Texts ending in a run (of whitespace, letters, numbers), in an apostrophe or inside a
    # contraction, followed by what would join or cut that run if it were read.
    assert_blocks_match_scanner(family, text, after * 64)


@pytest.mark.parametrize("family", BLOCK_SCANNERS)
def test_block_scanners_on_the_corpora(family, corpus_text):
    # The right starts, and from most blocks (those of the multilingual corpus too).
    text = corpus_text[:60_000]
    handled = assert_blocks_match_scanner(family, text)
    assert handled > len(text.encode("utf-8")) / 64 / 2


def test_char_flags_are_kept_in_a_file_and_read_back_only_when_whole(tmp_path, monkeypatch):
    # computed with regex once, then read from a file beside the kernel cache (keyed on regex's
    # version and the module's source); a cut-short file is recomputed, an unwritable place
    # only means computing each time
    from nbbpe.scanners import classes

    computed = classes.compute_char_flags()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    path = Path(classes._char_flags_path())
    assert path.parent == tmp_path / "nbbpe" and path.name.startswith("char_flags-")
    classes.char_flags.cache_clear()
    try:
        assert np.array_equal(classes.char_flags(), computed)  # computed, and written
        assert path.read_bytes() == computed.tobytes()
        assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left

        classes.char_flags.cache_clear()
        with monkeypatch.context() as m:  # now read, not computed
            m.setattr(classes, "compute_char_flags", lambda: pytest.fail("computed again"))
            flags = classes.char_flags()
        assert np.array_equal(flags, computed) and not flags.flags.writeable

        path.write_bytes(computed.tobytes()[:1000])  # cut short: computed and written again
        classes.char_flags.cache_clear()
        assert np.array_equal(classes.char_flags(), computed)
        assert path.stat().st_size == N_CODE_POINTS

        path.unlink()  # a write that fails midway leaves no partial file behind
        classes.char_flags.cache_clear()
        with monkeypatch.context() as m:
            m.setattr(classes.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("full")))
            assert np.array_equal(classes.char_flags(), computed)
        assert list(path.parent.iterdir()) == []

        blocked = tmp_path / "file"
        blocked.write_text("not a directory")
        monkeypatch.setenv("NUMBA_CACHE_DIR", str(blocked))
        classes.char_flags.cache_clear()
        assert np.array_equal(classes.char_flags(), computed)
    finally:
        classes.char_flags.cache_clear()
