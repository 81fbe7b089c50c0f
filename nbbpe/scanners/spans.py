"""Walking a text's pre-tokens with a family's scanner, and their spans (what the tests compare
with `regex.finditer`)."""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

BLOCK = 64  # bytes a block scanner looks at


@njit(inline="always")
def no_blocks(buf, table, p):
    """The block scanner of a family that has none: never a block."""
    return np.uint64(0)


# Inlined (at Numba IR level) into each family's own kernel: the scanner arguments are then
# constants the compiled code never needs, so the kernel can be cached (a dispatcher passed at
# run time would be a process-specific address, which Numba refuses to cache).
@njit(inline="always")
def scan_segments(scanner, block_scanner, buf, table, seg_starts, seg_ends, starts, ends):
    """Write the pre-tokens of each segment buf[seg_starts[s]:seg_ends[s]] (each a text of its
    own) to starts/ends, in order; return how many there are. Room for one per byte is enough."""
    k = 0
    for s in range(seg_starts.shape[0]):
        i = seg_starts[s]
        stop = seg_ends[s]
        while i < stop:
            bits = np.uint64(0)
            if i + BLOCK <= stop:
                bits = block_scanner(buf, table, i)
            if bits:
                base = i
                while bits:
                    j = base + np.int64(trailing_zeros(bits))
                    bits &= bits - np.uint64(1)
                    starts[k] = i
                    ends[k] = j
                    k += 1
                    i = j
                continue
            j = scanner(buf, table, i, stop)
            starts[k] = i
            ends[k] = j
            k += 1
            i = j
    return k
