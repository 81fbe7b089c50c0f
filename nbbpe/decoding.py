"""Decoding long sequences of ids: token ids -> their bytes end to end, by a compiled call.

`Tokenizer.decode_bytes` looks a short list of ids up in the vocab, and takes NumPy's gather for
an array or a longer list: about ten array operations, and for a list an array made of it first
(decoding 327,705 ids of web text took 29 ms from a list and 14 ms from an array, tiktoken 12).
From 4,096 ids on (fewer are not worth its first use, which loads it, or compiles it), it
takes `decoder(...)`, a compiled C function called as a builtin (as
the short path's is, see `kernel_args.fastcall_builtin`): it reads a list's items where they
are, or an int64 array, checks every id, adds up the lengths, and copies each token's bytes into
a new `bytes` object.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import kernel_cache  # noqa: F401  (first: keys the cached kernels, see kernel_cache)
from .kernel_args import (LIST_ITEMS_OFFSET, NDARRAY_DATA_OFFSET, OB_TYPE_OFFSET,
                          TUPLE_ITEMS_OFFSET, address, array_from, c_function_address, call_c,
                          copy_bytes, fastcall_builtin, load_word, usable_fastcall_address)
from .scanners.classes import uindex

# What the builtin is bound to: a tuple of an int64 array of these, then the arrays it points at.
_FUNCTIONS = ("PyBytes_FromStringAndSize", "PyBytes_AsString", "PyLong_AsSsize_t", "Py_IncRef",
              "PyErr_Clear")
(BYTES_NEW_AT, BYTES_DATA_AT, AS_SSIZE_AT, INCREF_AT, ERR_CLEAR_AT, INT_TYPE_AT, LIST_TYPE_AT,
 NONE_AT, TOKEN_BYTES_AT, OFFSETS_AT, KNOWN_AT, N_IDS_AT, _ITEMS) = range(13)


@njit(inline="always")  # into `_decode`
def _id_at(values, ids, is_list, k):
    """Id k of `ids` (a list's items, or an int64 array's), or -1 if that item is not an `int`
    (or too large: then an error is set, cleared by the caller)."""
    if not is_list:
        return ids[uindex(k)]
    item = ids[uindex(k)]
    if load_word(item + OB_TYPE_OFFSET) != values[INT_TYPE_AT]:
        return -1
    return call_c(values[AS_SSIZE_AT], (item,))


def _decode(self_object, args, nargs, kwnames):
    """call(ids, n): the bytes of the ids end to end, `ids` a list of n items or a C-contiguous
    int64 array of n (as `Tokenizer.decode_bytes` hands them over). None if an item is not an
    `int` or an id is not one of the vocab's (the caller then says which); NULL with the error
    set if the bytes could not be made."""
    values = array_from(load_word(load_word(self_object + TUPLE_ITEMS_OFFSET)
                                  + NDARRAY_DATA_OFFSET), _ITEMS, np.int64)
    ids_object = load_word(args)
    n = call_c(values[AS_SSIZE_AT], (load_word(args + 8),))
    is_list = load_word(ids_object + OB_TYPE_OFFSET) == values[LIST_TYPE_AT]
    items_at = LIST_ITEMS_OFFSET if is_list else NDARRAY_DATA_OFFSET
    ids = array_from(load_word(ids_object + items_at), n, np.int64)
    n_ids = values[N_IDS_AT]
    offsets = array_from(values[OFFSETS_AT], n_ids + 1, np.int64)
    known = array_from(values[KNOWN_AT], n_ids, np.uint8)
    total = 0
    for k in range(n):
        i = _id_at(values, ids, is_list, k)
        if i < 0 or i >= n_ids or known[uindex(i)] == 0:
            call_c(values[ERR_CLEAR_AT], ())
            call_c(values[INCREF_AT], (values[NONE_AT],))
            return values[NONE_AT]
        total += offsets[uindex(i + 1)] - offsets[uindex(i)]
    result = call_c(values[BYTES_NEW_AT], (0, total))
    if result == 0:
        return 0
    at = call_c(values[BYTES_DATA_AT], (result,))
    for k in range(n):
        i = _id_at(values, ids, is_list, k)
        start = offsets[uindex(i)]
        length = offsets[uindex(i + 1)] - start
        copy_bytes(at, values[TOKEN_BYTES_AT] + start, length)
        at += length
    return result


def decoder(token_bytes: np.ndarray, token_offsets: np.ndarray, known: np.ndarray):
    """The compiled decode call for a tokenizer's token arena (`token_bytes`, uint8), its
    offsets by id (int64, one more than ids) and which ids it has (`known`, bool); None if
    objects are not laid out as it reads them, or it does not compile here."""
    function = usable_fastcall_address(_decode)
    if function is None:
        return None
    known = known.view(np.uint8)
    values = np.array([c_function_address(name) for name in _FUNCTIONS]
                      + [id(int), id(list), id(None), address(token_bytes),
                         address(token_offsets), address(known), len(known)], dtype=np.int64)
    return fastcall_builtin(function, (values, token_bytes, token_offsets, known), "decode_bytes")
