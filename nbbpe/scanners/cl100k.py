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
from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros

from .. import kernel_cache  # noqa: F401  (first: keys the cached kernels, see kernel_cache)
from . import classes
from .classes import MIN_ASCII, ascii_prefix, char_flags, entry_at, every_code_point, run_end
from .spans import scan_segments

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
    check_ascii_entries(table, LETTER, NUMBER, SPACE, CONTRACTION_SHIFT, CONTRACTION_LETTERS)
    table.setflags(write=False)
    return table


def check_ascii_entries(table, letter, number, space, shift, letters) -> None:
    """The block scanners hard-code what `regex` makes of ASCII: A-Z and a-z letters, 0-9
    numbers, \\t \\n \\v \\f \\r and U+0020 whitespace, everything else other, and a
    contraction letter matching only itself in either case. Check `table[:128]` says so
    (`letter` may be a pair of bits: upper-case letters get the first, lower-case the second)."""
    upper, lower = letter if isinstance(letter, tuple) else (letter, letter)
    expected = np.zeros(128, dtype=np.int64)
    expected[ord("A"):ord("Z") + 1] = upper
    expected[ord("a"):ord("z") + 1] = lower
    expected[ord("0"):ord("9") + 1] = number
    expected[[9, 10, 11, 12, 13, 32]] = space
    for code, c in enumerate(letters, 1):
        expected[[ord(c), ord(c.upper())]] |= code << shift
    mask = upper | lower | number | space | (0xFF << shift)
    if not np.array_equal(table[:128].astype(np.int64) & mask, expected):
        raise RuntimeError("regex classifies ASCII differently from what the block scanners assume")


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
            t, n = entry_at(buf, table, j)
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
def whitespace_run(buf, table, i, j, stop, space):
    """The whitespace run of cl100k's and o200k's last rules, whose first character is buf[i:j]
    (`table` entries with bit `space` are whitespace): (its end, where its last character starts,
    the end of its last \\r or \\n or -1)."""
    b = buf[i]
    last = i
    newline_end = j if b == _CR or b == _LF else -1
    while j < stop:
        b = buf[j]
        if b < 0x80:
            if table[b] & space == 0:
                break
            last = j
            j += 1
            if b == _CR or b == _LF:
                newline_end = j
        else:
            u, m = entry_at(buf, table, j)
            if u & space == 0:
                break
            last = j
            j += m
    return j, last, newline_end


@njit(cache=True, nogil=True, _nrt=False)
def cl100k_pretoken_end(buf, table, i, stop):
    """The end of the pre-token starting at buf[i], in the text buf[:stop] (valid UTF-8);
    `table` is `class_table()`."""
    b = buf[i]
    if b == _APOSTROPHE and i + 1 < stop:  # rule 1
        t, n = entry_at(buf, table, i + 1)
        first = t >> CONTRACTION_SHIFT
        j = i + 1 + n
        if first != 0 and first <= _T:  # s d m t
            return j
        if (first == _L or first == _V or first == _R) and j < stop:
            t, n = entry_at(buf, table, j)
            second = t >> CONTRACTION_SHIFT
            if (first == _L and second == _L) or (first != _L and second == _E):
                return j + n  # ll ve re
    t, n = entry_at(buf, table, i)
    j = i + n
    if t & LETTER:  # rule 2
        return run_end(buf, table, j, stop, LETTER)
    if t & NUMBER:  # rule 4
        for _ in range(2):
            if j >= stop:
                break
            u, m = entry_at(buf, table, j)
            if u & NUMBER == 0:
                break
            j += m
        return j
    # An other character or whitespace: what follows decides.
    after = 0
    m = 0
    if j < stop:
        after, m = entry_at(buf, table, j)
        if after & LETTER and b != _CR and b != _LF:  # rule 3
            return run_end(buf, table, j + m, stop, LETTER)
    if t & SPACE == 0:  # rule 5, an other character
        return _others_end(buf, table, j, stop)
    if b == _SPACE_BYTE and j < stop and after & CLASS_BITS == 0:  # rule 5, a space first
        return _others_end(buf, table, j + m, stop)
    # Rule 6: whitespace.
    j, last, newline_end = whitespace_run(buf, table, i, j, stop, SPACE)
    if j == stop:
        return j  # 6a
    if newline_end >= 0:
        return newline_end  # 6b
    if last > i:
        return last  # 6c
    return j  # 6d


@njit(cache=True, nogil=True, _nrt=False)
def _suffix_length(buf, q):
    """3 if buf[q:q + 3] is `'ll`, `'ve` or `'re`, 2 if buf[q:q + 2] is `'s`, `'d`, `'m` or `'t`
    (ASCII, either case; buf[q] is an apostrophe), else 0. Reads buf[q + 2] in every case."""
    s = buf[q + 1] | 0x20
    t = buf[q + 2] | 0x20
    if s == 115 or s == 100 or s == 109 or s == 116:  # s d m t
        return 2
    if (s == 108 and t == 108) or (s == 118 and t == 101) or (s == 114 and t == 101):
        return 3  # ll ve re
    return 0


@njit(cache=True, nogil=True, _nrt=False)
def _runs_after(run, first):
    """(covered, after): for each run of consecutive bits of `run` holding bits of `first`,
    `covered` has its bits from the lowest of those to the run's end, `after` the bit just past
    its end (none if that is bit 64). One addition: each such run carries out at its end."""
    carried = run + first
    return (run & ~carried) | first, carried & ~run


@njit(cache=True, nogil=True, _nrt=False)
def _after_newline_starts(spaces, newlines, begun):
    """Rule 6 after a newline (`\\r` or `\\n`): a run of `spaces` (whitespace other than \\r\\n)
    right after one starts a pre-token if its whitespace run has no newline after it (else it is
    inside the `\\s*[\\r\\n]` match that ends at that newline), or if its first bit is in `begun`
    (a pre-token begins there anyway: right after the newlines that rule 5 took)."""
    one = np.uint64(1)
    heads = spaces & (newlines << one)
    _, after = _runs_after(spaces, heads)
    bad = after & newlines  # the run ends at a newline: its head is inside a 6b match
    while bad:
        d = np.uint64(trailing_zeros(bad))
        bad &= bad - one
        below = heads & ((one << d) - one)
        heads &= ~(one << (np.uint64(63) - np.uint64(leading_zeros(below))))
    return heads | (begun & spaces)


@njit(cache=True, nogil=True, _nrt=False)
def _before_trailing_whitespace(starts, whitespace, n):
    """`starts` less those inside a whitespace run that reaches bit n - 1 (bits of `whitespace`
    from n on are 0): bytes from n on decide how such a run is cut (another newline, the end of
    the text for `\\s++$`, a non-ASCII space)."""
    top = np.uint64(64 - n)
    if (whitespace << top) >> np.uint64(63) == 0:
        return starts
    first = np.uint64(n) - np.uint64(leading_zeros(~(whitespace << top)))  # where the run starts
    return starts & ((np.uint64(2) << first) - np.uint64(1))


@njit(cache=True, nogil=True, _nrt=False)
def _digit_starts(numbers):
    """Where runs of one to three numbers start: each run of `numbers` cut in threes from its
    start (bit 0, a pre-token start, counts as one)."""
    one = np.uint64(1)
    starts = numbers & ~(numbers << one)
    long = numbers & (numbers << one) & (numbers << np.uint64(2)) & (numbers << np.uint64(3))
    cut = (starts << np.uint64(3)) & long
    while cut:  # runs of four or more numbers: one more cut each step
        starts |= cut
        cut = (cut << np.uint64(3)) & long
    return starts


@njit(cache=True, nogil=True, _nrt=False)
def cl100k_block_boundaries(buf, table, p, stop):
    """Where pre-tokens start in buf[p + 1:p + 62], as bits 1..61 of a uint64, for a pre-token
    starting at p in a text that ends at `stop`; the caller ensures p + 64 <= len(buf) (bytes
    from `stop` on count as not ASCII: `classes.past_the_end`). `table` is not read
    (`class_table()` checks that ASCII's classes are the ones assumed here).

    Only the starts that ASCII decides are given: with buf[p:p + n] ASCII (n = 64 for a block of
    ASCII, else where the first non-ASCII character, or the end of the text, is), those at bits
    1..n - 3, less those inside a whitespace run that reaches bit n - 1 (what follows decides how
    such a run is cut: another newline, the end of the text for `\\s++$`, a non-ASCII space). 0
    if none is left (n < 4, a block of whitespace or of one word, ...): the caller then scans one
    pre-token.

    The rules above as bit masks over the bytes (bit k for buf[p + k]; L letters, N numbers,
    W whitespace other than \\r\\n, C \\r or \\n, O other, B U+0020). Pre-tokens start at k where
    - k is L, k - 1 is not L, and k - 1 is neither W (the last whitespace character, always a
      start, joins the letters by rule 3) nor a lone O that starts a pre-token (k - 2 not O, not
      B; a lone O at k - 1 after B went to B by rule 5);
    - k is N, and starts a run of numbers or is 3, 6, ... numbers into one (rule 4);
    - k is O, k - 1 is not O (others run on, rule 5) and not B (rule 5 took it with the B);
    - k is C and k - 1 is L or N (after O, a C joins the others by rule 5's `[\\r\\n]*`; after W
      or C it is in the same whitespace pre-token);
    - k is W and k - 1 is not whitespace (a run starts), or k + 1 is not (its last character,
      rule 6c), or k - 1 is C and either the W run from k ends outside whitespace (6b ended at
      that C) or the C run before it followed an O (rule 5 took those Cs);
    - k ends a contraction that starts at such a place (and nowhere inside it).
    So bit k depends on bytes k - 2..k + 1, on the two after an apostrophe before it, on where
    runs of numbers and whitespace start, and on how whitespace runs end: bytes below n for the
    bits given. Bytes before p are never read: that p starts a pre-token stands in for them (an
    O at p joins the letters after it, numbers from p are cut in threes from p).
    """
    n, upper, lower, numbers, whitespace, blanks, newlines, apostrophes, _ = ascii_prefix(buf, p,
                                                                                        stop)
    if n < MIN_ASCII:
        return np.uint64(0)  # the caller scans one pre-token at a time
    letters = upper | lower
    one = np.uint64(1)
    two = np.uint64(2)
    decidable = (one << np.uint64(n - 2)) - one  # bits 0..n - 3
    others = ~(letters | numbers | whitespace)
    spaces = whitespace & ~newlines
    # Rule 5's `[\r\n]*+`: the newlines right after others, and where they end.
    taken, after_taken = _runs_after(newlines, newlines & (others << one))
    lone_other = (others << one) & ~(others << two) & ~(blanks << two)
    starts = (one
              | (letters & ~(letters << one) & ~(spaces << one) & ~lone_other)
              | _digit_starts(numbers)
              | (others & ~(others << one) & ~(blanks << one))
              | (newlines & ~(whitespace << one) & ~(others << one))
              | (spaces & (~(whitespace << one) | ~(whitespace >> one)))
              | _after_newline_starts(spaces, newlines, after_taken))
    starts &= ~taken
    candidates = apostrophes & starts & decidable
    while candidates:  # rule 1, at an apostrophe that starts a pre-token
        k = np.uint64(trailing_zeros(candidates))
        candidates &= candidates - one
        length = np.uint64(_suffix_length(buf, p + np.int64(k)))
        if length:
            starts &= ~(((one << (length - one)) - one) << (k + one))
            if k + length < np.uint64(64):
                starts |= one << (k + length)
    return _before_trailing_whitespace(starts, whitespace, n) & decidable & ~one


@njit(cache=True, nogil=True)
def cl100k_spans(buf, table, seg_starts, seg_ends, starts, ends):
    """`spans.scan_segments` with the cl100k scanners."""
    return scan_segments(cl100k_pretoken_end, cl100k_block_boundaries, buf, table, seg_starts,
                         seg_ends, starts, ends)
