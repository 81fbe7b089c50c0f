"""Token ids as Python lists, made by compiled code from the process's own ints.

CPython makes a new int object for each id above 256 that it turns into Python
(`ndarray.tolist()`: 20-60 ns an id here; of `encode_batch` on TinyStories' 5,335 documents,
70 of 94 ms). A list of ids may hold the same int object any number of times: the process keeps
the ints 0 .. n - 1 (`int_objects`), and lists of ids are made of them, one more reference each
(a few ns an id): by the short path's compiled call (`encode._ids_object`), and for the ids of
many texts, or of one long one, by `id_lists`, a compiled C function called as a builtin (as the
short path's is, see `kernel_args.fastcall_builtin`).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from . import kernel_cache  # noqa: F401  (first: keys the cached kernels, see kernel_cache)
from .kernel_args import (LIST_ITEMS_OFFSET, NDARRAY_DATA_OFFSET, array_from, c_function_address,
                          call_c, fastcall_builtin, load_int, load_word, usable_fastcall_address)
from .scanners.classes import uindex

_int_objects: dict[int, list] = {}


def int_objects(n: int) -> list:
    """The list of the ints 0 .. n - 1, for the process, never changed: compiled code reads its
    items where they are (tokenizers with as many ids share it)."""
    ints = _int_objects.get(n)
    if ints is None:
        ints = _int_objects[n] = list(range(n))
    return ints


def int_items(ints: list) -> int:
    """Where the items of `ints` (from `int_objects`) are: an array of object pointers."""
    return load_int(id(ints) + LIST_ITEMS_OFFSET)


@njit(inline="always")  # into `_id_lists` and `encode._ids_object`
def fill_list(items_address, ids, start, count, ints, incref):
    """Put ints[ids[start + k]] for k < count, one more reference each (through the C function
    `incref`, Py_IncRef), at `items_address`, the items of a new list of `count` items (from
    PyList_New, as PyList_SET_ITEM puts them)."""
    items = array_from(items_address, count, np.int64)
    for k in range(count):
        item = ints[uindex(ids[uindex(start + k)])]
        call_c(incref, (item,))
        items[uindex(k)] = item


# What the builtin is bound to: an int64 array of these, the C API functions it calls, then the
# address and number of the process's ints (`int_objects`).
_FUNCTIONS = ("PyList_New", "Py_IncRef", "Py_DecRef", "PyLong_AsSsize_t", "PyObject_GC_UnTrack",
              "PyObject_GC_Track")
(LIST_NEW_AT, INCREF_AT, DECREF_AT, AS_SSIZE_AT, UNTRACK_AT, TRACK_AT, INTS_AT, INT_COUNT_AT,
 _ITEMS) = range(9)


def _id_lists(self_object, args, nargs, kwnames):
    """call(ids, offsets, n): a list of n lists, list k of ints[ids[offsets[k]:offsets[k + 1]]]
    (`ids` int32, `offsets` int64, both C-contiguous, checked by `id_lists`); NULL with the
    error set if a list could not be made.

    The lists are left out of the cyclic garbage collector's sight until all are made: each
    young collection that making them sets off (one per 700 new lists) went over every id of
    the lists made since the last one (TinyStories' 5,335 lists of 1.1M ids: 11-28 ms, against
    3.1-3.6 with collections 15 times rarer)."""
    values = array_from(load_word(self_object + NDARRAY_DATA_OFFSET), _ITEMS, np.int64)
    n = call_c(values[AS_SSIZE_AT], (load_word(args + 16),))
    offsets = array_from(load_word(load_word(args + 8) + NDARRAY_DATA_OFFSET), n + 1, np.int64)
    ids = array_from(load_word(load_word(args) + NDARRAY_DATA_OFFSET), offsets[n], np.int32)
    ints = array_from(values[INTS_AT], values[INT_COUNT_AT], np.int64)
    outer = call_c(values[LIST_NEW_AT], (n,))
    if outer == 0:
        return 0
    lists = array_from(load_word(outer + LIST_ITEMS_OFFSET), n, np.int64)
    for k in range(n):
        start = offsets[k]
        count = offsets[k + 1] - start
        inner = call_c(values[LIST_NEW_AT], (count,))
        if inner == 0:  # (the outer list's items after k are NULL, which it lets be)
            _track(values, lists, k)
            call_c(values[DECREF_AT], (outer,))
            return 0
        call_c(values[UNTRACK_AT], (inner,))
        fill_list(load_word(inner + LIST_ITEMS_OFFSET), ids, start, count, ints,
                  values[INCREF_AT])
        lists[uindex(k)] = inner
    _track(values, lists, n)
    return outer


@njit(inline="always")  # into `_id_lists`
def _track(values, lists, n):
    """Let the garbage collector see lists[:n] again (as every list is seen)."""
    for k in range(n):
        call_c(values[TRACK_AT], (lists[uindex(k)],))


@functools.cache
def _lists_call(n_ids: int):
    """The builtin `_id_lists` bound to its values for lists of ids below `n_ids`; None if
    objects are not laid out as it reads them, or it does not compile here."""
    function = usable_fastcall_address(_id_lists)
    if function is None:
        return None
    ints = int_objects(n_ids)
    values = np.array([c_function_address(name) for name in _FUNCTIONS]
                      + [int_items(ints), len(ints)], dtype=np.int64)
    return fastcall_builtin(function, values, "id_lists")


# Fewer ids are sliced from `tolist()` (~20 us for this many): not worth the compiled call's
# first use, which loads it (or compiles it: ~0.5 s).
COMPILED_FROM = 1 << 10


def id_list(ids: np.ndarray, n_ids: int) -> list[int]:
    """`ids` (each below `n_ids`) as one list of the process's ints (`id_lists`)."""
    return id_lists(ids, [0, len(ids)], n_ids)[0]


def id_lists(ids: np.ndarray, offsets, n_ids: int) -> list[list[int]]:
    """[ids[offsets[k]:offsets[k + 1]] as a list of ints for k < len(offsets) - 1], each id
    below `n_ids` (a tokenizer's); as `ids.tolist()` sliced, but of the process's ints."""
    ids = np.asarray(ids)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    make = _lists_call(n_ids) if len(ids) >= max(COMPILED_FROM, 1) else None
    if make is not None and (n >= 0 and offsets[0] == 0 and offsets[-1] == len(ids)
                             and not (np.diff(offsets) < 0).any()
                             and 0 <= ids.min() <= ids.max() < n_ids):  # (a tokenizer's are)
        return make(np.ascontiguousarray(ids, dtype=np.int32), offsets, n)
    flat = ids.tolist()
    bounds = offsets.tolist()
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
