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

from .classes import LETTER, NUMBER, SPACE, char_flags
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
    table.setflags(write=False)
    return table


@njit(inline="always")
def _class_at(buf, table, i):
    """(class, length in bytes) of the character at buf[i] (valid UTF-8)."""
    b = np.int64(buf[i])
    if b < 0x80:
        return table[b], 1
    if b < 0xE0:
        return table[((b & 0x1F) << 6) | (np.int64(buf[i + 1]) & 0x3F)], 2
    if b < 0xF0:
        return table[((b & 0x0F) << 12) | ((np.int64(buf[i + 1]) & 0x3F) << 6)
                     | (np.int64(buf[i + 2]) & 0x3F)], 3
    return table[((b & 0x07) << 18) | ((np.int64(buf[i + 1]) & 0x3F) << 12)
                 | ((np.int64(buf[i + 2]) & 0x3F) << 6) | (np.int64(buf[i + 3]) & 0x3F)], 4


@njit(cache=True, nogil=True)
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
    c, n = _class_at(buf, table, i)
    j = i + n
    if c == SPACE_CLASS and b == _SPACE_BYTE and j < stop:
        after, n = _class_at(buf, table, j)
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
                d, n = _class_at(buf, table, j)
                if d != c:
                    break
                j += n
        return j
    last = i  # where the whitespace run's last character starts
    while j < stop:
        d, n = _class_at(buf, table, j)
        if d != SPACE_CLASS:
            break
        last = j
        j += n
    if j < stop and last > i:
        return last  # \s+(?!\S) gives its last character to what follows
    return j  # the whole run at the end of the text (\s+(?!\S)), or one character (\s+)


@njit(cache=True, nogil=True)
def gpt2_spans(buf, table, seg_starts, seg_ends, starts, ends):
    """`spans.scan_segments` with the GPT-2 scanner."""
    return scan_segments(gpt2_pretoken_end, buf, table, seg_starts, seg_ends, starts, ends)
