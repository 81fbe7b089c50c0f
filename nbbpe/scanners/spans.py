"""Pre-token spans of a buffer with any scanner: what the tests compare with `regex.finditer`."""

from __future__ import annotations

from numba import njit


# Inlined (at Numba IR level) into each scanner's own kernel: the scanner argument is then a
# constant the compiled code never needs, so the kernel can be cached (a dispatcher passed at
# run time would be a process-specific address, which Numba refuses to cache).
@njit(inline="always")
def scan_segments(scanner, buf, table, seg_starts, seg_ends, starts, ends):
    """Write the pre-tokens of each segment buf[seg_starts[s]:seg_ends[s]] (each a text of its
    own) to starts/ends, in order; return how many there are. Room for one per byte is enough."""
    k = 0
    for s in range(seg_starts.shape[0]):
        i = seg_starts[s]
        stop = seg_ends[s]
        while i < stop:
            j = scanner(buf, table, i, stop)
            starts[k] = i
            ends[k] = j
            k += 1
            i = j
    return k
