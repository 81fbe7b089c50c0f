"""GPT-2's pre-tokenizer pattern as a compiled scanner.

    '(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

Every code point falls in one of four classes (letter \\p{L}, number \\p{N}, whitespace \\s,
other), and the pattern reduces to these rules, tried at the start of each pre-token:

1. `'` followed by s, d, m, t, ll, ve or re (lowercase ASCII only) is a contraction;
2. a letter, number or other character starts a maximal run of its class;
3. a space U+0020 followed by a letter, number or other character joins the run that follows;
4. otherwise a run of whitespace: at the end of the text, all of it; before a non-space, all but
   its last character if it has two or more (`\\s+(?!\\S)` backtracks one character, which then
   starts the next pre-token: by rule 3 if it is U+0020, else alone by `\\s+`), or its one
   character alone (`\\s+`).

Pre-tokens therefore tile the text. tiktoken's spelling of the pattern (`r50k_pat_str`, with
possessive quantifiers and `\\s++$|\\s+(?!\\S)|\\s`) finds the same pre-tokens.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from .. import kernel_cache  # noqa: F401  (first: keys the cached kernels, see kernel_cache)
from .classes import (LETTER, MIN_ASCII, NUMBER, SPACE, ascii_block, char_flags, entry_at,
                      past_the_end)
from .spans import scan_segments

OTHER_CLASS, LETTER_CLASS, NUMBER_CLASS, SPACE_CLASS = 0, 1, 2, 3
_APOSTROPHE = 39
_SPACE_BYTE = 32


@functools.cache
def class_table() -> np.ndarray:
    """The GPT-2 class of every code point (uint8, read-only): from `classes.char_flags()`."""
    by_flags = np.full(256, OTHER_CLASS, dtype=np.uint8)
    for f in range(256):
        if f & LETTER:
            by_flags[f] = LETTER_CLASS
        elif f & NUMBER:
            by_flags[f] = NUMBER_CLASS
        elif f & SPACE:
            by_flags[f] = SPACE_CLASS
    table = by_flags[char_flags()]
    _check_ascii_classes(table)
    table.setflags(write=False)
    return table


@njit(cache=True, nogil=True, _nrt=False)
def gpt2_pretoken_end(buf, table, i, stop):
    """The end of the pre-token starting at buf[i], in the text buf[:stop] (valid UTF-8);
    `table` is `class_table()`."""
    b = buf[i]
    if b == _APOSTROPHE and i + 1 < stop:  # '(?:[sdmt]|ll|ve|re), lowercase only
        s = buf[i + 1]
        if s == 115 or s == 100 or s == 109 or s == 116:  # s d m t
            return i + 2
        if i + 2 < stop:
            t = buf[i + 2]
            if (s == 108 and t == 108) or (s == 118 and t == 101) or (s == 114 and t == 101):
                return i + 3  # ll ve re
    c, n = entry_at(buf, table, i)
    j = i + n
    if c == SPACE_CLASS and b == _SPACE_BYTE and j < stop:
        after, n = entry_at(buf, table, j)
        if after != SPACE_CLASS:  # ' ?\p{L}+' and the like: the space joins the run after it
            c = after
            j += n
    if c != SPACE_CLASS:
        while j < stop:
            b = buf[j]
            if b < 0x80:  # ASCII needs no decoding
                if table[b] != c:
                    break
                j += 1
            else:
                d, n = entry_at(buf, table, j)
                if d != c:
                    break
                j += n
        return j
    last = i  # where the whitespace run's last character starts
    while j < stop:
        d, n = entry_at(buf, table, j)
        if d != SPACE_CLASS:
            break
        last = j
        j += n
    if j < stop and last > i:
        return last  # \s+(?!\S) gives its last character to what follows
    return j  # the whole run at the end of the text (\s+(?!\S)), or one character (\s+)


def _check_ascii_classes(table) -> None:
    """The block scanner hard-codes GPT-2's classes of ASCII; check them against `regex`'s."""
    expected = np.full(128, OTHER_CLASS, dtype=np.uint8)
    for lo, hi, c in ((0x41, 0x5A, LETTER_CLASS), (0x61, 0x7A, LETTER_CLASS),
                      (0x30, 0x39, NUMBER_CLASS), (0x09, 0x0D, SPACE_CLASS),
                      (0x20, 0x20, SPACE_CLASS)):
        expected[lo : hi + 1] = c
    if not np.array_equal(table[:128], expected):
        raise RuntimeError("regex classifies ASCII differently from what gpt2_block_boundaries assumes")


@njit(cache=True, nogil=True, _nrt=False)
def gpt2_block_boundaries(buf, table, p, stop):
    """Where pre-tokens start in buf[p + 1:p + 62], as bits 1..61 of a uint64, for a pre-token
    starting at p in a text that ends at `stop`; the caller ensures p + 64 <= len(buf) (the
    bytes from `stop` on are read but count as not ASCII: see `classes.past_the_end`).

    Only the starts that ASCII decides: with buf[p:p + n] ASCII (n = 64 for a block of ASCII,
    else where the first non-ASCII character, or the end of the text, is), those at bits
    1..n - 3; 0 if there are none (the caller then scans one pre-token). The rules above as bit masks over the bytes
    (bit k for buf[p + k]), so a block of ASCII text is cut without a branch per pre-token: a
    pre-token starts at k where
    - k is whitespace and k - 1 is not (a run starts), or k + 1 is not (the run's last character
      goes to what follows, rule 4);
    - k is not whitespace, its class differs from k - 1's, and k - 1 is not a space (rule 3);
    - or where a contraction that starts at such a place ends (and nowhere inside it).
    So bit k depends on bytes k - 1..k + 2: bytes below n for the bits given.
    """
    non_ascii, upper, lower, numbers, spaces, blanks, _, apostrophes, _ = ascii_block(buf, p)
    non_ascii = past_the_end(non_ascii, p, stop)
    one = np.uint64(1)
    n = np.uint64(64)
    if non_ascii:  # unlike cl100k's and o200k's rules, these need no masking beyond n
        n = np.uint64(trailing_zeros(non_ascii))
        if n < MIN_ASCII:
            return np.uint64(0)
    decidable = (one << (n - np.uint64(2))) - one  # bits 0..n - 3
    letters = upper | lower
    others = ~(letters | numbers | spaces)
    changed = ((letters ^ (letters << one)) | (numbers ^ (numbers << one))
               | (spaces ^ (spaces << one)) | (others ^ (others << one)))
    starts = ((spaces & (~(spaces << one) | ~(spaces >> one)))
              | (~spaces & changed & ~(blanks << one)) | one)
    candidates = apostrophes & starts & decidable
    while candidates:
        k = trailing_zeros(candidates)
        candidates &= candidates - one
        s = buf[p + k + 1]
        t = buf[p + k + 2]
        if s == 115 or s == 100 or s == 109 or s == 116:  # 's 'd 'm 't
            length = 2
        elif (s == 108 and t == 108) or (s == 118 and t == 101) or (s == 114 and t == 101):
            length = 3
        else:
            continue
        inside = ((one << np.uint64(length - 1)) - one) << np.uint64(k + 1)
        starts &= ~inside
        if k + length < 64:
            starts |= one << np.uint64(k + length)
    return starts & decidable & ~one


@njit(cache=True, nogil=True)
def gpt2_spans(buf, table, seg_starts, seg_ends, starts, ends):
    """`spans.scan_segments` with the GPT-2 scanner."""
    return scan_segments(gpt2_pretoken_end, gpt2_block_boundaries, buf, table, seg_starts,
                         seg_ends, starts, ends)

