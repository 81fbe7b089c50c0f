"""Encoding kernels: UTF-8 bytes -> token ids in one compiled pass.

`encode_documents` (one cached kernel per scanner family, see `ENCODERS`) reads a batch of
documents (UTF-8 bytes end to end, with the offsets where each ends), and for each document:
finds the next special-token occurrence, scans the pre-tokens of the stretch before it with the
family's scanner, looks each pre-token up, runs the byte-pair merge only when it was never seen,
and writes the ids straight into a preallocated output; then the special token's id, and after
each document an optional separator id. Nothing per pre-token leaves the compiled code.
`encode_pieces` does the same for pre-tokens found by `regex` (any pattern).

Data, all flat arrays in NamedTuples (Numba passes them as structs):

- `Ranks`: the merges as an open-addressing hash table of one int64 per slot, the pair of token
  ids (left << id_bits | right) above the pair's rank; the merged id comes from `merged`;
- `Table` (the same layout twice): pre-tokens -> their ids. A pre-token of up to 8 bytes is
  its own key (packed little-endian, with its length), so a lookup is one multiply and usually
  one probe; one that encodes to a single id keeps the id in its slot. Longer ones are keyed by
  a hash and their bytes are compared in a record. The *vocab table*, built once per tokenizer
  and shared read-only by every thread, holds the ids of every token's own bytes: the common
  words are found there, never merged. The *cache*, one per thread, remembers every other
  pre-token encoded; it is emptied at once when full, so memory stays bounded.

Two merge orders, both exact:

- MERGES (GPT-2's `bpe()`, for a trained merge list): each round takes the pair of lowest rank
  anywhere in the pre-token and merges all its occurrences left to right, non-overlapping
  (`a a a` -> `aa a`);
- RANKS (tiktoken's byte-pair merge, for rank files such as cl100k_base): a pre-token that is a
  token is that token; otherwise repeatedly merge the leftmost adjacent pair whose concatenation
  has the lowest rank, one pair at a time.

Short pre-tokens merge by scanning their pairs; long ones (more than `_HEAP_ABOVE` bytes) on a
heap of (rank, position), so no input, however long and repetitive, takes quadratic time.

The kernels are compiled without Numba's reference counting (`_nrt=False`): every array they
touch is passed in, so per pre-token no atomic counter is touched. They allocate nothing; a
pre-token too long for the scratch space makes the kernel return and ask for more.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .scanners.cl100k import cl100k_pretoken_end
from .scanners.gpt2 import gpt2_block_boundaries, gpt2_pretoken_end
from .scanners.o200k import o200k_pretoken_end
from .scanners.specials import Specials, next_special
from .scanners.spans import WINDOW, no_blocks, scan_window

MERGES, RANKS = 0, 1  # merge orders
NO_MERGE = np.int64(np.iinfo(np.int64).max)
_EMPTY = np.int64(-1)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: Fibonacci hashing
_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_LONG = np.int64(15)  # length code of keys longer than 8 bytes (a hash; bytes compared)
_SINGLE = np.int64(16)  # table meta flag: the pre-token is one id, kept in the slot
_HEAP_ABOVE = 64  # pre-tokens longer than this many bytes merge on a heap


class Ranks(NamedTuple):
    """Which adjacent pairs merge, in which order, into what (see the module docstring)."""

    slots: np.ndarray  # int64, a power of two: (left << id_bits | right) << rank_bits | rank
    shift: int  # 64 - log2(len(slots))
    id_bits: int
    rank_bits: int
    merged: np.ndarray  # int32: the id each rank's merge creates
    byte_ids: np.ndarray  # int32[256]: the id of each single byte
    mode: int  # MERGES or RANKS


class Table(NamedTuple):
    """Pre-tokens -> ids. `slots[2s]` is a key, `slots[2s + 1]` its meta: 0 where empty, else a
    length code in bits 0-3 (1-8: the key is the bytes themselves; 15: a hash), `_SINGLE` if the
    pre-token is one id, and from bit 5 that id or the index of its record in `records`. A
    record is [number of ids, ids...], then for hashed keys [length, the bytes one per item]."""

    slots: np.ndarray  # int64; twice a power of two
    records: np.ndarray  # int32
    fill: np.ndarray  # int64[3]: items of `records` used, entries, times emptied
    shift: int  # 64 - log2(number of slots)
    max_entries: int  # at most half the slots, so probes stay short
    max_key_len: int  # longer pre-tokens are never stored


def new_table(max_entries: int, max_key_len: int = 256) -> Table:
    """An empty table for up to `max_entries` pre-tokens of at most `max_key_len` bytes."""
    max_entries = min(max(1, int(max_entries)), 1 << 26)
    bits = int(2 * max_entries - 1).bit_length()
    items = max(max_entries * 4, 4 + 2 * max_key_len)  # most entries need no record at all
    return Table(np.zeros(2 << bits, dtype=np.int64), np.zeros(items, dtype=np.int32),
                 np.zeros(3, dtype=np.int64), 64 - bits, max_entries, int(max_key_len))


EMPTY_TABLE = Table(np.zeros(2, np.int64), np.zeros(1, np.int32), np.zeros(3, np.int64), 63, 0, 0)


def new_scratch() -> np.ndarray:
    """Scratch space of the kernels: a window of pre-token ends, their keys, length codes and
    home slots in the cache, and the pair ranks of a short pre-token being merged."""
    return np.empty(4 * WINDOW + _HEAP_ABOVE + 1, dtype=np.int64)


# --- the rank table ---------------------------------------------------------------------------


def build_ranks(left, right, rank, merged_of_rank, byte_ids, mode: int) -> Ranks:
    """The `Ranks` of pairs (left[k], right[k]) with ranks rank[k]; `merged_of_rank[r]` is the id
    rank r's merge creates. The pairs must be distinct (the caller checks, naming a duplicate)."""
    left = np.ascontiguousarray(left, dtype=np.int64)
    right = np.ascontiguousarray(right, dtype=np.int64)
    rank = np.ascontiguousarray(rank, dtype=np.int64)
    largest_id = int(max(left.max(initial=0), right.max(initial=0), 255))
    id_bits = max(8, (largest_id + 1).bit_length())  # an all-ones id never occurs: empty slots
    rank_bits = 64 - 2 * id_bits - 1  # the sign bit stays clear: -1 marks an empty slot
    if rank_bits < 1 or int(rank.max(initial=0)) >= 1 << rank_bits:
        raise ValueError(f"too many merges or ids for the rank table ({largest_id + 1:,} ids)")
    bits = max(4, int(2 * len(left) - 1).bit_length())  # load factor at most 1/2
    slots = _fill_ranks(left, right, rank, id_bits, rank_bits, bits)
    return Ranks(slots, 64 - bits, id_bits, rank_bits,
                 np.ascontiguousarray(merged_of_rank, dtype=np.int32),
                 np.ascontiguousarray(byte_ids, dtype=np.int32), mode)


@njit(cache=True, nogil=True)
def _fill_ranks(left, right, rank, id_bits, rank_bits, bits):
    size = 1 << bits
    slots = np.empty(size, dtype=np.int64)
    for s in range(size):
        slots[s] = _EMPTY
    shift = np.uint64(64 - bits)
    for k in range(left.shape[0]):
        pair = (left[k] << id_bits) | right[k]
        s = np.int64((np.uint64(pair) * _GOLDEN) >> shift)
        while slots[s] != _EMPTY:
            s = (s + 1) & (size - 1)
        slots[s] = (pair << rank_bits) | rank[k]
    return slots


@njit(cache=True, nogil=True)
def _pair_rank(ranks, a, b):
    """The rank of pair (a, b), or NO_MERGE if it does not merge."""
    pair = (np.int64(a) << ranks.id_bits) | np.int64(b)
    slots = ranks.slots
    mask = slots.shape[0] - 1
    s = np.int64((np.uint64(pair) * _GOLDEN) >> np.uint64(ranks.shift))
    while True:
        entry = slots[s]
        if entry == _EMPTY:
            return NO_MERGE
        if entry >> ranks.rank_bits == pair:
            return entry & ((np.int64(1) << ranks.rank_bits) - 1)
        s = (s + 1) & mask


# --- merging one pre-token --------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _merge_rounds(work, lo, m, pairs, ranks):
    """MERGES order on work[lo:lo + m], in place; return the new length.

    `pairs[i]` is the rank of the pair at lo + i. A round finds the lowest, then sweeps from its
    first occurrence, merging every occurrence left to right and updating the pairs that change;
    pairs between untouched tokens keep theirs. Each rank belongs to one pair, so
    pairs[i] == best marks an occurrence. Writes go behind the reads, so the sweep is in place.
    """
    for i in range(m - 1):
        pairs[i] = _pair_rank(ranks, work[lo + i], work[lo + i + 1])
    while m > 1:
        best = NO_MERGE
        at = -1
        for i in range(m - 1):
            if pairs[i] < best:
                best = pairs[i]
                at = i
        if at < 0:
            break
        merged = ranks.merged[best]
        w = at
        i = at
        prev_copied = at > 0  # work[w - 1] is the old token at i - 1, unchanged
        while i < m:
            if i < m - 1 and pairs[i] == best:
                token = merged
                copied = False
                step = 2
            else:
                token = work[lo + i]
                copied = True
                step = 1
            if w > 0:
                if copied and prev_copied:
                    pairs[w - 1] = pairs[i - 1]
                else:
                    pairs[w - 1] = _pair_rank(ranks, work[lo + w - 1], token)
            work[lo + w] = token
            prev_copied = copied
            w += 1
            i += step
        m = w
    return m


@njit(cache=True, nogil=True)
def _merge_leftmost(work, lo, m, pairs, ranks):
    """RANKS order on work[lo:lo + m], in place: merge the leftmost pair of lowest rank, one at
    a time; return the new length."""
    for i in range(m - 1):
        pairs[i] = _pair_rank(ranks, work[lo + i], work[lo + i + 1])
    while m > 1:
        best = NO_MERGE
        at = -1
        for i in range(m - 1):
            if pairs[i] < best:  # strictly lower: the leftmost wins a tie
                best = pairs[i]
                at = i
        if at < 0:
            break
        work[lo + at] = ranks.merged[best]
        for i in range(at + 1, m - 1):
            work[lo + i] = work[lo + i + 1]
            pairs[i] = pairs[i + 1]
        m -= 1
        if at > 0:
            pairs[at - 1] = _pair_rank(ranks, work[lo + at - 1], work[lo + at])
        if at < m - 1:
            pairs[at] = _pair_rank(ranks, work[lo + at], work[lo + at + 1])
    return m


@njit(cache=True, nogil=True)
def _heap_push(heap, size, key):
    """Add `key` to the min-heap heap[:size] (which has room for one more)."""
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= key:
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = key


@njit(cache=True, nogil=True)
def _heap_pop(heap, size):
    """Remove the smallest of heap[:size]; the heap then has size - 1 items."""
    size -= 1
    last = heap[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= last:
            break
        heap[i] = heap[child]
        i = child
    heap[i] = last


@njit(cache=True, nogil=True)
def encode_long_piece(buf, start, end, ranks, vocab, out):
    """Write the ids of pre-token buf[start:end] to `out`; return how many. For pre-tokens
    longer than `_HEAP_ABOVE` bytes (rare: compiled on first use): a token in RANKS order,
    else merged on a heap."""
    length = end - start
    if length <= vocab.max_key_len:
        key, code = _key(buf, start, end)
        s = _find(vocab, key, code, buf, start, length)
        if s >= 0:
            return _copy_ids(vocab, s, out, np.int64(0))
    for i in range(length):
        out[i] = ranks.byte_ids[buf[start + i]]
    return _merge_on_heap(out, ranks)


@njit(cache=True, nogil=True)
def _merge_on_heap(work, ranks):
    """Either order on the byte ids `work` in O(m log m), in place; return the new length.

    Tokens form a linked list by original position; the heap holds (rank, position) of every
    pair that may merge, as one int64 (rank << 32 | position: the leftmost first on ties).
    An entry is stale if the pair at its position has changed since (a changed pair always has
    another rank); it is skipped when popped. In MERGES order a round merges every occurrence
    of one pair, so the pairs a round creates wait until it ends (GPT-2 looks for the next pair
    only after the sweep).
    """
    lo = 0
    m = work.shape[0]
    nxt = np.empty(m, dtype=np.int64)
    prv = np.empty(m, dtype=np.int64)
    rank_at = np.empty(m, dtype=np.int64)  # rank of the pair starting at each live position, or -1
    heap = np.empty(2 * m + 2, dtype=np.int64)
    waiting = np.empty(2 * m + 2, dtype=np.int64)
    size = np.int64(0)
    n_waiting = np.int64(0)
    for i in range(m):
        nxt[i] = i + 1 if i + 1 < m else -1
        prv[i] = i - 1
        rank_at[i] = -1
    for i in range(m - 1):
        r = _pair_rank(ranks, work[lo + i], work[lo + i + 1])
        if r != NO_MERGE:
            rank_at[i] = r
            _heap_push(heap, size, (r << 32) | i)
            size += 1
    current_round = np.int64(-1)
    while size > 0 or n_waiting > 0:
        key = heap[0] if size > 0 else NO_MERGE
        r = key >> 32
        if ranks.mode == MERGES and n_waiting > 0 and (size == 0 or r != current_round):
            for k in range(n_waiting):  # the round is over: its new pairs join the heap
                _heap_push(heap, size, waiting[k])
                size += 1
            n_waiting = np.int64(0)
            continue
        _heap_pop(heap, size)
        size -= 1
        i = key & 0xFFFFFFFF
        if rank_at[i] != r:
            continue  # stale: the pair at i has changed
        current_round = r
        j = nxt[i]
        work[lo + i] = ranks.merged[r]
        after = nxt[j]
        nxt[i] = after
        if after >= 0:
            prv[after] = i
        rank_at[j] = -1
        for a in (prv[i], i):  # the pairs on either side of the new token are new
            if a < 0:
                continue
            b = nxt[a]
            q = NO_MERGE if b < 0 else _pair_rank(ranks, work[lo + a], work[lo + b])
            rank_at[a] = -1 if q == NO_MERGE else q
            if q == NO_MERGE:
                continue
            if ranks.mode == MERGES:
                waiting[n_waiting] = (q << 32) | a
                n_waiting += 1
            else:
                _heap_push(heap, size, (q << 32) | a)
                size += 1
    w = np.int64(0)
    i = 0  # the first token is never merged away
    while i >= 0:
        work[lo + w] = work[lo + i]
        w += 1
        i = nxt[i]
    return w


# --- tables of encoded pre-tokens ----------------------------------------------------------------


@njit(inline="always")
def _load8(buf, i):
    """Bytes buf[i:i + 8] as a little-endian uint64 (one load: LLVM merges the byte loads)."""
    return (np.uint64(buf[i]) | np.uint64(buf[i + 1]) << np.uint64(8)
            | np.uint64(buf[i + 2]) << np.uint64(16) | np.uint64(buf[i + 3]) << np.uint64(24)
            | np.uint64(buf[i + 4]) << np.uint64(32) | np.uint64(buf[i + 5]) << np.uint64(40)
            | np.uint64(buf[i + 6]) << np.uint64(48) | np.uint64(buf[i + 7]) << np.uint64(56))


@njit(cache=True, nogil=True)
def _key(buf, start, end):
    """(key, length code) of buf[start:end]: its bytes packed if it has at most eight, else a
    hash of its 8-byte chunks."""
    length = end - start
    if length <= 8 and start + 8 <= buf.shape[0]:  # the common case: one load
        return np.int64(_load8(buf, start) & (_ALL_ONES >> np.uint64(64 - 8 * length))), length
    key = np.uint64(0)
    i = start
    while True:
        if i + 8 <= end:
            chunk = _load8(buf, i)
        else:  # the last chunk, byte by byte
            chunk = np.uint64(0)
            for m in range(end - 1, i - 1, -1):
                chunk = (chunk << np.uint64(8)) | np.uint64(buf[m])
        if length <= 8:
            return np.int64(chunk), length
        key = (key ^ chunk) * _GOLDEN
        key ^= key >> np.uint64(29)
        i += 8
        if i >= end:
            return np.int64(key), _LONG


@njit(cache=True, nogil=True)
def _find(table, key, code, buf, start, length):
    """The slot of `table` holding pre-token buf[start:start + length] (key and code from
    `_key`), or -1 - the empty slot where it would go."""
    return _find_from(table, _home(table, key), key, code, buf, start, length)


@njit(inline="always")
def _home(table, key):
    """The slot where the search for `key` starts."""
    return np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(table.shift))


@njit(cache=True, nogil=True)
def _find_from(table, s, key, code, buf, start, length):
    """`_find`, starting at slot s (`_home` of the key)."""
    slots = table.slots
    mask = (slots.shape[0] >> 1) - 1
    while True:
        meta = slots[2 * s + 1]
        if meta == 0:
            return -1 - s
        if slots[2 * s] == key and (meta & 15) == code:
            if code != _LONG:
                return s
            records = table.records
            r = meta >> 5
            at = r + 1 + records[r]  # the length, then the bytes
            if records[at] == length:
                same = True
                for m in range(length):
                    if records[at + 1 + m] != buf[start + m]:
                        same = False
                        break
                if same:
                    return s
        s = (s + 1) & mask


@njit(cache=True, nogil=True)
def _copy_ids(table, s, out, w):
    """Write the ids stored at slot s to out[w:]; return how many."""
    meta = table.slots[2 * s + 1]
    if meta & _SINGLE:
        out[w] = np.int32(meta >> 5)
        return 1
    r = meta >> 5
    m = table.records[r]
    for i in range(m):
        out[w + i] = table.records[r + 1 + i]
    return m


@njit(cache=True, nogil=True)
def _store(table, key, code, slot, buf, start, length, ids, w, m):
    """Store pre-token buf[start:start + length] -> ids[w:w + m] at `slot` (from `_find`);
    empty the table first if it is full."""
    slots = table.slots
    records = table.records
    fill = table.fill
    need = 0 if (m == 1 and code != _LONG) else 1 + m + (length + 1 if code == _LONG else 0)
    r = fill[0]
    if fill[1] >= table.max_entries or r + need > records.shape[0]:
        for s in range(slots.shape[0]):  # full: start again empty (bounded memory)
            slots[s] = 0
        fill[0] = 0
        fill[1] = 0
        fill[2] += 1
        r = np.int64(0)
        slot = -1 - _find(table, key, code, buf, start, length)
    slots[2 * slot] = key
    if need == 0:
        slots[2 * slot + 1] = code | _SINGLE | (np.int64(ids[w]) << 5)
    else:
        records[r] = m
        for i in range(m):
            records[r + 1 + i] = ids[w + i]
        if code == _LONG:
            records[r + 1 + m] = length
            for i in range(length):
                records[r + 2 + m + i] = buf[start + i]
        slots[2 * slot + 1] = code | (r << 5)
        fill[0] = r + need
    fill[1] += 1


@njit(inline="always")  # into the two kernels below: `merge` is a compile-time choice
def _encode_new(merge, buf, start, end, key, code, slot, out, w, ranks, vocab, cache, pairs):
    """Encode pre-token buf[start:end] (at most `_HEAP_ABOVE` bytes), not in the cache, into
    out[w:]: from the vocab table if its bytes are a token's, else by merging; remember it in
    `cache` if it may be (`slot` from `_find`, or 0 if it is too long); return the number of
    ids."""
    length = end - start
    m = np.int64(0)
    if length <= vocab.max_key_len:
        s = _find(vocab, key, code, buf, start, length)
        if s >= 0:
            m = _copy_ids(vocab, s, out, w)
    if m == 0:
        for i in range(length):
            out[w + i] = ranks.byte_ids[buf[start + i]]
        m = merge(out, w, length, pairs, ranks)
    if slot < 0:
        _store(cache, key, code, -1 - slot, buf, start, length, out, w, m)
    return m


@njit(cache=True, nogil=True, _nrt=False)
def _encode_new_merges(buf, start, end, key, code, slot, out, w, ranks, vocab, cache, pairs):
    """`_encode_new` in MERGES order."""
    return _encode_new(_merge_rounds, buf, start, end, key, code, slot, out, w, ranks, vocab,
                       cache, pairs)


@njit(cache=True, nogil=True, _nrt=False)
def _encode_new_ranks(buf, start, end, key, code, slot, out, w, ranks, vocab, cache, pairs):
    """`_encode_new` in RANKS order."""
    return _encode_new(_merge_leftmost, buf, start, end, key, code, slot, out, w, ranks, vocab,
                       cache, pairs)


@njit(inline="always")  # into each kernel, with its `encode_new`
def _encode_piece(encode_new, buf, start, end, out, w, ranks, vocab, cache, pairs):
    """Write the ids of pre-token buf[start:end] (at most `_HEAP_ABOVE` bytes) to out[w:];
    return the new w."""
    length = end - start
    if length == 1:
        out[w] = ranks.byte_ids[buf[start]]
        return w + 1
    slot = np.int64(0)
    key = np.int64(0)
    code = np.int64(0)
    if length <= cache.max_key_len or length <= vocab.max_key_len:
        key, code = _key(buf, start, end)
        if length <= cache.max_key_len:
            slot = _find(cache, key, code, buf, start, length)
            if slot >= 0:
                return w + _copy_ids(cache, slot, out, w)
    return w + encode_new(buf, start, end, key, code, slot, out, w, ranks, vocab, cache, pairs)


@njit(cache=True, nogil=True, _nrt=False)
def _prepare_window(buf, start, window, n, cache, keys, codes, homes):
    """For each pre-token of a window (pre-token t ends at window[t], the first starts at
    `start`): its cache key, length code and home slot, and a first read of that slot. The
    cache is several MB, so reading a slot mostly waits for memory: done for a whole window at
    once, the reads overlap instead of each pre-token waiting for its own. Returns what it read,
    folded, so the reads are not optimized away."""
    touched = np.int64(0)
    size = buf.shape[0]
    for t in range(n):
        end = window[t]
        length = end - start
        if 2 <= length <= cache.max_key_len:
            if length <= 8 and start + 8 <= size:  # the common case: one 8-byte load
                key = np.int64(_load8(buf, start) & (_ALL_ONES >> np.uint64(64 - 8 * length)))
                code = length
            else:
                key, code = _key(buf, start, end)
            home = _home(cache, key)
            keys[t] = key
            codes[t] = code
            homes[t] = home
            touched ^= cache.slots[2 * home + 1]
        start = end
    return touched


# --- the one pass ------------------------------------------------------------------------------


@njit(inline="always")  # into each family's kernel, as `spans.scan_window`
def encode_documents(scanner, block_scanner, encode_new, buf, table, doc_ends, separator,
                     specials, ranks, vocab, cache, scratch, out, doc_out_ends, out_base, doc, i):
    """Encode documents doc, doc + 1, ... of `buf` (document d ends at doc_ends[d]; the first
    starts at byte i) into `out`; return (ids written, next document, next byte, need).

    Each document is a text of its own; special tokens are cut out of it (longest first) and
    become their ids; after each document comes `separator` unless it is negative. Stops early,
    at the start of a pre-token, when `out` might not hold its ids, or when it is longer than
    `_HEAP_ABOVE` bytes (then `need` is its length, else 0: encode it with `encode_long_piece`
    and call again after it).
    `doc_out_ends[d]` receives out_base + the number of ids written up to the end of document d.
    """
    cap = out.shape[0]
    window = scratch[:WINDOW]
    keys = scratch[WINDOW : 2 * WINDOW]
    codes = scratch[2 * WINDOW : 3 * WINDOW]
    homes = scratch[3 * WINDOW : 4 * WINDOW]
    pairs = scratch[4 * WINDOW :]
    w = np.int64(0)
    n_docs = doc_ends.shape[0]
    while doc < n_docs:
        end = doc_ends[doc]
        while i < end:
            stop, which = next_special(buf, i, end, specials)
            while i < stop:
                n = scan_window(scanner, block_scanner, buf, table, i, stop, window)
                if w + (window[n - 1] - i) > cap:  # at most one id per byte
                    return w, doc, i, 0
                pairs[0] = _prepare_window(buf, i, window, n, cache, keys, codes, homes)
                for t in range(n):
                    j = window[t]
                    length = j - i
                    if length > _HEAP_ABOVE:
                        return w, doc, i, length
                    if length == 1:
                        out[w] = ranks.byte_ids[buf[i]]
                        w += 1
                    else:  # 2 <= length <= _HEAP_ABOVE < max_key_len, or no cache at all
                        slot = np.int64(0)
                        if length <= cache.max_key_len:
                            slot = _find_from(cache, homes[t], keys[t], codes[t], buf, i, length)
                        if slot >= 0 and length <= cache.max_key_len:
                            w += _copy_ids(cache, slot, out, w)
                        else:
                            key, code = _key(buf, i, j) if slot == 0 else (keys[t], codes[t])
                            w += encode_new(buf, i, j, key, code, slot, out, w, ranks, vocab,
                                            cache, pairs)
                    i = j
            if which >= 0:
                if w + 1 > cap:
                    return w, doc, i, 0
                out[w] = specials.ids[which]
                w += 1
                i = stop + specials.offsets[which + 1] - specials.offsets[which]
        if separator >= 0:
            if w + 1 > cap:
                return w, doc, i, 0
            out[w] = separator
            w += 1
        doc_out_ends[doc] = out_base + w
        doc += 1
    return w, doc, i, 0


@njit(cache=True, nogil=True, _nrt=False)
def encode_gpt2_merges(buf, table, doc_ends, separator, specials, ranks, vocab, cache, scratch,
                       out, doc_out_ends, out_base, doc, i):
    """`encode_documents` with GPT-2's scanner, in MERGES order."""
    return encode_documents(gpt2_pretoken_end, gpt2_block_boundaries, _encode_new_merges, buf,
                            table, doc_ends, separator, specials, ranks, vocab, cache, scratch,
                            out, doc_out_ends, out_base, doc, i)


@njit(cache=True, nogil=True, _nrt=False)
def encode_gpt2_ranks(buf, table, doc_ends, separator, specials, ranks, vocab, cache, scratch,
                      out, doc_out_ends, out_base, doc, i):
    """`encode_documents` with GPT-2's scanner, in RANKS order."""
    return encode_documents(gpt2_pretoken_end, gpt2_block_boundaries, _encode_new_ranks, buf,
                            table, doc_ends, separator, specials, ranks, vocab, cache, scratch,
                            out, doc_out_ends, out_base, doc, i)


@njit(cache=True, nogil=True, _nrt=False)
def encode_cl100k_merges(buf, table, doc_ends, separator, specials, ranks, vocab, cache, scratch,
                         out, doc_out_ends, out_base, doc, i):
    """`encode_documents` with cl100k's scanner, in MERGES order."""
    return encode_documents(cl100k_pretoken_end, no_blocks, _encode_new_merges, buf, table,
                            doc_ends, separator, specials, ranks, vocab, cache, scratch, out,
                            doc_out_ends, out_base, doc, i)


@njit(cache=True, nogil=True, _nrt=False)
def encode_cl100k_ranks(buf, table, doc_ends, separator, specials, ranks, vocab, cache, scratch,
                        out, doc_out_ends, out_base, doc, i):
    """`encode_documents` with cl100k's scanner, in RANKS order."""
    return encode_documents(cl100k_pretoken_end, no_blocks, _encode_new_ranks, buf, table,
                            doc_ends, separator, specials, ranks, vocab, cache, scratch, out,
                            doc_out_ends, out_base, doc, i)


@njit(cache=True, nogil=True, _nrt=False)
def encode_o200k_merges(buf, table, doc_ends, separator, specials, ranks, vocab, cache, scratch,
                        out, doc_out_ends, out_base, doc, i):
    """`encode_documents` with o200k's scanner, in MERGES order."""
    return encode_documents(o200k_pretoken_end, no_blocks, _encode_new_merges, buf, table,
                            doc_ends, separator, specials, ranks, vocab, cache, scratch, out,
                            doc_out_ends, out_base, doc, i)


@njit(cache=True, nogil=True, _nrt=False)
def encode_o200k_ranks(buf, table, doc_ends, separator, specials, ranks, vocab, cache, scratch,
                       out, doc_out_ends, out_base, doc, i):
    """`encode_documents` with o200k's scanner, in RANKS order."""
    return encode_documents(o200k_pretoken_end, no_blocks, _encode_new_ranks, buf, table,
                            doc_ends, separator, specials, ranks, vocab, cache, scratch, out,
                            doc_out_ends, out_base, doc, i)


# scanner family -> its `encode_documents` kernels, in MERGES and RANKS order
ENCODERS = {
    "gpt2": (encode_gpt2_merges, encode_gpt2_ranks),
    "cl100k": (encode_cl100k_merges, encode_cl100k_ranks),
    "o200k": (encode_o200k_merges, encode_o200k_ranks),
}


def warm_up(family: str, mode: int) -> None:
    """Compile (or load) a family's encode kernel in one merge order, on a tiny input of the
    argument types real calls use (see `kernel_cache`)."""
    from .scanners.specials import make_specials

    byte_ids = np.arange(256, dtype=np.int32)
    ranks = build_ranks(np.array([97]), np.array([98]), np.array([0]), np.array([256]), byte_ids,
                        mode)
    table, kernel = encoder_for(family, mode)
    buf = np.frombuffer(b"ab ab<|x|>", dtype=np.uint8)
    out = np.empty(len(buf) + 2, dtype=np.int32)
    kernel(buf, table, np.array([len(buf)], dtype=np.int64), -1, make_specials([("<|x|>", 257)]),
           ranks, EMPTY_TABLE, new_table(16), new_scratch(), out, np.empty(1, dtype=np.int64),
           0, 0, 0)


def encoder_for(family: str, mode: int):
    """(class table, encode kernel) of a scanner family, in merge order `mode`."""
    from .scanners import cl100k, gpt2, o200k

    tables = {"gpt2": gpt2.class_table, "cl100k": cl100k.class_table, "o200k": o200k.class_table}
    return tables[family](), ENCODERS[family][mode]


@njit(inline="always")  # into the two kernels below
def _encode_pieces(encode_new, buf, offsets, special_slots, special_ids, ranks, vocab, cache,
                   scratch, out, k):
    """The ids of pre-tokens found elsewhere (by `regex`), from piece k on: piece k is
    buf[offsets[k]:offsets[k + 1]], and the pieces listed in `special_slots` are special tokens
    with ids `special_ids`. `out` holds one id per byte. Returns (ids written, next piece,
    need): it stops before a piece longer than `_HEAP_ABOVE` bytes (`need`, its length)."""
    pairs = scratch[WINDOW:]
    w = np.int64(0)
    next_slot = np.searchsorted(special_slots, k)
    n = offsets.shape[0] - 1
    while k < n:
        if next_slot < special_slots.shape[0] and special_slots[next_slot] == k:
            out[w] = special_ids[next_slot]
            w += 1
            next_slot += 1
        elif offsets[k + 1] - offsets[k] > _HEAP_ABOVE:
            return w, k, offsets[k + 1] - offsets[k]
        elif offsets[k + 1] > offsets[k]:
            w = _encode_piece(encode_new, buf, offsets[k], offsets[k + 1], out, w, ranks, vocab,
                              cache, pairs)
        k += 1
    return w, k, 0


@njit(cache=True, nogil=True, _nrt=False)
def encode_pieces_merges(buf, offsets, special_slots, special_ids, ranks, vocab, cache, scratch,
                         out, k):
    """`_encode_pieces` in MERGES order."""
    return _encode_pieces(_encode_new_merges, buf, offsets, special_slots, special_ids, ranks,
                          vocab, cache, scratch, out, k)


@njit(cache=True, nogil=True, _nrt=False)
def encode_pieces_ranks(buf, offsets, special_slots, special_ids, ranks, vocab, cache, scratch,
                        out, k):
    """`_encode_pieces` in RANKS order."""
    return _encode_pieces(_encode_new_ranks, buf, offsets, special_slots, special_ids, ranks,
                          vocab, cache, scratch, out, k)


PIECE_ENCODERS = (encode_pieces_merges, encode_pieces_ranks)


# --- the vocab table ---------------------------------------------------------------------------


@njit(cache=True, nogil=True, _nrt=False)
def _fill_vocab_table(token_bytes, token_offsets, token_ids, ranks, table, scratch, work):
    """Store every token of two or more bytes with the ids its own bytes encode to: in RANKS
    order the token itself (tiktoken's rule), in MERGES order whatever the merges make of them
    (nearly always the token too, but a merge list need not promise it; tokens longer than
    `_HEAP_ABOVE` bytes are left to `encode_long_piece`)."""
    for t in range(token_ids.shape[0]):
        start = token_offsets[t]
        end = token_offsets[t + 1]
        length = end - start
        if length < 2 or length > table.max_key_len:
            continue
        if ranks.mode == MERGES and length > _HEAP_ABOVE:
            continue  # merged when it is met (`encode_long_piece`)
        key, code = _key(token_bytes, start, end)
        slot = _find(table, key, code, token_bytes, start, length)
        if slot >= 0:
            continue  # the same bytes twice: the first (lowest) id stays
        if ranks.mode == RANKS:
            work[0] = token_ids[t]
            m = 1
        else:
            for i in range(length):
                work[i] = ranks.byte_ids[token_bytes[start + i]]
            m = _merge_rounds(work, np.int64(0), length, scratch, ranks)
        _store(table, key, code, -1 - slot, token_bytes, start, length, work, np.int64(0), m)


def build_vocab_table(token_bytes: np.ndarray, token_offsets: np.ndarray, token_ids: np.ndarray,
                      ranks: Ranks) -> Table:
    """The vocab table of the tokens token_bytes[token_offsets[k]:token_offsets[k + 1]] with
    ids token_ids[k], in order of preference (see `_fill_vocab_table`)."""
    lengths = np.diff(token_offsets)
    longest = int(lengths.max(initial=2))
    n = int((lengths > 1).sum())
    table = Table(*new_table(max(n, 1), longest)[:4], max(n, 1) + 1, longest)
    extra = 2 * int(lengths[lengths > 1].sum()) + 3 * n + 64  # records: at most 2 + 2 * length
    table = table._replace(records=np.zeros(max(len(table.records), extra), dtype=np.int32))
    _fill_vocab_table(token_bytes, token_offsets, np.ascontiguousarray(token_ids, np.int32),
                      ranks, table, np.empty(_HEAP_ABOVE + 1, np.int64),
                      np.empty(_HEAP_ABOVE, np.int32))
    return table


@njit(cache=True, nogil=True, _nrt=False)
def _split_pairs(token_bytes, token_offsets, token_ids, byte_ids, vocab, left, right, rank):
    """Write (left, right, rank) of every way to cut a token into two tokens: the pairs that
    merge in RANKS order, each ranked by the token it makes (ids are ranks); return how many.
    The arrays have room for one per cut."""
    k = np.int64(0)
    for t in range(token_ids.shape[0]):
        i = token_ids[t]
        start = token_offsets[i]
        end = token_offsets[i + 1]
        for cut in range(start + 1, end):
            a = _token_id(token_bytes, start, cut, byte_ids, vocab)
            b = _token_id(token_bytes, cut, end, byte_ids, vocab)
            if a >= 0 and b >= 0:
                left[k] = a
                right[k] = b
                rank[k] = i
                k += 1
    return k


@njit(cache=True, nogil=True)
def _token_id(buf, start, end, byte_ids, vocab):
    """The id of token buf[start:end] (from the vocab table in RANKS order), or -1."""
    if end - start == 1:
        return byte_ids[buf[start]]
    if end - start > vocab.max_key_len:
        return -1
    key, code = _key(buf, start, end)
    s = _find(vocab, key, code, buf, start, end - start)
    if s < 0:
        return -1
    meta = vocab.slots[2 * s + 1]
    if meta & _SINGLE:
        return np.int64(meta >> 5)
    return np.int64(vocab.records[(meta >> 5) + 1])  # a long token's record: [1, its id, ...]


def build_split_ranks(token_bytes, token_offsets, token_ids, byte_ids, n_vocab: int) -> Ranks:
    """The `Ranks` of a rank file (RANKS order; ids are ranks) whose regular tokens are
    `token_ids`: every pair of tokens whose joined bytes are a token merges into it."""
    placeholder = Ranks(np.full(16, _EMPTY), 60, 8, 47, np.zeros(1, np.int32),
                        np.ascontiguousarray(byte_ids, dtype=np.int32), RANKS)
    vocab = build_vocab_table(token_bytes, token_offsets, token_ids, placeholder)
    token_ids = np.ascontiguousarray(token_ids, dtype=np.int64)
    cuts = int(np.maximum(token_offsets[token_ids + 1] - token_offsets[token_ids] - 1, 0).sum())
    left, right, rank = (np.empty(cuts, dtype=np.int64) for _ in range(3))
    n = _split_pairs(token_bytes, token_offsets, token_ids, placeholder.byte_ids, vocab, left,
                     right, rank)
    return build_ranks(left[:n], right[:n], rank[:n], np.arange(n_vocab, dtype=np.int32),
                       byte_ids, RANKS)


# --- driving the kernels -------------------------------------------------------------------------


class ThreadState:
    """What one thread's encoding writes to: its cache and its scratch space."""

    def __init__(self, cache_size: int):
        self.cache = new_table(cache_size) if cache_size else EMPTY_TABLE
        self.scratch = new_scratch()


def long_piece_ids(buf, start: int, length: int, ranks: Ranks, vocab: Table) -> np.ndarray:
    """The ids of the pre-token buf[start:start + length] (more than `_HEAP_ABOVE` bytes)."""
    out = np.empty(length, dtype=np.int32)
    return out[: encode_long_piece(buf, start, start + length, ranks, vocab, out)]


def run_encoder(kernel, buf, table, doc_ends, separator, specials: Specials, ranks: Ranks,
                vocab: Table, state: ThreadState, doc_out_ends=None):
    """All ids (int32) of the documents of `buf` (UTF-8, validated) with `kernel`, merging the
    long pre-tokens it stops at; `doc_out_ends`, if given, receives where each document's ids
    end."""
    n_docs = len(doc_ends)
    if doc_out_ends is None:
        doc_out_ends = np.empty(n_docs, dtype=np.int64)
    # At most one id per byte, plus the separators: one allocation in nearly every case.
    out = np.empty(len(buf) + (n_docs if separator >= 0 else 0) + 1, dtype=np.int32)
    parts = []
    total = w = 0
    doc = i = 0
    while doc < n_docs:
        w, doc, i, need = kernel(buf, table, doc_ends, separator, specials, ranks, vocab,
                                 state.cache, state.scratch, out, doc_out_ends, total, doc, i)
        total += w
        if doc < n_docs:
            parts.append(out[:w].copy())
            if need:
                parts.append(long_piece_ids(buf, i, need, ranks, vocab))
                total += len(parts[-1])
                i += need
    if not parts:
        return out[:w]
    parts.append(out[:w])
    return np.concatenate(parts)


def run_piece_encoder(mode: int, buf, offsets, special_slots, special_ids, ranks: Ranks,
                      vocab: Table, state: ThreadState) -> np.ndarray:
    """All ids (int32) of the pieces (see `_encode_pieces`)."""
    kernel = PIECE_ENCODERS[mode]
    out = np.empty(len(buf) + len(special_slots) + 1, dtype=np.int32)
    parts = []
    k = 0
    while True:
        w, k, need = kernel(buf, offsets, special_slots, special_ids, ranks, vocab, state.cache,
                            state.scratch, out, k)
        parts.append(out[:w].copy())
        if not need:
            break
        parts.append(long_piece_ids(buf, offsets[k], need, ranks, vocab))
        k += 1
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
