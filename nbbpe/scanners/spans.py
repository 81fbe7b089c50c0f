"""Walking a text's pre-tokens with a family's scanners: a window at a time (what the counting
and encoding kernels consume), or all of them as spans (what the tests compare with `regex`).

A family has a scanner, `end = scanner(buf, table, i, stop)`, and optionally a block scanner,
`bits = block_scanner(buf, table, i, stop)`, which cuts the 64 bytes from a pre-token start at
once (bit k set: a pre-token starts at i + k, for k in 1..61) or returns 0 where it cannot (e.g.
not ASCII); it reads 64 bytes of `buf` even past `stop`, but decides only from the text's. The functions taking scanners are
inlined (at Numba IR level) into each family's own kernels: the scanner arguments are then
constants the compiled code never needs, so those kernels can be cached (a dispatcher passed
at run time would be a process-specific address, which Numba refuses to cache).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from .classes import MIN_ASCII, uindex

BLOCK = 64  # bytes a block scanner looks at
WINDOW = 256  # pre-tokens found per `scan_window` call


@njit(inline="always")
def scan_window(scanner, block_scanner, buf, table, i, stop, ends):
    """Write the ends of the next pre-tokens of buf[i:stop] (i starts one, `stop` ends the
    text) to `ends`, at most len(ends) - BLOCK + 1 of them; return how many (at least one if
    i < stop). Pre-token t runs from ends[t - 1] (i for t = 0) to ends[t]."""
    return scan_window_visiting(scanner, block_scanner, _visit_none, (), buf, table, i, stop, ends)


@njit(inline="always")
def _visit_none(context, t, start, end):
    """What `scan_window` does with each pre-token besides writing its end: nothing."""


@njit(inline="always")
def scan_window_visiting(scanner, block_scanner, visit, context, buf, table, i, stop, ends):
    """`scan_window`, calling visit(context, t, start, end) on each pre-token t as it is found
    (inlined: the encode loop keys it and prefetches its cache slot there, while its bytes are
    at hand, rather than in a second pass over the window)."""
    k = 0
    limit = ends.shape[0] - BLOCK
    start = i
    while i < stop and k < limit:
        bits = np.uint64(0)
        if i + BLOCK <= stop:
            bits = block_scanner(buf, table, i, stop)
        elif i + BLOCK <= buf.shape[0] and stop - i >= MIN_ASCII:
            # A block may run past the text's end (into the next document, a special token) if
            # it is in `buf`: the block scanner does not look past `stop`. So a text's last 64
            # bytes are cut a block at a time too (a TinyStories document has 843).
            bits = block_scanner(buf, table, i, stop)
        if bits:
            base = i
            while bits:
                i = base + np.int64(trailing_zeros(bits))
                bits &= bits - np.uint64(1)
                ends[uindex(k)] = i
                visit(context, k, start, i)
                start = i
                k += 1
        else:
            i = scanner(buf, table, i, stop)
            ends[uindex(k)] = i
            visit(context, k, start, i)
            start = i
            k += 1
    return k


@njit(inline="always")
def scan_segments(scanner, block_scanner, buf, table, seg_starts, seg_ends, starts, ends):
    """Write the pre-tokens of each segment buf[seg_starts[s]:seg_ends[s]] (each a text of its
    own) to starts/ends, in order; return how many there are. Room for one per byte is enough."""
    k = 0
    window = np.empty(WINDOW, dtype=np.int64)
    for s in range(seg_starts.shape[0]):
        i = seg_starts[s]
        stop = seg_ends[s]
        while i < stop:
            n = scan_window(scanner, block_scanner, buf, table, i, stop, window)
            for t in range(n):
                starts[k] = i
                ends[k] = window[t]
                i = window[t]
                k += 1
    return k
