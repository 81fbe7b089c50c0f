"""A long Python str as the UTF-8 bytes the encode kernels read, without slicing it or holding
the GIL to transcode it.

`str.encode` of a slice copies the slice first (and for a str of 2 or 4 bytes a character, scans
it to narrow it), then transcodes it, all holding the GIL, into fresh memory whose pages fault
in: cutting a 4.5 MB text into groups this way took ~4 ms of a ~20 ms encode, while the other
threads of a batch waited for the GIL. Here:

- an ASCII str is its own UTF-8: its characters are read where CPython holds them
  (`ascii_bytes`, no copy at all);
- any other is transcoded from its characters (1, 2 or 4 bytes each, as CPython holds them) by a
  compiled loop (`utf8_into`) that releases the GIL, into a buffer the thread keeps (so its
  pages fault in once): 3.1-3.4 ms for 5 MB of web text against 7.3-7.8 for slicing it and
  `str.encode` (CPython's transcoding is as fast on text of few ASCII characters, as CJK).

Both take ~2-3 us to start (a ctypes call, Numba's unboxing of a str), so they are for long texts
(the tokenizer's `_READ_IN_PLACE_FROM`); short ones are better served by `str.encode`. This module
imports Numba, so the tokenizer imports it only when a long text comes (`import nbbpe` does not
load Numba: 0.2 s against 0.5).
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .kernel_cache import announce_compiling, cached  # first: keys the cached kernels
from .kernel_args import readonly_array_from
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


@intrinsic
def _pointer_address(typingctx, pointer):
    """A raw pointer (Numba's `voidptr`) as an int64 address."""
    if not isinstance(pointer, types.RawPointer):
        return None

    def codegen(context, builder, signature, args):
        return builder.ptrtoint(args[0], ir.IntType(64))

    return types.int64(pointer), codegen


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


@njit(cache=True, nogil=True)
def utf8_into(text, start, end, out, w):
    """Write the UTF-8 of text[start:end] (a str; 0 <= start <= end <= len(text)) to out[w:],
    which has room for 4 bytes a character; return where it ends, or -1 if it holds a lone
    surrogate. Reads the characters where CPython holds them, 1, 2 or 4 bytes each."""
    address = _pointer_address(text._data)
    n = len(text)
    if text._kind == 1:
        return _units_to_utf8(readonly_array_from(address, n, np.uint8), start, end, out, w)
    if text._kind == 2:
        return _units_to_utf8(readonly_array_from(address, n, np.uint16), start, end, out, w)
    return _units_to_utf8(readonly_array_from(address, n, np.uint32), start, end, out, w)


_loaded = False


def transcode(text: str, start: int, end: int, out: np.ndarray, w: int) -> int:
    """`utf8_into`, saying first if it is about to be compiled (~1.5 s, on a first run)."""
    global _loaded
    if not _loaded:
        if not cached(utf8_into):
            announce_compiling()
        _loaded = True
    return utf8_into(text, start, end, out, w)
