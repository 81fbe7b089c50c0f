"""Python str as the UTF-8 bytes the encode kernels read, without slicing them or holding the
GIL to transcode them.

`str.encode` of a slice copies the slice first (and for a str of 2 or 4 bytes a character, scans
it to narrow it), then transcodes it, all holding the GIL, into fresh memory whose pages fault
in: cutting a 4.5 MB text into groups this way took ~4 ms of a ~20 ms encode, while the other
threads of a batch waited for the GIL. And a batch's short texts, each made `bytes` by
`str.encode` and then joined, were copied twice, holding the GIL. Here:

- one long ASCII str is its own UTF-8: its characters are read where CPython holds them
  (`ascii_bytes`, no copy at all);
- any other text, or a list of them, or pieces of them, is copied (ASCII) or transcoded (1, 2 or
  4 bytes a character, as CPython holds them) by a compiled loop that reads each str where it
  lies and releases the GIL (`gather_utf8`), into a buffer the thread keeps (so its pages fault
  in once): a 2-thread batch of TinyStories' documents took 0.87-0.91x the time (web_5M
  0.92x, multi_1M 0.93x) than with `str.encode` and joins; one long text of 5 MB of web text,
  3.1-3.4 ms against 7.3-7.8 for slicing it and `str.encode`;
- and a batch's ASCII texts are not even copied there: `gather_utf8` says where each lies, and
  the kernel reads each document at its own address (`encode.encode_documents`'
  `doc_addresses`).

A batch of many texts has their lengths read (and each checked to be a `str`) by one compiled
loop too (`str_lengths`), not by `isinstance` and `len` of each in Python: 71,782 TinyStories
sentences took a fresh process's 2-thread batch 0.92x the time, one thread's 0.91x.

The loops read CPython's str objects by their layout (`gather_layout_known` checks it on sample
strs first; if it is another, the callers use `str.encode`). This module imports Numba, so the
tokenizer imports it only when a batch or a long text comes (`import nbbpe` does not load
Numba: 0.2 s against 0.5).
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
from numba import njit

from .kernel_cache import announce_compiling, cached  # first: keys the cached kernels
from .kernel_args import (LIST_ITEMS_OFFSET, OB_TYPE_OFFSET, STR_ASCII_BIT, STR_LENGTH_OFFSET,
                          STR_STATE_OFFSET, copy_bytes, data_address, load_word,
                          readonly_array_from)
from .scanners.classes import uindex

# CPython keeps an ASCII str's characters as its UTF-8; `PyUnicode_AsUTF8AndSize` says where.
# (Of a str that is not ASCII it would make a UTF-8 copy and keep it in the str for the str's
# life: `ascii_bytes` asks only of ASCII ones.)
_UTF8_AND_SIZE = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
_UTF8_AND_SIZE.restype = ctypes.c_void_p
_UTF8_AND_SIZE.argtypes = (ctypes.py_object, ctypes.POINTER(ctypes.c_ssize_t))


class _AsciiChars:
    """The characters of an ASCII str where the str holds them, for `np.asarray`: the array
    made holds this object as its `base`, and so the str, as long as any view of it lives."""

    __slots__ = ("text", "__array_interface__")

    def __init__(self, text: str):
        if not text.isascii():
            raise ValueError("ascii_bytes: the str is not ASCII")
        size = ctypes.c_ssize_t()
        address = _UTF8_AND_SIZE(text, ctypes.byref(size))
        if address is None or size.value != len(text):
            raise ValueError("ascii_bytes: CPython did not give the str's characters")
        self.text = text
        self.__array_interface__ = {"data": (address, True), "shape": (size.value,),
                                    "typestr": "|u1", "version": 3}


def ascii_bytes(text: str) -> np.ndarray:
    """The UTF-8 bytes of ASCII `text`, a read-only uint8 array of the str's own memory."""
    return np.asarray(_AsciiChars(text))


@njit(inline="always")
def _units_to_utf8(units, start, end, out, w):
    """UTF-8 of the characters units[start:end] (code points) into out[w:]; return where it
    ends, or -1 at a lone surrogate (which UTF-8 cannot hold: the caller replaces them). Eight
    characters at a time: all ASCII (nearly all of most text), copied at once; else each
    written out on its own (so text of few ASCII characters is not checked for runs of them
    at every character)."""
    i = start
    while i < end:
        stop = end
        if i + 8 <= end:
            either = units[uindex(i)]
            for k in range(1, 8):
                either |= units[uindex(i + k)]
            if either < 0x80:
                for k in range(8):
                    out[uindex(w + k)] = np.uint8(units[uindex(i + k)])
                i += 8
                w += 8
                continue
            stop = i + 8
        while i < stop:
            c = np.uint32(units[uindex(i)])
            i += 1
            if c < 0x80:
                out[uindex(w)] = np.uint8(c)
                w += 1
            elif c < 0x800:
                out[uindex(w)] = np.uint8(0xC0 | (c >> 6))
                out[uindex(w + 1)] = np.uint8(0x80 | (c & 0x3F))
                w += 2
            elif c < 0x10000:
                if c - np.uint32(0xD800) < np.uint32(0x800):  # unsigned: below 0xD800 wraps
                    return -1
                out[uindex(w)] = np.uint8(0xE0 | (c >> 12))
                out[uindex(w + 1)] = np.uint8(0x80 | ((c >> 6) & 0x3F))
                out[uindex(w + 2)] = np.uint8(0x80 | (c & 0x3F))
                w += 3
            else:
                out[uindex(w)] = np.uint8(0xF0 | (c >> 18))
                out[uindex(w + 1)] = np.uint8(0x80 | ((c >> 12) & 0x3F))
                out[uindex(w + 2)] = np.uint8(0x80 | ((c >> 6) & 0x3F))
                out[uindex(w + 3)] = np.uint8(0x80 | (c & 0x3F))
                w += 4
    return w


# Where a compact str's characters start, from its address: right after its struct, which is
# all of an empty str but the terminating 0 (`sys.getsizeof` counts the struct and the
# characters), for an ASCII one (PyASCIIObject) and for another (PyCompactUnicodeObject).
ASCII_DATA_OFFSET = sys.getsizeof("") - 1
COMPACT_DATA_OFFSET = sys.getsizeof("\u0100") - 4  # one character and the 0, 2 bytes each
_STR_KIND_SHIFT = 2  # the state bits: interned (2), kind (3), compact (1), ascii (1)
_STR_COMPACT_BIT = 1 << 5


@njit(cache=True, nogil=True, _nrt=False)
def gather_utf8(texts, n, spans, out, ends, addresses):
    """Write the UTF-8 of n str, the first items of the list at address `texts` (each whole,
    or with `spans`, int64[2n], the characters spans[2k]:spans[2k + 1] of text k), to `out`
    end to end, where each ends to ends[k]; return where the last ends. Or return -1 if one
    holds a lone surrogate, or is not a compact str (a subclass's, or one made by an old C
    API: then the caller makes it the slow way), or a span is out of its bounds; or -2 - the
    room needed (4 bytes a character) if `out` has less. The list and its str must live and
    not change meanwhile: the caller's own, not shared. Reads each str where CPython holds it,
    with no Python call (so no GIL): an ASCII one copied as it is, another transcoded from its
    1, 2 or 4 bytes a character.

    With `addresses` (int64[n]), an ASCII text is not copied: addresses[k] is where text k's
    UTF-8 starts, in the str for an ASCII one, else in `out`; ends[k] and what is returned are
    where each would end if they were end to end, and the room needed is for the others only.
    (For `encode_documents`' `doc_addresses`: a 2-thread batch of TinyStories' documents,
    ASCII, was copied at ~3 GB/s, 1.3-1.6 ms of its threads' 16 ms.)"""
    items = load_word(texts + LIST_ITEMS_OFFSET)
    whole = spans.shape[0] == 0
    located = addresses.shape[0] > 0
    room = np.int64(0)
    for k in range(n):
        text = load_word(items + 8 * k)
        if located and load_word(text + STR_STATE_OFFSET) & STR_ASCII_BIT:
            continue  # read where it is
        if whole:
            room += 4 * load_word(text + STR_LENGTH_OFFSET)
        else:
            room += 4 * (spans[2 * k + 1] - spans[2 * k])
    if room > out.shape[0]:
        return -2 - room
    w = np.int64(0)  # bytes written to `out`
    total = np.int64(0)  # bytes of the texts
    for k in range(n):
        text = load_word(items + 8 * k)
        state = load_word(text + STR_STATE_OFFSET)
        length = load_word(text + STR_LENGTH_OFFSET)
        start = np.int64(0) if whole else spans[2 * k]
        end = length if whole else spans[2 * k + 1]
        if not 0 <= start <= end <= length:
            return -1
        if state & _STR_COMPACT_BIT == 0:  # its characters elsewhere (a subclass's, say)
            return -1
        if state & STR_ASCII_BIT and located:
            addresses[k] = text + ASCII_DATA_OFFSET + start
            total += end - start
        elif state & STR_ASCII_BIT:
            copy_bytes(data_address(out) + w, text + ASCII_DATA_OFFSET + start, end - start)
            w += end - start
            total += end - start
        else:
            at = w
            kind = (state >> _STR_KIND_SHIFT) & 7
            data = text + COMPACT_DATA_OFFSET
            if kind == 1:
                w = _units_to_utf8(readonly_array_from(data, length, np.uint8), start, end, out, w)
            elif kind == 2:
                w = _units_to_utf8(readonly_array_from(data, length, np.uint16), start, end, out,
                                   w)
            else:
                w = _units_to_utf8(readonly_array_from(data, length, np.uint32), start, end, out,
                                   w)
            if w < 0:
                return -1
            if located:
                addresses[k] = data_address(out) + at
            total += w - at
        ends[k] = total
    return total


@njit(cache=True, nogil=True, _nrt=False)
def str_lengths(texts, n, str_type, lengths):
    """The length in characters of each of the first n items of the list at address `texts`
    into lengths[k]; return (their sum, the most UTF-8 bytes they can take), or (-1, -1) at
    the first item that is not a `str` (its type at address `str_type`; a subclass's is not).
    The most bytes a character takes, from how CPython holds the str: 1 if it is ASCII, else
    2, 3 or 4 for 1, 2 or 4 bytes a character (a lone surrogate, 2 or 4, becomes U+FFFD: 3).
    Its loads are independent, so the CPU waits for many items' headers at once: `len` of
    each in Python waited for one at a time."""
    items = load_word(texts + LIST_ITEMS_OFFSET)
    total = np.int64(0)
    most = np.int64(0)
    for k in range(n):
        text = load_word(items + 8 * k)
        if load_word(text + OB_TYPE_OFFSET) != str_type:
            return np.int64(-1), np.int64(-1)
        length = load_word(text + STR_LENGTH_OFFSET)
        lengths[k] = length
        total += length
        state = load_word(text + STR_STATE_OFFSET)
        kind = (state >> _STR_KIND_SHIFT) & 7
        width = 1 if state & STR_ASCII_BIT else (2 if kind == 1 else (3 if kind == 2 else 4))
        most += width * length
    return total, most


_checked: set = set()  # the kernels `_announce_once` has looked for in the cache
_gather_known: bool | None = None


def gather_layout_known() -> bool:
    """Whether str objects here are laid out as `gather_utf8` reads them (checked once)."""
    global _gather_known
    if _gather_known is None:
        from .kernel_args import LAYOUT_SAMPLE_STRS, load_int, object_layout_known

        def read_as_laid_out(text: str) -> bool:
            state = load_int(id(text) + STR_STATE_OFFSET) & 0xFF
            width = max(map(ord, text), default=0)
            kind = 1 if width < 256 else 2 if width < 65536 else 4
            offset = ASCII_DATA_OFFSET if text.isascii() else COMPACT_DATA_OFFSET
            held = ctypes.string_at(id(text) + offset, kind * len(text))
            return (bool(state & _STR_COMPACT_BIT) and (state >> _STR_KIND_SHIFT) & 7 == kind
                    and held == text.encode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]))

        _gather_known = object_layout_known() and all(map(read_as_laid_out, LAYOUT_SAMPLE_STRS))
    return _gather_known


_WHOLE = np.zeros(0, dtype=np.int64)  # `gather_utf8`'s spans for whole texts


def lengths_of(texts: list) -> tuple[np.ndarray, int, int] | None:
    """(the length of each text, their sum, the most UTF-8 bytes they can take) of `texts` (a
    list of the caller's own), read by `str_lengths`; None if one is not a `str` (a
    subclass's, or not text at all: the caller checks them the slow way) or str objects are
    laid out otherwise."""
    if not gather_layout_known():
        return None
    _announce_once(str_lengths)
    lengths = np.empty(len(texts), dtype=np.int64)
    total, most = str_lengths(id(texts), len(texts), id(str), lengths)
    return None if total < 0 else (lengths, int(total), int(most))


def _announce_once(kernel) -> None:
    """Say, before `kernel` (one of this module's) is first compiled (~1 s, on a first run),
    that kernels are being compiled. Each is looked for on its own: a process that never
    calls one never caches it, and asking for both said so in every process. One compiled or
    loaded in this process already (`encode.load_rare_kernels` loads both) is not looked for in
    the cache: reading its index took 0.5-2.6 ms of a first batch, before any thread started."""
    if kernel not in _checked:
        if not _loaded(kernel) and not cached(kernel):
            announce_compiling()
        _checked.add(kernel)


def _loaded(kernel) -> bool:
    """Whether `kernel` is compiled, or loaded from the cache, in this process already."""
    return bool(kernel.signatures)


def gather(texts: list, state, spans: np.ndarray | None = None, *,
           in_place: bool = False) -> tuple | None:
    """(UTF-8, where each text ends in it) of the str of `texts` (a list of the caller's own;
    with `spans`, of text k's characters spans[2k]:spans[2k + 1]), made by `gather_utf8` in
    the buffer that the thread's `state` keeps (so its pages fault in once); None if it cannot
    be (a lone surrogate, a str laid out otherwise). `in_place`: (UTF-8, ends, addresses)
    instead, the ASCII texts read where they are (`gather_utf8`'s `addresses`): the texts must
    then live, unchanged, as long as the addresses are used."""
    if not gather_layout_known():
        return None
    _announce_once(gather_utf8)
    if type(texts) is not list:  # (the loop reads a list's items)
        texts = list(texts)
    spans = _WHOLE if spans is None else spans
    ends = np.empty(len(texts), dtype=np.int64)
    addresses = np.empty(len(texts) if in_place else 0, dtype=np.int64)
    buf = state.utf8_room(1)
    w = gather_utf8(id(texts), len(texts), spans, buf, ends, addresses)
    if w <= -2:  # too little room: -2 - the room it needs
        buf = state.utf8_room(-2 - w)
        w = gather_utf8(id(texts), len(texts), spans, buf, ends, addresses)
    if w < 0:
        return None
    return (buf, ends, addresses) if in_place else (buf[:w], ends)
