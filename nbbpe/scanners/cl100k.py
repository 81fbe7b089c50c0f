"""cl100k_base's pre-tokenizer pattern (GPT-4; Llama 3) as a compiled scanner.

    '(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+
    |\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s

Every code point is a letter (\\p{L}; combining marks are *not* letters here), a number (\\p{N}),
whitespace (\\s) or other. The alternatives, tried in order at the start of each pre-token,
reduce to these rules (the first that applies wins):

1. `'` followed by a character matching s, d, m or t case-insensitively, or by two matching
   ll, ve or re, is a contraction. "Case-insensitively" is `regex`'s simple case folding: the
   sets come from `regex` itself (today S/s, plus U+017F LATIN SMALL LETTER LONG S for s).
2. A letter starts a maximal run of letters.
3. One character that is not a letter, number, `\\r` or `\\n` (a space, a tab, U+00A0, a
   punctuation mark, a combining mark, a `'` that rule 1 rejected, ...) joins the letter run
   right after it. It is possessive: if no letter follows, it is not taken back.
4. A number starts a run of one to three numbers (long runs are cut in threes from the left).
5. An other character, or a U+0020 space followed by one, starts the maximal run of others,
   followed by any run of `\\r` and `\\n` (both quantifiers possessive).
6. Otherwise the character is whitespace; let the maximal whitespace run be [i, j):
   a. if it reaches the end of the text, all of it (`\\s++$`);
   b. else if it holds a `\\r` or `\\n`, up to and including the last one (`\\s*[\\r\\n]`
      backtracks from j to the last `[\\r\\n]`);
   c. else if it has two or more characters, all but the last (`\\s+(?!\\S)`), which then
      starts the next pre-token (by rule 3 or 5 if it can, else alone);
   d. else its one character (`\\s`).

Every character starts a non-empty match (a letter by 2, a number by 4, an other character by 5,
whitespace by 6), so pre-tokens tile the text.
"""

from __future__ import annotations

import functools

import numpy as np
import regex
from numba import njit

from . import classes
from .classes import char_flags, every_code_point
from .spans import no_blocks, scan_segments

# Bits of `class_table()`: the class in the low bits ...
LETTER = 1  # \p{L}
NUMBER = 2  # \p{N}
SPACE = 4  # \s
CLASS_BITS = LETTER | NUMBER | SPACE  # none of them: "other", [^\s\p{L}\p{N}]
# ... and in the high nibble which contraction letter the code point matches case-insensitively.
CONTRACTION_SHIFT = 4
CONTRACTION_LETTERS = "sdmtlver"  # code k + 1 for CONTRACTION_LETTERS[k]; 0 for none
_S, _D, _M, _T, _L, _V, _E, _R = range(1, 9)

_APOSTROPHE = 39
_SPACE_BYTE = 32
_CR = 13
_LF = 10


@functools.cache
def case_insensitive_matches(letter: str) -> np.ndarray:
    """The code points `regex` matches with `(?i:letter)` (int64, sorted, read-only)."""
    found = np.array([m.start() for m in regex.finditer(f"(?i:{regex.escape(letter)})",
                                                        every_code_point())], dtype=np.int64)
    found.setflags(write=False)
    return found


def contraction_codes(letters: str) -> np.ndarray:
    """Code k + 1 at the code points matching letters[k] case-insensitively, else 0 (uint8)."""
    codes = np.zeros(classes.N_CODE_POINTS, dtype=np.uint8)
    for code, letter in enumerate(letters, 1):
        members = case_insensitive_matches(letter)
        if codes[members].any():
            raise RuntimeError(f"a code point matches {letter!r} and another contraction letter")
        codes[members] = code
    return codes


@functools.cache
def class_table() -> np.ndarray:
    """The cl100k entry of every code point (uint8, read-only): class bits from
    `classes.char_flags()`, contraction letter in the high nibble."""
    flags = char_flags()
    table = np.where(flags & classes.LETTER, LETTER, 0).astype(np.uint8)
    table |= np.where(flags & classes.NUMBER, NUMBER, 0).astype(np.uint8)
    table |= np.where(flags & classes.SPACE, SPACE, 0).astype(np.uint8)
    table |= contraction_codes(CONTRACTION_LETTERS) << CONTRACTION_SHIFT
    table.setflags(write=False)
    return table


@njit(cache=True, nogil=True, _nrt=False)
def _entry_at(buf, table, i):
    """(table entry, length in bytes) of the character at buf[i] (valid UTF-8)."""
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


@njit(cache=True, nogil=True, _nrt=False)
def _run_end(buf, table, j, stop, bit):
    """The end of the run of characters with `bit` set from buf[j] (ASCII without decoding)."""
    while j < stop:
        b = buf[j]
        if b < 0x80:
            if table[b] & bit == 0:
                break
            j += 1
        else:
            t, n = _entry_at(buf, table, j)
            if t & bit == 0:
                break
            j += n
    return j


@njit(cache=True, nogil=True, _nrt=False)
def _others_end(buf, table, j, stop):
    """Rule 5 from j: the rest of `[^\\s\\p{L}\\p{N}]++`, then `[\\r\\n]*+`."""
    while j < stop:
        b = buf[j]
        if b < 0x80:
            if table[b] & CLASS_BITS != 0:
                break
            j += 1
        else:
            t, n = _entry_at(buf, table, j)
            if t & CLASS_BITS != 0:
                break
            j += n
    while j < stop and (buf[j] == _CR or buf[j] == _LF):
        j += 1
    return j


# _nrt=False: without it Numba increfs and decrefs `buf` and `table` (atomic operations) for
# every pre-token, because the inlined helpers copy them; that halves the speed. The scanner
# never allocates, so it needs no reference counting.
@njit(cache=True, nogil=True, _nrt=False)
def cl100k_pretoken_end(buf, table, i, stop):
    """The end of the pre-token starting at buf[i], in the text buf[:stop] (valid UTF-8);
    `table` is `class_table()`."""
    b = buf[i]
    if b == _APOSTROPHE and i + 1 < stop:  # rule 1
        t, n = _entry_at(buf, table, i + 1)
        first = t >> CONTRACTION_SHIFT
        j = i + 1 + n
        if first != 0 and first <= _T:  # s d m t
            return j
        if (first == _L or first == _V or first == _R) and j < stop:
            t, n = _entry_at(buf, table, j)
            second = t >> CONTRACTION_SHIFT
            if (first == _L and second == _L) or (first != _L and second == _E):
                return j + n  # ll ve re
    t, n = _entry_at(buf, table, i)
    j = i + n
    if t & LETTER:  # rule 2
        return _run_end(buf, table, j, stop, LETTER)
    if t & NUMBER:  # rule 4
        for _ in range(2):
            if j >= stop:
                break
            u, m = _entry_at(buf, table, j)
            if u & NUMBER == 0:
                break
            j += m
        return j
    # An other character or whitespace: what follows decides.
    after = 0
    m = 0
    if j < stop:
        after, m = _entry_at(buf, table, j)
        if after & LETTER and b != _CR and b != _LF:  # rule 3
            return _run_end(buf, table, j + m, stop, LETTER)
    if t & SPACE == 0:  # rule 5, an other character
        return _others_end(buf, table, j, stop)
    if b == _SPACE_BYTE and j < stop and after & CLASS_BITS == 0:  # rule 5, a space first
        return _others_end(buf, table, j + m, stop)
    # Rule 6: whitespace.
    last = i  # where the run's last character starts
    newline_end = j if b == _CR or b == _LF else -1  # the end of its last \r or \n
    while j < stop:
        b = buf[j]
        if b < 0x80:
            if table[b] & SPACE == 0:
                break
            last = j
            j += 1
            if b == _CR or b == _LF:
                newline_end = j
        else:
            u, m = _entry_at(buf, table, j)
            if u & SPACE == 0:
                break
            last = j
            j += m
    if j == stop:
        return j  # 6a
    if newline_end >= 0:
        return newline_end  # 6b
    if last > i:
        return last  # 6c
    return j  # 6d


@njit(cache=True, nogil=True)
def cl100k_spans(buf, table, seg_starts, seg_ends, starts, ends):
    """`spans.scan_segments` with the cl100k scanner (no block scanner yet)."""
    return scan_segments(cl100k_pretoken_end, no_blocks, buf, table, seg_starts, seg_ends,
                         starts, ends)
