"""Compiled GPT-2 pre-tokenization: Numba kernels over UTF-8 bytes.

Exactly the pre-tokens `regex` finds with `pretokenize.GPT2_PATTERN`,

    '(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

found by a hand-written scanner instead of a backtracking matcher. Every code point falls in
exactly one of four classes (letter \\p{L}, number \\p{N}, whitespace \\s, other), taken from the
installed `regex` itself (`char_classes`), and the pattern reduces to these rules, tried at the
start of each pre-token:

1. `'` followed by s, d, m, t, ll, ve or re (lowercase ASCII only) is a contraction;
2. a letter, number or other character starts a maximal run of its class;
3. a space U+0020 followed by a letter, number or other character joins the run that follows;
4. otherwise a run of whitespace: at the end of the text, all of it; before a non-space, all but
   its last character if it has two or more (`\\s+(?!\\S)` backtracks one character, which
   then starts the next pre-token: by rule 3 if it is U+0020, else alone by `\\s+`), or its one
   character alone (`\\s+`).

Pre-tokens therefore tile each stretch of text: pre-token t of a stretch ends where t + 1 starts.

Two passes: `_classify` checks the UTF-8 and writes the class of every byte's character (ASCII
through the first 128 entries of the table, no decoding), then `_scan` applies the rules to the
class bytes. Invalid UTF-8 follows `corpus.py`'s policy: "strict" raises `InvalidUTF8Error`
naming the byte offset; "replace" decodes the buffer with errors="replace" in Python and scans
the re-encoded text, so the result is that of `regex` on the replaced text by construction.

Special tokens are cut out in bytes, longest first at each place: byte matching equals `regex`'s
matching on the decoded text, because in valid UTF-8 a token's encoding can only match at
character boundaries.

Counting (`count_gpt2`, `PretokenCounter`) hashes each pre-token's bytes into an open-addressing
table in the same compiled call that finds them (a window of pre-tokens at a time), so a chunk
goes from bytes to unique pre-tokens with counts without a Python object per pre-token. Tables
from several workers combine with `merge_counts`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import regex
from numba import njit

from .corpus import check_errors_policy, decode_utf8
from .pretokenize import validate_special_tokens

# Code point classes, as stored in `char_classes()`.
OTHER = 0
LETTER = 1
NUMBER = 2
SPACE = 3

_N_CODE_POINTS = 0x110000
_APOSTROPHE = 39
_SPACE_BYTE = 32


# --- character classes --------------------------------------------------------------------------


@functools.cache
def char_classes() -> np.ndarray:
    """The class (OTHER, LETTER, NUMBER or SPACE) of every code point 0..0x10FFFF, as uint8.

    Derived by running `regex`'s own \\p{L}, \\p{N} and \\s over a string of every code point, so
    it agrees with the installed `regex` by construction. Takes about 50 ms; cached per process.
    """
    every_char = np.arange(_N_CODE_POINTS, dtype=np.uint32).tobytes().decode(
        "utf-32-le", "surrogatepass"
    )
    classes = np.zeros(_N_CODE_POINTS, dtype=np.uint8)
    for code, pattern in ((LETTER, r"\p{L}+"), (NUMBER, r"\p{N}+"), (SPACE, r"\s+")):
        for match in regex.finditer(pattern, every_char):
            start, end = match.span()
            if classes[start:end].any():  # the pattern's alternatives rely on disjoint classes
                raise RuntimeError(f"regex puts code points {start:#x}-{end - 1:#x} in two classes")
            classes[start:end] = code
    classes.setflags(write=False)
    return classes


# --- UTF-8 and the class of every byte ----------------------------------------------------------


@njit(cache=True)
def _classify(buf, classes, out):
    """Write the class of each byte's character to `out`; return the first invalid offset or -1.

    Every byte of a multi-byte character gets that character's class, so a run of one class
    never ends inside a character. "Invalid" as Python's decoder means it: no overlong forms,
    surrogates or code points past U+10FFFF, no truncated sequence at the end.
    """
    n = buf.shape[0]
    i = 0
    while i < n:
        b = buf[i]
        if b < 0x80:  # the fast path: ASCII needs no decoding
            out[i] = classes[b]
            i += 1
            continue
        if b < 0xC2:  # a continuation byte, or C0/C1 (always overlong)
            return i
        if b < 0xE0:
            length, lo, hi = 2, 0x80, 0xBF
        elif b < 0xF0:
            length = 3
            lo = 0xA0 if b == 0xE0 else 0x80  # E0 80..9F: overlong
            hi = 0x9F if b == 0xED else 0xBF  # ED A0..BF: surrogates
        elif b < 0xF5:
            length = 4
            lo = 0x90 if b == 0xF0 else 0x80  # F0 80..8F: overlong
            hi = 0x8F if b == 0xF4 else 0xBF  # F4 90..BF: past U+10FFFF
        else:
            return i
        if i + length > n:
            return i
        second = buf[i + 1]
        if second < lo or second > hi:
            return i
        cp = (np.int64(b) & (0x7F >> length)) << 6 | (second & 0x3F)
        for k in range(2, length):
            more = buf[i + k]
            if more & 0xC0 != 0x80:
                return i
            cp = cp << 6 | (more & 0x3F)
        c = classes[cp]
        for k in range(length):
            out[i + k] = c
        i += length
    return -1


def as_uint8(buf) -> np.ndarray:
    """A read-only uint8 array viewing `buf` (bytes, bytearray, memoryview or 1-D uint8 array)."""
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise TypeError(f"expected a 1-D uint8 array, got {buf.dtype} with shape {buf.shape}")
        view = np.ascontiguousarray(buf).view()
    else:
        view = np.frombuffer(buf, dtype=np.uint8)
    # Read-only whatever the source, so each kernel is compiled for one buffer type only.
    view.flags.writeable = False
    return view


def classify_utf8(buf, errors: str = "strict", *, source: str = "buffer", offset: int = 0):
    """(buf, byte classes) with buf valid UTF-8 under the invalid-UTF-8 policy.

    Valid input comes back as is (no copy). Otherwise "strict" raises `InvalidUTF8Error` naming
    the offset (`offset` + position in `buf`) in `source`; "replace" returns the encoding of
    `buf.decode("utf-8", errors="replace")` in place of buf.
    """
    check_errors_policy(errors)
    buf = as_uint8(buf)
    byte_class = np.empty(buf.shape[0], dtype=np.uint8)
    if _classify(buf, char_classes(), byte_class) < 0:
        return buf, byte_class
    text = decode_utf8(buf.tobytes(), errors, source=source, offset=offset)
    buf = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    byte_class = np.empty(buf.shape[0], dtype=np.uint8)
    _classify(buf, char_classes(), byte_class)
    return buf, byte_class


def first_invalid_utf8(buf) -> int:
    """Offset of the first byte of `buf` that is not valid UTF-8, or -1 if all of it is."""
    buf = as_uint8(buf)
    scratch = np.empty(buf.shape[0], dtype=np.uint8)
    return int(_classify(buf, char_classes(), scratch))


# --- the scanner ----------------------------------------------------------------------------------


@njit(cache=True)
def _scan(buf, byte_class, i, end, starts, ends, k, limit):
    """Write the pre-tokens of buf[i:end] to starts/ends from index k on, until `limit` are.

    buf[i] starts a pre-token and `end` ends a stretch of text (the whole text, for the pattern).
    Returns (k, i): the number written and where scanning stopped (a pre-token start, or end).
    One function with no array-taking calls in the loop: Numba would count references per call.
    """
    while i < end and k < limit:
        b = buf[i]
        j = -1
        if b == _APOSTROPHE and i + 1 < end:  # '(?:[sdmt]|ll|ve|re), lowercase only
            s = buf[i + 1]
            if s == 115 or s == 100 or s == 109 or s == 116:  # s d m t
                j = i + 2
            elif i + 2 < end:
                t = buf[i + 2]
                if (s == 108 and t == 108) or (s == 118 and t == 101) or (s == 114 and t == 101):
                    j = i + 3  # ll ve re
        if j < 0:
            c = byte_class[i]
            j = i + 1
            if c == SPACE and b == _SPACE_BYTE and j < end and byte_class[j] != SPACE:
                c = byte_class[j]  # ' ?\p{L}+' etc. with the space: the run after it
                j += 1
            if c != SPACE:
                while j < end and byte_class[j] == c:
                    j += 1
            else:
                last = i  # start of the whitespace run's last character
                while j < end and byte_class[j] == SPACE:
                    if buf[j] & 0xC0 != 0x80:
                        last = j
                    j += 1
                if j < end and last > i:
                    j = last  # \s+(?!\S) gives its last character to what follows
                # else: the whole run, at the end of the text (\s+(?!\S)) or one character (\s+)
        starts[k] = i
        ends[k] = j
        k += 1
        i = j
    return k, i


@njit(cache=True)
def _scan_segments(buf, byte_class, seg_starts, seg_ends, starts, ends):
    """Write the pre-tokens of every segment to starts/ends; return how many there are."""
    k = 0
    limit = starts.shape[0]
    for s in range(seg_starts.shape[0]):
        k, _ = _scan(buf, byte_class, seg_starts[s], seg_ends[s], starts, ends, k, limit)
    return k


# --- special tokens -------------------------------------------------------------------------------


@njit(cache=True)
def _split_at_specials(buf, token_bytes, token_offsets, first_bytes, seg_starts, seg_ends, which):
    """Cut buf at special-token occurrences, leftmost first, the first listed token at a place.

    Tokens come longest first, so that is the longest match. Writes the stretches between
    occurrences into seg_starts/seg_ends and, for each occurrence, its token's index into
    `which`; returns the number of stretches (occurrences + 1).
    """
    n = buf.shape[0]
    n_tokens = token_offsets.shape[0] - 1
    k = 0
    seg_start = 0
    i = 0
    while i < n:
        if not first_bytes[buf[i]]:
            i += 1
            continue
        matched = -1
        for t in range(n_tokens):
            lo = token_offsets[t]
            length = token_offsets[t + 1] - lo
            if i + length > n:
                continue
            same = True
            for m in range(length):
                if buf[i + m] != token_bytes[lo + m]:
                    same = False
                    break
            if same:
                matched = t
                break
        if matched < 0:
            i += 1
            continue
        seg_starts[k] = seg_start
        seg_ends[k] = i
        which[k] = matched
        k += 1
        i += token_offsets[matched + 1] - token_offsets[matched]
        seg_start = i
    seg_starts[k] = seg_start
    seg_ends[k] = n
    return k + 1


class SpecialTokenSplitter:
    """Cuts uint8 buffers at special-token occurrences, as `special_token_regex(...).split`."""

    def __init__(self, special_tokens: Sequence[str] = ()):
        self.special_tokens = validate_special_tokens(special_tokens)
        # Longest first. In bytes rather than characters as `special_token_regex` sorts, which
        # is the same: tokens matching at one place are prefixes of one another.
        by_length = sorted(range(len(self.special_tokens)),
                           key=lambda t: len(self.special_tokens[t].encode("utf-8")), reverse=True)
        self._order = np.array(by_length, dtype=np.int64)
        encoded = [self.special_tokens[t].encode("utf-8") for t in by_length]
        self._token_bytes = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
        self._token_offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        self._token_offsets[1:] = np.cumsum([len(token) for token in encoded], dtype=np.int64)
        self._first_bytes = np.zeros(256, dtype=np.bool_)
        for token in encoded:
            self._first_bytes[token[0]] = True
        self._shortest = min((len(token) for token in encoded), default=1)

    def split(self, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, ends, which) of the stretches of `buf` (valid UTF-8) between occurrences.

        Stretch k is buf[starts[k]:ends[k]] (possibly empty), followed by an occurrence of
        special token `which[k]` (an index into `special_tokens`) except the last stretch;
        `len(which) == len(starts) - 1`.
        """
        buf = as_uint8(buf)
        n = buf.shape[0]
        if not self.special_tokens:
            return (np.zeros(1, np.int64), np.full(1, n, np.int64), np.zeros(0, np.int64))
        most = n // self._shortest + 1
        seg_starts = np.empty(most, dtype=np.int64)
        seg_ends = np.empty(most, dtype=np.int64)
        which = np.empty(most, dtype=np.int64)
        k = _split_at_specials(buf, self._token_bytes, self._token_offsets, self._first_bytes,
                               seg_starts, seg_ends, which)
        return seg_starts[:k].copy(), seg_ends[:k].copy(), self._order[which[: k - 1]]


def split_special_tokens(buf, special_tokens: Sequence[str]):
    """(starts, ends, which) of the stretches of `buf` between special tokens; see
    `SpecialTokenSplitter.split`. The stretches equal `special_token_regex(special_tokens).split`
    of the decoded text."""
    return SpecialTokenSplitter(special_tokens).split(buf)


def scan_gpt2(buf, segments: tuple[np.ndarray, np.ndarray] | None = None):
    """(starts, ends) int64 of the GPT-2 pre-tokens of `buf`, valid UTF-8 with no special tokens.

    Pre-token t is buf[starts[t]:ends[t]]: the matches of `regex.finditer(GPT2_PATTERN, text)`,
    in bytes. With `segments=(seg_starts, seg_ends)` (as from `split_special_tokens`), each
    stretch is scanned as a text of its own, in order. Raises `InvalidUTF8Error` on invalid UTF-8;
    for errors="replace", scan the buffer `classify_utf8(buf, "replace")` returns.
    """
    buf, byte_class = classify_utf8(buf, "strict")
    if segments is None:
        seg_starts = np.zeros(1, np.int64)
        seg_ends = np.full(1, buf.shape[0], np.int64)
    else:
        seg_starts = np.ascontiguousarray(segments[0], dtype=np.int64)
        seg_ends = np.ascontiguousarray(segments[1], dtype=np.int64)
    most = int((seg_ends - seg_starts).sum())  # every pre-token holds at least one byte
    starts = np.empty(most, dtype=np.int64)
    ends = np.empty(most, dtype=np.int64)
    k = _scan_segments(buf, byte_class, seg_starts, seg_ends, starts, ends)
    return starts[:k].copy(), ends[:k].copy()


# --- counting -------------------------------------------------------------------------------------

_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: Fibonacci hashing into slots
_LONG = np.uint64(15)  # length code of words longer than 8 bytes, keyed by a hash
_CODE_MASK = np.uint64(15)
_WINDOW = 4096  # pre-tokens scanned before they are counted: few calls, all still in cache


class PretokenCounts(NamedTuple):
    """Unique pre-tokens with their counts: word w is word_bytes[word_offsets[w]:word_offsets[w+1]]
    (UTF-8) and occurs counts[w] times. Words appear in order of first occurrence."""

    word_bytes: np.ndarray  # uint8
    word_offsets: np.ndarray  # int64, one more than the number of words
    counts: np.ndarray  # int64

    def to_dict(self) -> dict[bytes, int]:
        """{word bytes: count}, the shape `pretokenize.count_pretokens_in_file` returns."""
        data = self.word_bytes.tobytes()
        offsets = self.word_offsets.tolist()
        return {data[a:b]: n for a, b, n in zip(offsets[:-1], offsets[1:], self.counts.tolist())}


@njit(cache=True)
def _grow(array, min_size):
    """A copy of `array` with room for at least `min_size` items (doubling)."""
    out = np.empty(max(min_size, 2 * array.shape[0]), dtype=array.dtype)
    out[: array.shape[0]] = array
    return out


@njit(cache=True)
def _rehash(slots, bits):
    """The entries of `slots` in a table of 2**bits slots (see `_add_spans`)."""
    new = np.zeros(2 << bits, dtype=np.uint64)
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    for old in range(slots.shape[0] // 2):
        meta = slots[2 * old + 1]
        if meta == 0:
            continue
        key = slots[2 * old]
        s = np.int64((key * _GOLDEN) >> shift)
        while new[2 * s + 1] != 0:
            s = (s + 1) & mask
        new[2 * s] = key
        new[2 * s + 1] = meta
    return new


@njit(cache=True)
def _reserve(slots, bits, word_offsets, counts, arena, n_words, more_words, more_bytes):
    """The table (see `_add_spans`) grown to take `more_words` new words of `more_bytes` bytes.

    Growing before a batch keeps the insertion loop free of reassigned arrays, which Numba
    would otherwise reload (and count references to) on every pre-token.
    """
    while 2 * (n_words + more_words) > (1 << bits):
        bits += 1
    if (2 << bits) != slots.shape[0]:
        slots = _rehash(slots, bits)
    if n_words + more_words + 1 > counts.shape[0]:
        word_offsets = _grow(word_offsets, n_words + more_words + 1)
        counts = _grow(counts, n_words + more_words + 1)
    if word_offsets[n_words] + more_bytes > arena.shape[0]:
        arena = _grow(arena, word_offsets[n_words] + more_bytes)
    return slots, bits, word_offsets, counts, arena


@njit(cache=True)
def _add_spans(src, starts, ends, weights, n_spans, slots, bits, word_offsets, counts, arena,
               n_words):
    """Add weights[t] to the count of word src[starts[t]:ends[t]] for t < n_spans; return the
    new number of words. The table must have room for them all (`_reserve`).

    The table: 2**bits slots, open addressing, at most half full; slot s is slots[2s] = key,
    slots[2s+1] = meta = (word id + 1) << 4 | length code (0 for an empty slot). A word of up to
    8 bytes is its own key (its bytes packed, length code = its length: "!" and "!\\x00" share a
    key), so finding it touches one slot and nothing else; a longer word's key is a hash (length
    code _LONG), and its bytes are compared in `arena` at word_offsets.
    """
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    src_size = src.shape[0]
    for t in range(n_spans):
        start = starts[t]
        end = ends[t]
        length = end - start
        # The key: a word of up to 8 bytes packed little-endian, else a hash of its 8-byte
        # chunks. One 8-byte load per chunk (LLVM merges the byte loads), masked to the word.
        key = np.uint64(0)
        i = start
        while True:
            if i + 8 <= src_size:
                chunk = (np.uint64(src[i]) | np.uint64(src[i + 1]) << np.uint64(8)
                         | np.uint64(src[i + 2]) << np.uint64(16)
                         | np.uint64(src[i + 3]) << np.uint64(24)
                         | np.uint64(src[i + 4]) << np.uint64(32)
                         | np.uint64(src[i + 5]) << np.uint64(40)
                         | np.uint64(src[i + 6]) << np.uint64(48)
                         | np.uint64(src[i + 7]) << np.uint64(56))
                if end - i < 8:
                    chunk &= _ALL_ONES >> np.uint64(64 - 8 * (end - i))
            else:  # near the end of src: byte by byte, same value
                chunk = np.uint64(0)
                for m in range(min(end, i + 8) - 1, i - 1, -1):
                    chunk = (chunk << np.uint64(8)) | np.uint64(src[m])
            if length <= 8:
                key = chunk
                break
            key = (key ^ chunk) * _GOLDEN
            key ^= key >> np.uint64(29)
            i += 8
            if i >= end:
                break
        code = np.uint64(length) if length <= 8 else _LONG
        s = np.int64((key * _GOLDEN) >> shift)
        while True:
            meta = slots[2 * s + 1]
            if meta == 0:
                break
            if slots[2 * s] == key and (meta & _CODE_MASK) == code:
                if code != _LONG:
                    break
                w = np.int64(meta >> np.uint64(4)) - 1
                lo = word_offsets[w]
                if word_offsets[w + 1] - lo == length:
                    same = True
                    for m in range(length):
                        if arena[lo + m] != src[start + m]:
                            same = False
                            break
                    if same:
                        break
            s = (s + 1) & mask
        if meta != 0:
            counts[np.int64(meta >> np.uint64(4)) - 1] += weights[t]
            continue
        lo = word_offsets[n_words]
        for m in range(length):
            arena[lo + m] = src[start + m]
        word_offsets[n_words + 1] = lo + length
        counts[n_words] = weights[t]
        slots[2 * s] = key
        slots[2 * s + 1] = (np.uint64(n_words + 1) << np.uint64(4)) | code
        n_words += 1
    return n_words


@njit(cache=True)
def _count_segments(buf, byte_class, seg_starts, seg_ends,
                    slots, bits, word_offsets, counts, arena, n_words):
    """Scan every segment and count its pre-tokens into the table, a window at a time."""
    starts = np.empty(_WINDOW, dtype=np.int64)
    ends = np.empty(_WINDOW, dtype=np.int64)
    ones = np.ones(_WINDOW, dtype=np.int64)
    for s in range(seg_starts.shape[0]):
        i = seg_starts[s]
        end = seg_ends[s]
        while i < end:
            window_start = i
            k, i = _scan(buf, byte_class, i, end, starts, ends, 0, _WINDOW)
            slots, bits, word_offsets, counts, arena = _reserve(
                slots, bits, word_offsets, counts, arena, n_words, k, i - window_start)
            n_words = _add_spans(buf, starts, ends, ones, k,
                                 slots, bits, word_offsets, counts, arena, n_words)
    return slots, bits, word_offsets, counts, arena, n_words


@njit(cache=True)
def _count_words(word_bytes, offsets, word_counts, slots, bits, word_offsets, counts, arena,
                 n_words):
    """Add a table of unique words with counts into the table."""
    n = offsets.shape[0] - 1
    slots, bits, word_offsets, counts, arena = _reserve(
        slots, bits, word_offsets, counts, arena, n_words, n, offsets[n] - offsets[0])
    n_words = _add_spans(word_bytes, offsets[:-1], offsets[1:], word_counts, n,
                         slots, bits, word_offsets, counts, arena, n_words)
    return slots, bits, word_offsets, counts, arena, n_words


class PretokenCounter:
    """Counts GPT-2 pre-tokens of UTF-8 buffers into one table, across many chunks.

    A worker keeps one counter for all its chunks (`add`), then sends `result()`; the parent
    combines the workers' tables with `merge_counts` (or `add_counts`).
    """

    def __init__(self, special_tokens: Sequence[str] = (), errors: str = "strict"):
        check_errors_policy(errors)
        self.errors = errors
        self._splitter = SpecialTokenSplitter(special_tokens)
        self._bits = 12
        self._slots = np.zeros(2 << self._bits, dtype=np.uint64)
        self._word_offsets = np.zeros(1 << 11, dtype=np.int64)
        self._counts = np.empty(1 << 11, dtype=np.int64)
        self._arena = np.empty(1 << 14, dtype=np.uint8)
        self._n_words = 0

    def _table(self):
        return (self._slots, self._bits, self._word_offsets, self._counts, self._arena,
                self._n_words)

    def _set_table(self, table) -> None:
        (self._slots, self._bits, self._word_offsets, self._counts, self._arena,
         self._n_words) = table

    def add(self, buf, *, source: str = "buffer", offset: int = 0) -> None:
        """Count the pre-tokens of `buf` (UTF-8 bytes; special tokens cut out, never counted).

        `source` and `offset` (of buf in it) name the place of invalid UTF-8 in the error.
        """
        buf, byte_class = classify_utf8(buf, self.errors, source=source, offset=offset)
        seg_starts, seg_ends, _ = self._splitter.split(buf)
        self._set_table(_count_segments(buf, byte_class, seg_starts, seg_ends, *self._table()))

    def add_counts(self, table: PretokenCounts) -> None:
        """Add a table of unique words with counts (e.g. another counter's result)."""
        word_bytes, offsets, counts = table
        self._set_table(_count_words(as_uint8(word_bytes),
                                     np.ascontiguousarray(offsets, dtype=np.int64),
                                     np.ascontiguousarray(counts, dtype=np.int64),
                                     *self._table()))

    def __len__(self) -> int:
        return self._n_words

    def result(self) -> PretokenCounts:
        """The unique words with counts so far, in order of first occurrence (copies)."""
        n = self._n_words
        offsets = self._word_offsets[: n + 1].copy()
        return PretokenCounts(self._arena[: offsets[-1]].copy(), offsets, self._counts[:n].copy())


def count_gpt2(buf, special_tokens: Sequence[str] = (), errors: str = "strict") -> PretokenCounts:
    """Count the GPT-2 pre-tokens of one UTF-8 chunk, special tokens cut out, in one pass.

    Equals `Counter(findall)` over `special_token_regex(special_tokens).split(text)` of the
    decoded text, keyed by UTF-8 bytes.
    """
    counter = PretokenCounter(special_tokens, errors)
    counter.add(buf)
    return counter.result()


def merge_counts(tables: Iterable[PretokenCounts]) -> PretokenCounts:
    """One table with the summed counts of several (e.g. from different worker processes).

    Words come in order of first appearance across the tables in the order given.
    """
    counter = PretokenCounter()
    for table in tables:
        counter.add_counts(table)
    return counter.result()
