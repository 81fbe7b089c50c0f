"""Special tokens in the kernels: cut out of the text before pre-tokenization, longest first.

Matching bytes equals `regex`'s matching of the alternation of the tokens sorted longest first
on the decoded text: in valid UTF-8 a token's encoding can only match at character boundaries.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from .. import kernel_cache  # noqa: F401  (first: keys the cached kernels, see kernel_cache)
from ..kernel_args import array_at
from .classes import byte_mask, load8


class Specials(NamedTuple):
    """Special tokens: their UTF-8 bytes end to end, longest first, with offsets, an id for
    each in that order, and which bytes can start one."""

    data: np.ndarray  # uint8
    offsets: np.ndarray  # int64
    ids: np.ndarray  # int32
    first_bytes: np.ndarray  # bool[256]
    first_byte: int  # the byte every one of them starts with (e.g. "<"), or -1


SPECIALS_ITEMS = 9  # values of a `Specials` in `kernel_args.PackedArrays`


@njit(inline="always")
def specials_at(values, k):
    """The `Specials` packed at values[k:k + SPECIALS_ITEMS] (`kernel_args.PackedArrays`)."""
    return Specials(array_at(values, k, np.uint8), array_at(values, k + 2, np.int64),
                    array_at(values, k + 4, np.int32), array_at(values, k + 6, np.bool_),
                    values[k + 8])


def make_specials(tokens_and_ids) -> Specials:
    """`Specials` from (token str, id) pairs."""
    ordered = sorted(tokens_and_ids, key=lambda item: len(item[0].encode("utf-8")), reverse=True)
    encoded = [token.encode("utf-8") for token, _ in ordered]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    first = np.zeros(256, dtype=np.bool_)
    for e in encoded:
        first[e[0]] = True
    shared = {e[0] for e in encoded}
    return Specials(np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets,
                    np.array([i for _, i in ordered], dtype=np.int32), first,
                    shared.pop() if len(shared) == 1 else -1)


_ONES = np.uint64(0x0101010101010101)
_HIGH = np.uint64(0x8080808080808080)
_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)


@njit(cache=True, nogil=True, _nrt=False)
def _skip_to_byte(buf, i, end, byte):
    """The first i' >= i such that buf[i'] may be `byte`: 64 bytes at a time (a vector compare,
    `byte_mask`), then eight (a SWAR zero-byte test, exact: no false negatives). Texts hold
    special tokens rarely: over web_5M's 5 MB, 0.43 ms against 1.15 with the eight-byte loop."""
    while i + 64 <= end:
        found = byte_mask(buf, i, byte)
        if found:
            return i + np.int64(trailing_zeros(found))
        i += 64
    pattern = _ONES * np.uint64(byte)
    while i + 8 <= end:
        x = load8(buf, i) ^ pattern  # a zero byte where buf holds `byte`
        if ~(((x & _LOW7) + _LOW7) | x | _LOW7) != 0:
            return i
        i += 8
    return i


@njit(cache=True, nogil=True, _nrt=False)
def next_special(buf, i, end, specials):
    """(where, which): the first special-token occurrence in buf[i:end], the longest at that
    place, as an index into `specials`; or (end, -1)."""
    offsets = specials.offsets
    n_tokens = offsets.shape[0] - 1
    if n_tokens == 0:
        return end, -1
    while i < end:
        if specials.first_byte >= 0:
            i = _skip_to_byte(buf, i, end, specials.first_byte)
            if i >= end:
                break
        if specials.first_bytes[buf[i]]:
            for t in range(n_tokens):
                lo = offsets[t]
                length = offsets[t + 1] - lo
                if i + length > end:
                    continue
                same = True
                for m in range(length):
                    if buf[i + m] != specials.data[lo + m]:
                        same = False
                        break
                if same:
                    return i, t
        i += 1
    return end, -1
