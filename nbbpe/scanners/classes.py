"""The character-class table every compiled scanner shares, and UTF-8 helpers for the kernels.

`char_flags()` gives each code point 0..0x10FFFF a byte of flags, one bit per Unicode property
the supported patterns mention (`\\p{Lu}`/`\\p{Lt}`, `\\p{Ll}`, `\\p{Lm}`/`\\p{Lo}`, `\\p{M}`,
`\\p{N}`, `\\s`). The table is derived by running the installed `regex` module's own classes over
a string of every code point, so the scanners agree with `regex` by construction.

Scanners read UTF-8 that `first_invalid_utf8` has already checked: `entry_at` decodes one code
point without validating it and looks it up in a scanner's table. ASCII never reaches the decoder.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import threading
from typing import NamedTuple

import numpy as np
import regex
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

from .. import kernel_cache  # noqa: F401  (first: keys the cached kernels, see kernel_cache)

N_CODE_POINTS = 0x110000
_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)

# Flag bits of `char_flags()`.
UPPER = 1  # \p{Lu} or \p{Lt}
LOWER = 2  # \p{Ll}
MODIFIER_OR_OTHER_LETTER = 4  # \p{Lm} or \p{Lo}
MARK = 8  # \p{M}
NUMBER = 16  # \p{N}
SPACE = 32  # \s
LETTER = UPPER | LOWER | MODIFIER_OR_OTHER_LETTER  # \p{L}

_FLAG_PATTERNS = (
    (UPPER, r"[\p{Lu}\p{Lt}]+"),
    (LOWER, r"\p{Ll}+"),
    (MODIFIER_OR_OTHER_LETTER, r"[\p{Lm}\p{Lo}]+"),
    (MARK, r"\p{M}+"),
    (NUMBER, r"\p{N}+"),
    (SPACE, r"\s+"),
)


def every_code_point() -> str:
    """A string of every code point 0..0x10FFFF in order (surrogates included)."""
    return np.arange(N_CODE_POINTS, dtype=np.uint32).tobytes().decode("utf-32-le", "surrogatepass")


@functools.cache
def char_flags() -> np.ndarray:
    """The flags of every code point 0..0x10FFFF (uint8, read-only), from the installed `regex`.

    Computing them takes ~0.1 s (`regex` over 1.1M code points, 7 times), which every process
    paid on its first encode; so they are kept in a file beside Numba's cache of this module
    (`NUMBA_CACHE_DIR`, else `__pycache__` here) named after the `regex` version and this
    module's source, and read from it (~1 ms) when it is there and whole. Where it cannot be
    written, they are computed each time, as before. Cached per process too."""
    path = _char_flags_path()
    try:
        flags = np.fromfile(path, dtype=np.uint8)
        if flags.shape == (N_CODE_POINTS,):
            flags.setflags(write=False)
            return flags
    except (OSError, ValueError):
        pass
    flags = compute_char_flags()
    partial = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:  # a whole file or none: written aside, then renamed
        os.makedirs(os.path.dirname(path), exist_ok=True)
        flags.tofile(partial)
        os.replace(partial, path)
    except OSError:  # e.g. read-only, or the disk full: leave nothing half-written behind
        try:
            os.remove(partial)
        except OSError:
            pass
    return flags


def _char_flags_path() -> str:
    """Where `char_flags` keeps its table: a name of the `regex` version and this file's source."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "classes.py"), "rb") as f:
        key = hashlib.sha256(regex.__version__.encode() + b"\0" + f.read()).hexdigest()[:16]
    base = os.environ.get("NUMBA_CACHE_DIR")
    directory = os.path.join(base, "nbbpe") if base else os.path.join(here, "__pycache__")
    return os.path.join(directory, f"char_flags-{key}.u8")


def compute_char_flags() -> np.ndarray:
    """`char_flags()` computed with `regex` (uint8, read-only).

    Checks what the scanners rely on: \\p{L} is exactly the union of the three letter flags,
    and letters, numbers and whitespace never overlap."""
    text = every_code_point()
    flags = np.zeros(N_CODE_POINTS, dtype=np.uint8)
    for bit, pattern in _FLAG_PATTERNS:
        for match in regex.finditer(pattern, text):
            flags[match.start() : match.end()] |= bit
    letters = np.zeros(N_CODE_POINTS, dtype=bool)
    for match in regex.finditer(r"\p{L}+", text):
        letters[match.start() : match.end()] = True
    if not np.array_equal(letters, (flags & LETTER) != 0):
        raise RuntimeError("regex's \\p{L} is not the union of Lu, Lt, Ll, Lm and Lo")
    kinds = ((flags & LETTER) != 0).astype(int) + ((flags & NUMBER) != 0) + ((flags & SPACE) != 0)
    if (kinds > 1).any():
        bad = int(np.argmax(kinds > 1))
        raise RuntimeError(f"regex puts U+{bad:04X} in more than one of \\p{{L}}, \\p{{N}}, \\s")
    flags.setflags(write=False)
    return flags


def _bytes_and_index(buf, i) -> bool:
    """Whether an intrinsic reading buf[i:] applies to these argument types."""
    return (isinstance(buf, types.Array) and buf.dtype == types.uint8 and buf.layout == "C"
            and isinstance(i, types.Integer))


def item_pointer(context, builder, signature, args):
    """LLVM, for an intrinsic whose first two arguments are an array and an index: the address
    of array[index], with no wraparound or bounds check."""
    arraytype, indextype = signature.args[:2]
    data = context.make_array(arraytype)(context, builder, args[0])
    index = context.cast(builder, args[1], indextype, types.intp)
    return cgutils.get_item_pointer(context, builder, arraytype, data, [index])


@intrinsic
def uindex(typingctx, i):
    """Index `i` (never negative) as an unsigned integer: Numba adds a negative-index wraparound
    (three instructions) to every signed index, which the encode loop and the merges would pay
    at nearly every array access. An intrinsic, not an `inline="always"` function, which Numba
    inlines by copying the callee's IR into each of its many call sites on a first run."""
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return context.cast(builder, args[0], signature.args[0], types.uint64)

    return types.uint64(i), codegen


def _load_at(context, builder, signature, args, lltype):
    """LLVM: an unaligned load of an `lltype` value at buf[i] (args: buf, i)."""
    address = item_pointer(context, builder, signature, args)
    return builder.load(builder.bitcast(address, lltype.as_pointer()), align=1)


@intrinsic
def load8(typingctx, buf, i):
    """Bytes buf[i:i + 8] as a little-endian uint64: one unaligned 8-byte load (the caller
    ensures the bytes exist). Written as eight indexed byte reads, each read also checks for a
    negative index (Numba's wraparound), which keeps LLVM from merging them: 8 loads and 16
    more instructions."""
    if not _bytes_and_index(buf, i):
        return None

    def codegen(context, builder, signature, args):
        word = _load_at(context, builder, signature, args, ir.IntType(64))
        if sys.byteorder == "big":
            word = builder.bswap(word)
        return word

    return types.uint64(buf, i), codegen


@njit(inline="always")
def load_upto8(buf, i, end):
    """Bytes buf[i:min(end, i + 8)] as a little-endian uint64, zero padded: one load, or byte
    by byte where buf ends before i + 8."""
    if i + 8 <= buf.shape[0]:
        word = load8(buf, i)
        if end - i < 8:
            word &= _ALL_ONES >> np.uint64(64 - 8 * (end - i))
        return word
    word = np.uint64(0)
    for m in range(min(end, i + 8) - 1, i - 1, -1):
        word = (word << np.uint64(8)) | np.uint64(buf[m])
    return word


class AsciiBlock(NamedTuple):
    """Which of 64 bytes are what, as masks (bit k for byte k): `ascii_block`'s result."""

    non_ascii: np.uint64  # 0x80 and above
    upper: np.uint64  # A-Z
    lower: np.uint64  # a-z
    digits: np.uint64  # 0-9
    whitespace: np.uint64  # \t \n \v \f \r and U+0020: ASCII's \s
    blanks: np.uint64  # U+0020
    newlines: np.uint64  # \r and \n
    apostrophes: np.uint64
    slashes: np.uint64


# (lowest byte, highest byte) of each `AsciiBlock` mask but the first and the last two.
_RANGES = ((0x41, 0x5A), (0x61, 0x7A), (0x30, 0x39))


@intrinsic
def ascii_block(typingctx, buf, p):
    """The `AsciiBlock` masks of bytes buf[p:p + 64] (the caller ensures they exist), as a
    9-tuple of uint64. One 64-byte vector load and a vector compare per class, each turned
    into a mask (on x86, `pcmpgtb` and `pmovmskb`): a block is classified in a few dozen
    instructions instead of a few hundred for eight bytes at a time (SWAR). The block
    scanners use the masks they need; LLVM drops the others."""
    if not _bytes_and_index(buf, p):
        return None

    def codegen(context, builder, signature, args):
        byte = ir.IntType(8)
        vector = ir.VectorType(byte, 64)
        x = _load_at(context, builder, signature, args, vector)

        def splat(value):
            return ir.Constant(vector, [ir.Constant(byte, value)] * 64)

        def in_range(v, lo, hi):  # lo <= v <= hi, as one unsigned compare
            return builder.icmp_unsigned("<=", builder.sub(v, splat(lo)), splat(hi - lo))

        def equal(value):
            return builder.icmp_unsigned("==", x, splat(value))

        def mask(condition):  # <64 x i1> -> i64
            return builder.bitcast(condition, ir.IntType(64))

        blank = equal(0x20)
        masks = [mask(builder.icmp_unsigned(">=", x, splat(0x80)))]
        masks += [mask(in_range(x, lo, hi)) for lo, hi in _RANGES]
        masks += [mask(builder.or_(in_range(x, 0x09, 0x0D), blank)), mask(blank),
                  mask(builder.or_(equal(0x0A), equal(0x0D))), mask(equal(0x27)),
                  mask(equal(0x2F))]
        return context.make_tuple(builder, signature.return_type, masks)

    return types.UniTuple(types.uint64, 9)(buf, p), codegen


@intrinsic
def byte_mask(typingctx, buf, p, byte):
    """Which of the bytes buf[p:p + 64] (the caller ensures they exist) equal `byte`, as a
    uint64 (bit k for byte k): one 64-byte vector load and compare, as in `ascii_block`."""
    if not (_bytes_and_index(buf, p) and isinstance(byte, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        i8 = ir.IntType(8)
        vector = ir.VectorType(i8, 64)
        x = _load_at(context, builder, signature, args, vector)
        value = builder.trunc(context.cast(builder, args[2], signature.args[2], types.int64), i8)
        one = builder.insert_element(ir.Constant(vector, None), value, ir.Constant(ir.IntType(32), 0))
        splat = builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), 64), [0] * 64))
        return builder.bitcast(builder.icmp_unsigned("==", x, splat), ir.IntType(64))

    return types.uint64(buf, p, byte), codegen


# A block whose first n < MIN_ASCII bytes are ASCII (and in the text) decides no pre-token start
# at bits 1..n - 3 (the block scanners then return 0: the caller scans one pre-token at a time).
MIN_ASCII = 4


@njit(inline="always")
def past_the_end(non_ascii, p, stop):
    """`ascii_block`'s `non_ascii` mask of buf[p:p + 64] with the bytes from `stop` on (past the
    end of the text: the next document, a special token) set too. A block scanner then decides
    only the starts that the text's own bytes decide, as before a non-ASCII character, so a
    text's last 64 bytes are cut a block at a time too when the buffer goes on after it."""
    if stop - p < 64:
        non_ascii |= ~((np.uint64(1) << np.uint64(stop - p)) - np.uint64(1))
    return non_ascii


@njit(inline="always")
def ascii_prefix(buf, p, stop):
    """(n, masks): `ascii_block`'s masks of buf[p:p + 64] but `non_ascii`, where the block is
    ASCII up to byte n (64 for all of it) and the bytes from n on have no class bit (they count
    as "other"): what the block scanners cut, each deciding only the starts that bytes below n
    decide. The text ends at `stop`: the bytes from there on count as not ASCII."""
    non_ascii, upper, lower, digits, whitespace, blanks, newlines, apostrophes, slashes = (
        ascii_block(buf, p))
    non_ascii = past_the_end(non_ascii, p, stop)
    n = np.int64(64)
    if non_ascii:
        n = np.int64(trailing_zeros(non_ascii))
        keep = (np.uint64(1) << np.uint64(n)) - np.uint64(1)
        upper &= keep
        lower &= keep
        digits &= keep
        whitespace &= keep
        blanks &= keep
        newlines &= keep
        apostrophes &= keep
        slashes &= keep
    return n, upper, lower, digits, whitespace, blanks, newlines, apostrophes, slashes


@njit(cache=True, nogil=True, _nrt=False)
def entry_at(buf, table, i):
    """(entry, length in bytes) of the character at buf[i] (valid UTF-8) in `table`, a scanner's
    table indexed by code point (ASCII without decoding)."""
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
def run_end(buf, table, j, stop, bit):
    """The end of the run of characters whose `table` entry has `bit` set, from buf[j] (ASCII
    without decoding)."""
    while j < stop:
        b = buf[j]
        if b < 0x80:
            if table[b] & bit == 0:
                break
            j += 1
        else:
            t, n = entry_at(buf, table, j)
            if t & bit == 0:
                break
            j += n
    return j


_HIGH_BITS = np.uint64(0x8080808080808080)


@njit(cache=True, nogil=True, _nrt=False)
def first_invalid_utf8(buf, start, end):
    """The offset of the first byte of buf[start:end] that is not valid UTF-8, or -1.

    "Invalid" as Python's decoder means it: no overlong forms, surrogates or code points past
    U+10FFFF, no sequence cut off at `end`. ASCII is skipped eight bytes at a time.
    """
    i = start
    while i < end:
        if i + 8 <= end:
            word = load8(buf, i)
            if word & _HIGH_BITS == 0:
                i += 8
                continue
        b = buf[i]
        if b < 0x80:
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
        if i + length > end:
            return i
        second = buf[i + 1]
        if second < lo or second > hi:
            return i
        for k in range(2, length):
            if buf[i + k] & 0xC0 != 0x80:
                return i
        i += length
    return -1
