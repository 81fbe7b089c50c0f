"""o200k_base's pre-tokenizer pattern (GPT-4o) as a compiled scanner.

    [^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
    |[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
    |\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+

Call UPPER = [\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}] and LOWER = [\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]: they
share Lm, Lo and combining marks M ("both" characters). A word `UPPER*LOWER+` (or failing that
`UPPER+LOWER*`) starting at s ends, with A the maximal run of UPPER characters from s:

    W1. if the character after A is LOWER (an Ll), at the end of the LOWER run from there;
    W2. else if A holds a "both" character, right after the last one (UPPER* backtracks to
        it, and LOWER+ takes that one character: what follows it is Lu/Lt or not LOWER);
    W3. else if A is not empty (only Lu/Lt), at the end of A (the second alternative);
    W4. else there is no word at s.

The alternatives, tried in order at the start i of each pre-token, reduce to these rules:

1. A letter at i starts a word at i (W1-W3 always give one).
2. A combining mark at i is in [^\\r\\n\\p{L}\\p{N}], so the optional prefix takes it first:
   the word at i + 1 by W1 or W2 if there is one; else (the prefix backtracks, before the second
   alternative is tried) the word at i, which is the mark alone by W2.
3. Any other character that is not a number, `\\r` or `\\n` (whitespace, punctuation, ...)
   joins the word right after it, if there is one (W1-W3).
   A word of rules 1-3 takes a contraction suffix `'s 't 're 've 'm 'll 'd` right after it,
   matched case-insensitively by `regex`'s simple case folding (the sets come from `regex`:
   today S/s, T/t, ... plus U+017F LATIN SMALL LETTER LONG S for s).
4. A number starts a run of one to three numbers.
5. A character that is not whitespace, letter or number (marks included), or a U+0020 space
   followed by one, starts the maximal run of those, followed by any run of `\\r`, `\\n`, `/`.
6. Otherwise the character is whitespace; let the maximal whitespace run be [i, j):
   a. if it holds a `\\r` or `\\n`, up to and including the last one (`\\s*[\\r\\n]+` backtracks
      from j to the last `[\\r\\n]`), even at the end of the text;
   b. else if it reaches the end of the text, all of it (`\\s+(?!\\S)`);
   c. else if it has two or more characters, all but the last (`\\s+(?!\\S)`);
   d. else its one character (`\\s+`).

Every character starts a non-empty match (a letter or mark by 1-2, a number by 4, another
non-whitespace character by 5, whitespace by 6), so pre-tokens tile the text.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from .. import kernel_cache  # noqa: F401  (first: keys the cached kernels, see kernel_cache)
from . import classes
from .cl100k import (_after_newline_starts, _before_trailing_whitespace, _digit_starts,
                     _runs_after, _suffix_length, check_ascii_entries, contraction_codes,
                     whitespace_run)
from .classes import MIN_ASCII, ascii_prefix, char_flags, entry_at, run_end
from .spans import scan_segments

# Bits of `class_table()`: the classes in the low byte ...
IN_UPPER = 1  # [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
IN_LOWER = 2  # [\p{Ll}\p{Lm}\p{Lo}\p{M}]
MARK = 4  # \p{M}: not a letter, so in [^\r\n\p{L}\p{N}] and [^\s\p{L}\p{N}]
NUMBER = 8  # \p{N}
SPACE = 16  # \s
OTHER = 32  # [^\s\p{L}\p{N}] (marks included)
# ... and in the high byte which contraction letter the code point matches case-insensitively.
CONTRACTION_SHIFT = 8
CONTRACTION_LETTERS = "stmdrvle"  # code k + 1 for CONTRACTION_LETTERS[k]; 0 for none
_S, _T, _M, _D, _R, _V, _L, _E = range(1, 9)

_APOSTROPHE = 39
_SPACE_BYTE = 32
_SLASH = 47
_CR = 13
_LF = 10


@functools.cache
def class_table() -> np.ndarray:
    """The o200k entry of every code point (uint16, read-only): class bits from
    `classes.char_flags()`, contraction letter in the high byte."""
    flags = char_flags().astype(np.uint16)
    both = classes.MODIFIER_OR_OTHER_LETTER | classes.MARK
    table = np.where(flags & (classes.UPPER | both), IN_UPPER, 0).astype(np.uint16)
    table |= np.where(flags & (classes.LOWER | both), IN_LOWER, 0).astype(np.uint16)
    table |= np.where(flags & classes.MARK, MARK, 0).astype(np.uint16)
    table |= np.where(flags & classes.NUMBER, NUMBER, 0).astype(np.uint16)
    table |= np.where(flags & classes.SPACE, SPACE, 0).astype(np.uint16)
    table |= np.where(flags & (classes.LETTER | classes.NUMBER | classes.SPACE), 0,
                      OTHER).astype(np.uint16)
    table |= contraction_codes(CONTRACTION_LETTERS).astype(np.uint16) << CONTRACTION_SHIFT
    check_ascii_entries(table, (IN_UPPER, IN_LOWER), NUMBER, SPACE, CONTRACTION_SHIFT,
                        CONTRACTION_LETTERS)
    table.setflags(write=False)
    return table


@njit(cache=True, nogil=True, _nrt=False)
def _word_end(buf, table, s, stop, upper_only):
    """The end of the word at s by W1, W2 or (if `upper_only`) W3; -1 if there is none."""
    j = s
    both_end = -1  # the end of the last "both" character of A
    t = table[0]
    n = 0
    while j < stop:  # A, the run of UPPER characters
        b = buf[j]
        if b < 0x80:
            t = table[b]
            n = 1
        else:
            t, n = entry_at(buf, table, j)
        if t & IN_UPPER == 0:
            break
        j += n
        if t & IN_LOWER:
            both_end = j
    if j < stop and t & IN_LOWER:  # W1 (t is the character after A)
        return run_end(buf, table, j + n, stop, IN_LOWER)
    if both_end >= 0:  # W2
        return both_end
    if upper_only and j > s:  # W3
        return j
    return -1


@njit(cache=True, nogil=True, _nrt=False)
def _others_end(buf, table, j, stop):
    """Rule 5 from j: the rest of `[^\\s\\p{L}\\p{N}]+`, then `[\\r\\n/]*`."""
    j = run_end(buf, table, j, stop, OTHER)
    while j < stop and (buf[j] == _CR or buf[j] == _LF or buf[j] == _SLASH):
        j += 1
    return j


@njit(cache=True, nogil=True, _nrt=False)
def _contraction_end(buf, table, j, stop):
    """j, or the end of `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at j."""
    if j + 1 < stop and buf[j] == _APOSTROPHE:
        t, n = entry_at(buf, table, j + 1)
        first = t >> CONTRACTION_SHIFT
        k = j + 1 + n
        if first != 0 and first <= _D:  # s t m d
            return k
        if first != 0 and first <= _L and k < stop:  # r v l
            t, n = entry_at(buf, table, k)
            second = t >> CONTRACTION_SHIFT
            if (first == _L and second == _L) or (first != _L and second == _E):
                return k + n  # re ve ll
    return j


# _nrt=False: without it Numba increfs and decrefs `buf` and `table` (atomic operations) for
# every pre-token, because the inlined helpers copy them; that halves the speed. The scanner
# never allocates, so it needs no reference counting.
@njit(cache=True, nogil=True, _nrt=False)
def o200k_pretoken_end(buf, table, i, stop):
    """The end of the pre-token starting at buf[i], in the text buf[:stop] (valid UTF-8);
    `table` is `class_table()`."""
    b = buf[i]
    t, n = entry_at(buf, table, i)
    j = i + n
    if t & (IN_UPPER | IN_LOWER) and t & MARK == 0:  # rule 1
        return _contraction_end(buf, table, _word_end(buf, table, i, stop, True), stop)
    if t & NUMBER == 0 and b != _CR and b != _LF:  # rules 2 and 3: a word after the prefix
        e = _word_end(buf, table, j, stop, t & MARK == 0)
        if e < 0 and t & MARK:
            e = j  # rule 2: the mark alone
        if e >= 0:
            return _contraction_end(buf, table, e, stop)
    if t & NUMBER:  # rule 4
        for _ in range(2):
            if j >= stop:
                break
            u, m = entry_at(buf, table, j)
            if u & NUMBER == 0:
                break
            j += m
        return j
    if t & SPACE == 0:  # rule 5 (t is OTHER: no letter, mark, number or whitespace gets here)
        return _others_end(buf, table, j, stop)
    if b == _SPACE_BYTE and j < stop:  # rule 5, a space first (a mark after it went to rule 3)
        u, m = entry_at(buf, table, j)
        if u & OTHER:
            return _others_end(buf, table, j + m, stop)
    # Rule 6: whitespace.
    j, last, newline_end = whitespace_run(buf, table, i, j, stop, SPACE)
    if newline_end >= 0:
        return newline_end  # 6a
    if j == stop:
        return j  # 6b
    if last > i:
        return last  # 6c
    return j  # 6d


@njit(cache=True, nogil=True, _nrt=False)
def o200k_block_boundaries(buf, table, p, stop):
    """Where pre-tokens start in buf[p + 1:p + 62], as bits 1..61 of a uint64, for a pre-token
    starting at p in a text that ends at `stop`; the caller ensures p + 64 <= len(buf) (bytes
    from `stop` on count as not ASCII: `classes.past_the_end`). As
    `cl100k.cl100k_block_boundaries`, only the starts that ASCII decides: with buf[p:p + n]
    ASCII, those at bits 1..n - 3 less those inside a whitespace run that reaches bit n - 1; 0
    if none is left.

    In ASCII, UPPER is A-Z and LOWER a-z, so a word is a run of upper-case letters then one of
    lower-case letters (W1, W3), and the rules become bit masks over the bytes (bit k for
    buf[p + k]; L letters, N numbers, W whitespace other than \\r\\n, C \\r or \\n, O other,
    B U+0020), the same as cl100k's (see there), with these differences:
    - rule 5's tail `[\\r\\n/]*` is the rest of the run of C and `/` from the first C after
      the others: no pre-token starts in it, one starts right after it, and its `/`s do not
      count as O for what follows (so an O after the tail starts one, a lone O after it joins
      the letters after it);
    - a word also starts at an upper-case letter after a lower-case one;
    - a contraction suffix right after a letter joins that word (no pre-token starts in it,
      one starts after it) unless that letter ends a suffix itself; an apostrophe anywhere else
      is an O like any other.
    The suffix makes bit k depend on bytes up to k + 2, hence bits up to n - 3 only.
    """
    n, upper, lower, numbers, whitespace, blanks, newlines, apostrophes, slashes = (
        ascii_prefix(buf, p, stop))
    if n < MIN_ASCII:
        return np.uint64(0)  # the caller scans one pre-token at a time
    one = np.uint64(1)
    two = np.uint64(2)
    decidable = (one << np.uint64(n - 2)) - one  # bits 0..n - 3
    letters = upper | lower
    others = ~(letters | numbers | whitespace)
    spaces = whitespace & ~newlines
    # Rule 5's `[\r\n/]*`: from the first newline after others on, and where it ends.
    taken, after_taken = _runs_after(newlines | slashes, newlines & (others << one))
    others_run = others & ~taken  # the others that rule 5's `[^\s\p{L}\p{N}]+` may take
    lone_other = (others_run << one) & ~(others_run << two) & ~(blanks << two)
    starts = (one
              | (letters & ~(letters << one) & ~(spaces << one) & ~lone_other)
              | (upper & (lower << one))
              | _digit_starts(numbers)
              | (others & ~(others_run << one) & ~(blanks << one))
              | (newlines & ~(whitespace << one) & ~(others << one))
              | (spaces & (~(whitespace << one) | ~(whitespace >> one)))
              | _after_newline_starts(spaces, newlines, after_taken))
    starts = (starts & ~taken) | after_taken
    candidates = apostrophes & (letters << one) & decidable
    suffix_end = np.uint64(64)
    while candidates:  # a contraction suffix after a word
        k = np.uint64(trailing_zeros(candidates))
        candidates &= candidates - one
        if k == suffix_end:
            continue  # the letter before ends a suffix, not a word
        length = np.uint64(_suffix_length(buf, p + np.int64(k)))
        if length:
            starts &= ~(((one << length) - one) << k)
            suffix_end = k + length
            if suffix_end < np.uint64(64):
                starts |= one << suffix_end
    return _before_trailing_whitespace(starts, whitespace, n) & decidable & ~one


@njit(cache=True, nogil=True)
def o200k_spans(buf, table, seg_starts, seg_ends, starts, ends):
    """`spans.scan_segments` with the o200k scanners."""
    return scan_segments(o200k_pretoken_end, o200k_block_boundaries, buf, table, seg_starts,
                         seg_ends, starts, ends)
