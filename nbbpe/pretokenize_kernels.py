"""Counting pre-tokens in one compiled pass, for training: scan, cut out special tokens, count.

`count_documents` (one cached kernel per scanner family, see `COUNTERS`) walks each document of
a batch (UTF-8 bytes end to end, with where each ends): the stretches between special-token
occurrences, the pre-tokens of each a window at a time (`scanners.spans.scan_window`), and adds
each window's pre-tokens to an open-addressing table keyed by their bytes. A chunk goes from
bytes to unique pre-tokens with counts without a Python object per pre-token; tables from
several threads or machines combine with `merge_counts`.

The table: 2**bits slots, open addressing, at most half full; slot s is slots[2s] = key,
slots[2s+1] = meta = (word id + 1) << 4 | length code (0 for an empty slot). A word of up to 8
bytes is its own key (its bytes packed, length code = its length: "!" and "!\\x00" share a key),
so finding it touches one slot and nothing else; a longer word's key is a hash (length code
_LONG), and its bytes are compared in `arena` at word_offsets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

from .corpus import check_errors_policy, check_utf8
from .kernel_cache import announce_compiling, cached
from .merge import grow
from .patterns import validate_special_tokens
from .scanners import cl100k, gpt2, o200k
from .scanners.cl100k import cl100k_block_boundaries, cl100k_pretoken_end
from .scanners.classes import load_upto8
from .scanners.gpt2 import gpt2_block_boundaries, gpt2_pretoken_end
from .scanners.o200k import o200k_block_boundaries, o200k_pretoken_end
from .scanners.specials import make_specials, next_special
from .scanners.spans import WINDOW, scan_window

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: Fibonacci hashing into slots
_LONG = np.uint64(15)  # length code of words longer than 8 bytes, keyed by a hash
_CODE_MASK = np.uint64(15)


class PretokenCounts(NamedTuple):
    """Unique pre-tokens with their counts: word w is word_bytes[word_offsets[w]:word_offsets[w+1]]
    (UTF-8) and occurs counts[w] times. Words appear in order of first occurrence."""

    word_bytes: np.ndarray  # uint8
    word_offsets: np.ndarray  # int64, one more than the number of words
    counts: np.ndarray  # int64

    def to_dict(self) -> dict[bytes, int]:
        """{word bytes: count}."""
        data = self.word_bytes.tobytes()
        offsets = self.word_offsets.tolist()
        return {data[a:b]: n for a, b, n in zip(offsets[:-1], offsets[1:], self.counts.tolist())}

    @classmethod
    def from_dict(cls, counts: dict[bytes, int]) -> PretokenCounts:
        """The table of {word bytes: count}, its words in the dict's order."""
        words = list(counts)
        offsets = np.zeros(len(words) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, words), dtype=np.int64, count=len(words)), out=offsets[1:])
        return cls(np.frombuffer(b"".join(words), dtype=np.uint8).copy(), offsets,
                   np.fromiter(counts.values(), dtype=np.int64, count=len(words)))


# --- the table ----------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _rehash(slots, bits):
    """The entries of `slots` in a table of 2**bits slots."""
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


@njit(cache=True, nogil=True)
def _reserve(slots, bits, word_offsets, counts, arena, n_words, more_words, more_bytes):
    """The table grown to take `more_words` new words of `more_bytes` bytes.

    Growing before a window keeps the insertion loop free of reassigned arrays, which Numba
    would otherwise reload (and count references to) on every pre-token.
    """
    while 2 * (n_words + more_words) > (1 << bits):
        bits += 1
    if (2 << bits) != slots.shape[0]:
        slots = _rehash(slots, bits)
    if n_words + more_words + 1 > counts.shape[0]:
        word_offsets = grow(word_offsets, n_words + more_words + 1)
        counts = grow(counts, n_words + more_words + 1)
    if word_offsets[n_words] + more_bytes > arena.shape[0]:
        arena = grow(arena, word_offsets[n_words] + more_bytes)
    return slots, bits, word_offsets, counts, arena


@njit(cache=True, nogil=True, _nrt=False)
def _add_spans(src, first_start, ends, weights, n_spans, slots, bits, word_offsets, counts,
               arena, n_words):
    """Add weights[t] to the count of word src[ends[t - 1]:ends[t]] (the first starts at
    first_start) for t < n_spans; return the new number of words. The table must have room."""
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    start = first_start
    for t in range(n_spans):
        end = ends[t]
        length = end - start
        # The key: a word of up to 8 bytes packed little-endian, else a hash of its 8-byte
        # chunks. One 8-byte load per chunk, masked to the word.
        key = np.uint64(0)
        i = start
        while True:
            chunk = load_upto8(src, i, end)
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
        else:
            lo = word_offsets[n_words]
            for m in range(length):
                arena[lo + m] = src[start + m]
            word_offsets[n_words + 1] = lo + length
            counts[n_words] = weights[t]
            slots[2 * s] = key
            slots[2 * s + 1] = (np.uint64(n_words + 1) << np.uint64(4)) | code
            n_words += 1
        start = end
    return n_words


# --- counting a batch ---------------------------------------------------------------------------


@njit(inline="always")  # into each family's kernel, as `spans.scan_window`
def count_documents(scanner, block_scanner, buf, table, doc_ends, specials,
                    slots, bits, word_offsets, counts, arena, n_words):
    """Count the pre-tokens of every document of `buf` (document d ends at doc_ends[d], each a
    text of its own; special tokens cut out, never counted) into the table; return it."""
    ends = np.empty(WINDOW, dtype=np.int64)
    ones = np.empty(WINDOW, dtype=np.int64)  # np.ones would compile an overload of its own
    for t in range(WINDOW):
        ones[t] = 1
    i = np.int64(0)
    for d in range(doc_ends.shape[0]):
        end = doc_ends[d]
        while i < end:
            stop, which = next_special(buf, i, end, specials)
            while i < stop:
                n = scan_window(scanner, block_scanner, buf, table, i, stop, ends)
                slots, bits, word_offsets, counts, arena = _reserve(
                    slots, bits, word_offsets, counts, arena, n_words, n, ends[n - 1] - i)
                n_words = _add_spans(buf, i, ends, ones, n, slots, bits, word_offsets, counts,
                                     arena, n_words)
                i = ends[n - 1]
            if which >= 0:
                i = stop + specials.offsets[which + 1] - specials.offsets[which]
    return slots, bits, word_offsets, counts, arena, n_words


@njit(cache=True, nogil=True)
def _count_words(word_bytes, offsets, word_counts, slots, bits, word_offsets, counts, arena,
                 n_words):
    """Add a table of unique words with counts into the table."""
    n = offsets.shape[0] - 1
    slots, bits, word_offsets, counts, arena = _reserve(
        slots, bits, word_offsets, counts, arena, n_words, n, offsets[n] - offsets[0])
    n_words = _add_spans(word_bytes, offsets[0], offsets[1:], word_counts, n,
                         slots, bits, word_offsets, counts, arena, n_words)
    return slots, bits, word_offsets, counts, arena, n_words


@njit(cache=True, nogil=True)
def count_gpt2(buf, table, doc_ends, specials, slots, bits, word_offsets, counts, arena, n_words):
    """`count_documents` with GPT-2's scanner."""
    return count_documents(gpt2_pretoken_end, gpt2_block_boundaries, buf, table, doc_ends,
                           specials, slots, bits, word_offsets, counts, arena, n_words)


@njit(cache=True, nogil=True)
def count_cl100k(buf, table, doc_ends, specials, slots, bits, word_offsets, counts, arena,
                 n_words):
    """`count_documents` with cl100k's scanner."""
    return count_documents(cl100k_pretoken_end, cl100k_block_boundaries, buf, table, doc_ends, specials,
                           slots, bits, word_offsets, counts, arena, n_words)


@njit(cache=True, nogil=True)
def count_o200k(buf, table, doc_ends, specials, slots, bits, word_offsets, counts, arena,
                n_words):
    """`count_documents` with o200k's scanner."""
    return count_documents(o200k_pretoken_end, o200k_block_boundaries, buf, table, doc_ends, specials,
                           slots, bits, word_offsets, counts, arena, n_words)


COUNTERS = {  # scanner family -> (its class table, its counting kernel)
    "gpt2": (gpt2.class_table, count_gpt2),
    "cl100k": (cl100k.class_table, count_cl100k),
    "o200k": (o200k.class_table, count_o200k),
}


def counter_is_compiled(family: str) -> bool:
    """Whether the family's counting kernel is in Numba's cache (else it compiles on first use)."""
    return cached(COUNTERS[family][1])


class PretokenCounter:
    """Counts the pre-tokens of batches of UTF-8 documents into one table, for one scanner
    family ("gpt2", "cl100k", "o200k"). A thread keeps one counter for all its batches (`add`),
    then sends `result()`; tables combine with `merge_counts` (or `add_counts`)."""

    def __init__(self, family: str = "gpt2", special_tokens: Sequence[str] = (),
                 errors: str = "strict"):
        check_errors_policy(errors)
        self.errors = errors
        class_table, self._kernel = COUNTERS[family]
        self._table = class_table()
        if not cached(self._kernel):
            announce_compiling()
        self._specials = make_specials((t, k) for k, t in
                                       enumerate(validate_special_tokens(special_tokens)))
        self._bits = 12
        self._slots = np.zeros(2 << self._bits, dtype=np.uint64)
        self._word_offsets = np.zeros(1 << 11, dtype=np.int64)
        self._counts = np.empty(1 << 11, dtype=np.int64)
        self._arena = np.empty(1 << 14, dtype=np.uint8)
        self._n_words = 0

    def _state(self):
        return (self._slots, self._bits, self._word_offsets, self._counts, self._arena,
                self._n_words)

    def _set_state(self, state) -> None:
        (self._slots, self._bits, self._word_offsets, self._counts, self._arena,
         self._n_words) = state

    def add(self, buf, doc_ends=None, *, place=None, offset_base: int | None = None) -> None:
        """Count the pre-tokens of `buf` (UTF-8 bytes; documents ending at `doc_ends`, default
        one; special tokens cut out, never counted). Invalid UTF-8 follows the policy; `place`
        (offset -> str) names where it is in the error, and `offset_base` is buf's offset in
        its file, if it is one."""
        buf = as_uint8(buf)
        doc_ends = (np.array([len(buf)], dtype=np.int64) if doc_ends is None
                    else np.ascontiguousarray(doc_ends, dtype=np.int64))
        if place is None:
            def place(offset):
                return f"buffer byte {offset}"
        buf, doc_ends = check_utf8(buf, self.errors, place, doc_ends, offset_base)
        self._set_state(self._kernel(as_uint8(buf), self._table, doc_ends, self._specials,
                                     *self._state()))

    def add_counts(self, table: PretokenCounts) -> None:
        """Add a table of unique words with counts (e.g. another counter's result)."""
        word_bytes, offsets, counts = table
        self._set_state(_count_words(as_uint8(word_bytes),
                                     np.ascontiguousarray(offsets, dtype=np.int64),
                                     np.ascontiguousarray(counts, dtype=np.int64),
                                     *self._state()))

    def __len__(self) -> int:
        return self._n_words

    def result(self) -> PretokenCounts:
        """The unique words with counts so far, in order of first occurrence (copies)."""
        n = self._n_words
        offsets = self._word_offsets[: n + 1].copy()
        return PretokenCounts(self._arena[: offsets[-1]].copy(), offsets, self._counts[:n].copy())


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


def count_pretokens(buf, family: str = "gpt2", special_tokens: Sequence[str] = (),
                    errors: str = "strict") -> PretokenCounts:
    """The unique pre-tokens of one UTF-8 buffer with their counts, special tokens cut out.

    Equals `Counter(findall)` over `special_token_regex(special_tokens).split(text)` of the
    decoded text, keyed by UTF-8 bytes.
    """
    counter = PretokenCounter(family, special_tokens, errors)
    counter.add(buf)
    return counter.result()


# Tables of at most this many words in all are merged in a dict: a small first run, counted with
# `regex` (`sources.SMALL_SOURCE`), then compiles no counting kernel to merge its workers' tables
# (~3.5 s), and at this size a dict takes milliseconds.
MERGE_IN_A_DICT_UP_TO = 100_000


def merge_counts(tables: Iterable[PretokenCounts]) -> PretokenCounts:
    """One table with the summed counts of several (e.g. from different threads).

    Words come in order of first appearance across the tables in the order given.
    """
    tables = [table for table in tables if len(table.counts)]
    if len(tables) == 1:  # e.g. one unit of work, counted by one of the threads: nothing to add
        return tables[0]
    if sum(len(table.counts) for table in tables) <= MERGE_IN_A_DICT_UP_TO:
        merged: dict[bytes, int] = {}
        for table in tables:
            for word, count in table.to_dict().items():
                merged[word] = merged.get(word, 0) + count
        return PretokenCounts.from_dict(merged)
    counter = PretokenCounter()
    for table in tables:
        counter.add_counts(table)
    return counter.result()
