"""The merge loop: Numba kernels that learn BPE merges over interned words.

Input: every unique pre-token ("word") as a run of byte ids in one flat int32 array, with int64
offsets and int64 occurrence counts. Output: the merges in order of creation, as pairs of token
ids where merge k creates token 256 + k.

Data structures, all flat arrays inside one compiled function:

- pair table: pair id -> (left, right, count, unweighted occurrences, head of its word list),
  found from the (left, right) key by open addressing;
- word lists: for each pair, the words that held it when it was created, stored contiguously
  and in ascending order (so a merge reads them sequentially). A pair gets words only in the step
  that creates it (every new pair contains the new token), so each list is written once, with
  each word at most once; a listed word may since have lost the pair, which merging finds
  harmlessly;
- a binary max-heap over (count, left bytes, right bytes), the order of Python's
  `max((count, (left_bytes, right_bytes)))`. A pair's count never rises after the step that
  creates it, so entries are updated lazily (a popped entry whose count is stale goes back with
  its count), and new pairs counted below a threshold wait outside the heap until the heap's
  best falls below it: most never enter it at all;
- a byte arena holding each token's bytes, for the tie-break.

Each step merges every occurrence of the best pair, left to right, in only the words on its list,
rewriting each word in place and applying the count changes of the neighbouring pairs at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
from numba import njit

from . import kernel_cache  # noqa: F401  (first: keys the cached kernels, see kernel_cache)

_EMPTY = -1
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: Fibonacci hashing


# Progress of the merge loop: `learn_merges` keeps the merges done so far in progress[0], and
# `merges_with_progress` reads it from another thread while the kernel runs (it holds no GIL)
# and tells the listeners. A kernel calling back into Python (`objmode`) took more to compile:
# 6.3 against 5.9 CPU-s for `learn_merges` (medians of 6 alternated cold compiles).
_merge_listeners: list[Callable[[int], object]] = []
_REPORT_EVERY_S = 0.1


def _report_merges(n_merges: int) -> None:
    for listener in _merge_listeners:
        listener(n_merges)


@contextmanager
def merge_progress(listener: Callable[[int], object]):
    """Call `listener(merges done so far)` while `merges_with_progress` runs in this block:
    about every 0.1 s while the merges run, and once at the end."""
    _merge_listeners.append(listener)
    try:
        yield
    finally:
        _merge_listeners.remove(listener)


def merges_with_progress(tokens, offsets, word_counts, num_merges: int):
    """`learn_merges`, telling the `merge_progress` listeners, if any, how far it is."""
    progress = np.zeros(1, dtype=np.int64)
    if not _merge_listeners:
        return learn_merges(tokens, offsets, word_counts, num_merges, progress)
    done = threading.Event()
    reported = [0]  # the last count told

    def report():
        while not done.wait(_REPORT_EVERY_S):
            now = int(progress[0])
            if now != reported[0]:
                _report_merges(now)
                reported[0] = now

    reporter = threading.Thread(target=report, name="nbbpe-merge-progress", daemon=True)
    reporter.start()
    try:
        left, right = learn_merges(tokens, offsets, word_counts, num_merges, progress)
    finally:
        done.set()
        reporter.join()
    if reported[0] != len(left):  # the end, unless the reporter told it last
        _report_merges(len(left))
    return left, right


@njit(cache=True, nogil=True)
def grow(array, min_size):
    """A copy of `array` with room for at least `min_size` items (doubling). Counting uses it
    too: one compiled copy per array type for both stages (each costs ~0.2 s to compile)."""
    size = max(min_size, 2 * array.shape[0])
    out = np.empty(size, dtype=array.dtype)
    for i in range(array.shape[0]):  # a loop, not a slice assignment: much faster to compile
        out[i] = array[i]
    return out


@njit(cache=True)
def _slot(table, key, shift):
    """The row of `table` (key, pair id) holding `key`, or the empty row where it would go."""
    mask = table.shape[0] - 1
    slot = np.int64((np.uint64(key) * _HASH_MULTIPLIER) >> np.uint64(shift))
    while table[slot, 0] != key and table[slot, 0] != _EMPTY:
        slot = (slot + 1) & mask
    return slot


@njit(cache=True)
def _new_table(capacity_bits, pair_left, pair_right, n_pairs):
    """A (key, pair id) table of 2**capacity_bits rows holding the first n_pairs pairs.

    Key and id share a row so that a lookup touches one cache line.
    """
    table = np.empty((1 << capacity_bits, 2), dtype=np.int64)
    for s in range(1 << capacity_bits):
        table[s, 0] = _EMPTY
    shift = 64 - capacity_bits
    for p in range(n_pairs):
        key = (np.int64(pair_left[p]) << 32) | pair_right[p]
        s = _slot(table, key, shift)
        table[s, 0] = key
        table[s, 1] = p
    return table


@njit(cache=True)
def _grow_rows(array, min_rows):
    """A copy of a 2-D `array` with room for at least `min_rows` rows (doubling)."""
    rows = max(min_rows, 2 * array.shape[0])
    out = np.empty((rows, array.shape[1]), dtype=array.dtype)
    for i in range(array.shape[0]):
        for j in range(array.shape[1]):
            out[i, j] = array[i, j]
    return out


@njit(cache=True)
def _prefix_key(arena, start, length):
    """The first 8 bytes, big-endian and zero-padded, with the sign bit flipped.

    Signed order of these keys is the bytes' order wherever two keys differ, so most ties are
    decided without reading the arena. Equal keys need the full comparison ("a" vs "a\\x00").
    """
    key = np.uint64(0)
    for k in range(8):
        key <<= np.uint64(8)
        if k < length:
            key |= np.uint64(arena[start + k])
    return np.int64(key ^ np.uint64(1 << 63))


@njit(cache=True)
def _compare_bytes(arena, start, length, a, b):
    """-1, 0 or 1 as the bytes of token a compare with those of token b (Python order)."""
    if a == b:
        return 0
    sa, la, sb, lb = start[a], length[a], start[b], length[b]
    for k in range(min(la, lb)):
        x, y = arena[sa + k], arena[sb + k]
        if x != y:
            return 1 if x > y else -1
    if la == lb:
        return 0
    return 1 if la > lb else -1


# A heap entry is a row (count, left prefix key, right prefix key, pair id); rows are compared
# as (count, left bytes, right bytes), the prefix keys settling most byte comparisons.
_COUNT, _LEFT_KEY, _RIGHT_KEY, _PAIR = 0, 1, 2, 3


@njit(cache=True)
def _ranks_above(count_x, lkey_x, rkey_x, px, count_y, lkey_y, rkey_y, py,
                 pair_left, pair_right, arena, start, length):
    """Whether entry x ranks above entry y in (count, left bytes, right bytes) order."""
    if count_x != count_y:
        return count_x > count_y
    if lkey_x != lkey_y:
        return lkey_x > lkey_y
    c = _compare_bytes(arena, start, length, pair_left[px], pair_left[py])
    if c != 0:
        return c > 0
    if rkey_x != rkey_y:
        return rkey_x > rkey_y
    return _compare_bytes(arena, start, length, pair_right[px], pair_right[py]) > 0


@njit(cache=True)
def _heap_push(heap, size, p, count, pair_left, pair_right, tok_key, arena, start, length):
    """Add pair p with `count`; return the new size. Row `size` must exist."""
    lkey = tok_key[pair_left[p]]
    rkey = tok_key[pair_right[p]]
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if not _ranks_above(count, lkey, rkey, p,
                            heap[parent, 0], heap[parent, 1], heap[parent, 2], heap[parent, 3],
                            pair_left, pair_right, arena, start, length):
            break
        for col in range(4):
            heap[i, col] = heap[parent, col]
        i = parent
    heap[i, _COUNT] = count
    heap[i, _LEFT_KEY] = lkey
    heap[i, _RIGHT_KEY] = rkey
    heap[i, _PAIR] = p
    return size + 1


@njit(cache=True)
def _heap_pop(heap, size, pair_left, pair_right, arena, start, length):
    """Remove the top row; return the new size."""
    size -= 1
    count, lkey, rkey, p = heap[size, 0], heap[size, 1], heap[size, 2], heap[size, 3]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _ranks_above(
                heap[child + 1, 0], heap[child + 1, 1], heap[child + 1, 2], heap[child + 1, 3],
                heap[child, 0], heap[child, 1], heap[child, 2], heap[child, 3],
                pair_left, pair_right, arena, start, length):
            child += 1
        if not _ranks_above(heap[child, 0], heap[child, 1], heap[child, 2], heap[child, 3],
                            count, lkey, rkey, p, pair_left, pair_right, arena, start, length):
            break
        for col in range(4):
            heap[i, col] = heap[child, col]
        i = child
    if size > 0:
        heap[i, _COUNT] = count
        heap[i, _LEFT_KEY] = lkey
        heap[i, _RIGHT_KEY] = rkey
        heap[i, _PAIR] = p
    return size


@njit(cache=True)
def _file_word_lists(entry_pair, entry_word, n_entries, first_pair, n_pairs,
                     list_words, n_listed, list_start, list_end, scratch):
    """Store the (pair, word) entries of one step as one contiguous word list per pair.

    Every entry's pair is in [first_pair, n_pairs) (the pairs created in that step). A counting
    sort by pair keeps each list in the order the words were met (ascending), so a later merge
    reads its words sequentially. Returns the new number of stored words.
    """
    n = n_pairs - first_pair
    for q in range(n + 1):
        scratch[q] = 0
    for k in range(n_entries):
        scratch[entry_pair[k] - first_pair + 1] += 1
    for q in range(n):
        scratch[q + 1] += scratch[q]
    for q in range(n):
        list_start[first_pair + q] = n_listed + scratch[q]
        list_end[first_pair + q] = n_listed + scratch[q + 1]
    for k in range(n_entries):
        q = entry_pair[k] - first_pair
        list_words[n_listed + scratch[q]] = entry_word[k]
        scratch[q] += 1
    return n_listed + n_entries


@njit(cache=True, nogil=True)
def learn_merges(tokens, offsets, word_counts, num_merges, progress):
    """Learn up to `num_merges` merges; return (left ids, right ids) in order of creation.

    tokens (int32, rewritten in place), offsets (int64, n_words + 1), word_counts (int64).
    Token ids 0-255 are bytes; merge k creates id 256 + k. Stops early when no pair is left.
    progress[0] (int64) holds the merges done so far (see `merges_with_progress`).
    """
    n_words = offsets.shape[0] - 1
    # Per word, in one row so a visit touches one cache line: start, current length, count, and
    # a 64-bit filter with bit (t & 63) set for each token t in the word. Nearly half the words on
    # a pair's list have lost the pair by the time it merges; the filter skips most of them
    # without reading their tokens.
    words = np.empty((n_words, 4), dtype=np.int64)
    for w in range(n_words):
        words[w, 0] = offsets[w]
        words[w, 1] = offsets[w + 1] - offsets[w]
        words[w, 2] = word_counts[w]
        bits = 0
        for i in range(offsets[w], offsets[w + 1]):
            bits |= np.int64(1) << (tokens[i] & 63)
        words[w, 3] = bits

    # Token bytes, for the tie-break.
    n_ids = 256 + num_merges
    tok_start = np.empty(n_ids, dtype=np.int64)
    tok_len = np.empty(n_ids, dtype=np.int64)
    tok_key = np.empty(n_ids, dtype=np.int64)
    arena = np.empty(max(1024, 16 * n_ids), dtype=np.uint8)
    for t in range(256):
        arena[t] = t
        tok_start[t] = t
        tok_len[t] = 1
    for t in range(256):
        tok_key[t] = _prefix_key(arena, t, np.int64(1))
    arena_used = np.int64(256)

    # Pair table. The first pairs are of bytes: at most 256 * 256 of them.
    pair_cap = 1 << 16
    pair_left = np.empty(pair_cap, dtype=np.int32)
    pair_right = np.empty(pair_cap, dtype=np.int32)
    pair_count = np.zeros(pair_cap, dtype=np.int64)
    pair_occ = np.zeros(pair_cap, dtype=np.int64)
    pair_last_word = np.empty(pair_cap, dtype=np.int64)
    list_start = np.empty(pair_cap, dtype=np.int64)
    list_end = np.empty(pair_cap, dtype=np.int64)
    # np.int64, not literal constants: a literal argument would compile the callee again
    n_pairs = np.int64(0)
    table_bits = np.int64(17)
    table = _new_table(table_bits, pair_left, pair_right, n_pairs)

    # Word lists: the (pair, word) entries a step creates, then filed contiguously per pair.
    entry_cap = max(16, tokens.shape[0])
    entry_pair = np.empty(entry_cap, dtype=np.int32)
    entry_word = np.empty(entry_cap, dtype=np.int32)
    n_entries = np.int64(0)
    list_words = np.empty(entry_cap, dtype=np.int32)
    n_listed = np.int64(0)
    scratch = np.empty(max(pair_cap, 2 * n_ids) + 2, dtype=np.int64)

    # Initial pair counts and word lists.
    for w in range(n_words):
        c = word_counts[w]
        for i in range(offsets[w], offsets[w + 1] - 1):
            key = (np.int64(tokens[i]) << 32) | tokens[i + 1]
            s = _slot(table, key, 64 - table_bits)
            if table[s, 0] == _EMPTY:
                p = n_pairs
                n_pairs += 1
                table[s, 0] = key
                table[s, 1] = p
                pair_left[p] = tokens[i]
                pair_right[p] = tokens[i + 1]
                pair_last_word[p] = -1
            else:
                p = table[s, 1]
            pair_count[p] += c
            pair_occ[p] += 1
            if pair_last_word[p] != w:
                pair_last_word[p] = w
                entry_pair[n_entries] = p
                entry_word[n_entries] = w
                n_entries += 1
    n_listed = _file_word_lists(entry_pair, entry_word, n_entries, np.int64(0), n_pairs,
                                list_words, n_listed, list_start, list_end, scratch)

    heap = np.empty((pair_cap, 4), dtype=np.int64)
    heap_size = np.int64(0)
    for p in range(n_pairs):
        heap_size = _heap_push(heap, heap_size, p, pair_count[p],
                               pair_left, pair_right, tok_key, arena, tok_start, tok_len)

    # New pairs counted below `threshold` wait in `deferred` instead of the heap: counts never
    # rise, so such a pair cannot be chosen before the heap's best falls below the threshold,
    # and most never are. Invariant: every pair with count >= threshold is in the heap.
    threshold = np.int64(0)
    deferred = np.empty(pair_cap, dtype=np.int64)
    n_deferred = np.int64(0)

    merge_left = np.empty(num_merges, dtype=np.int32)
    merge_right = np.empty(num_merges, dtype=np.int32)
    n_merges = np.int64(0)
    while n_merges < num_merges:
        # Pop until the top entry's count is current (lazy deletion) and not below the
        # threshold; else lower the threshold and bring in the deferred pairs that reach it.
        best = -1
        while True:
            if heap_size == 0 and n_deferred == 0:
                break
            if heap_size > 0:
                p, snapshot = heap[0, _PAIR], heap[0, _COUNT]
                current = pair_count[p]
                if current != snapshot or current == 0:
                    heap_size = _heap_pop(heap, heap_size, pair_left, pair_right,
                                          arena, tok_start, tok_len)
                    if current > 0:
                        heap_size = _heap_push(heap, heap_size, p, current, pair_left,
                                               pair_right, tok_key, arena, tok_start, tok_len)
                    continue
                if current >= threshold:
                    heap_size = _heap_pop(heap, heap_size, pair_left, pair_right,
                                          arena, tok_start, tok_len)
                    best = p
                    break
                threshold = current // 2
            else:
                threshold = 0
            if heap_size + n_deferred > heap.shape[0]:
                heap = _grow_rows(heap, heap_size + n_deferred)
            kept = 0
            for k in range(n_deferred):
                q = deferred[k]
                if pair_count[q] > 0 and pair_count[q] >= threshold:
                    heap_size = _heap_push(heap, heap_size, q, pair_count[q], pair_left,
                                           pair_right, tok_key, arena, tok_start, tok_len)
                elif pair_count[q] > 0:
                    deferred[kept] = q
                    kept += 1
            n_deferred = kept
        if best < 0:
            break  # no pair left anywhere
        threshold = max(threshold, pair_count[best] // 2)

        a = pair_left[best]
        b = pair_right[best]
        new = 256 + n_merges
        merge_left[n_merges] = a
        merge_right[n_merges] = b
        n_merges += 1

        # The new token's bytes.
        need = tok_len[a] + tok_len[b]
        if arena_used + need > arena.shape[0]:
            arena = grow(arena, arena_used + need)
        tok_start[new] = arena_used
        tok_len[new] = need
        for k in range(tok_len[a]):
            arena[arena_used + k] = arena[tok_start[a] + k]
        for k in range(tok_len[b]):
            arena[arena_used + tok_len[a] + k] = arena[tok_start[b] + k]
        tok_key[new] = _prefix_key(arena, arena_used, need)
        arena_used += need

        # Room for this step: each occurrence creates at most two new pairs and two list entries,
        # and every new pair is (t, new) or (new, t) for an existing token t, or (new, new).
        most_new = 2 * pair_occ[best]
        most_new_pairs = min(most_new, 2 * new + 1)
        if n_pairs + most_new_pairs > pair_cap:
            pair_cap = max(2 * pair_cap, n_pairs + most_new_pairs)
            pair_left = grow(pair_left, pair_cap)
            pair_right = grow(pair_right, pair_cap)
            pair_count = grow(pair_count, pair_cap)
            pair_occ = grow(pair_occ, pair_cap)
            pair_last_word = grow(pair_last_word, pair_cap)
            list_start = grow(list_start, pair_cap)
            list_end = grow(list_end, pair_cap)
        while 2 * (n_pairs + most_new_pairs) > (1 << table_bits):  # load at most 1/2
            table_bits += 1
            table = _new_table(table_bits, pair_left, pair_right, n_pairs)
        if most_new > entry_pair.shape[0]:
            entry_pair = grow(entry_pair, most_new)
            entry_word = grow(entry_word, most_new)
        if n_listed + most_new > list_words.shape[0]:
            list_words = grow(list_words, n_listed + most_new)
        if heap_size + most_new_pairs > heap.shape[0]:
            heap = _grow_rows(heap, heap_size + most_new_pairs)
        shift = 64 - table_bits
        first_new_pair = n_pairs
        n_entries = np.int64(0)

        need_bits = (np.int64(1) << (a & 63)) | (np.int64(1) << (b & 63))
        for k in range(list_start[best], list_end[best]):
            w = list_words[k]
            if words[w, 3] & need_bits != need_bits:
                continue  # a or b is gone from this word
            begin = words[w, 0]
            end = begin + words[w, 1]
            c = words[w, 2]
            i = begin
            j = begin  # write position: the word is rewritten in place
            bits = 0
            while i < end:
                if i + 1 < end and tokens[i] == a and tokens[i + 1] == b:
                    pair_count[best] -= c
                    pair_occ[best] -= 1
                    # (prev, a) becomes (prev, new); prev may be a token just merged.
                    # (b, next) becomes (new, next).
                    for side in range(2):
                        if side == 0:
                            if j == begin:
                                continue
                            old_key = (np.int64(tokens[j - 1]) << 32) | a
                            new_left, new_right = tokens[j - 1], np.int32(new)
                        else:
                            if i + 2 >= end:
                                continue
                            old_key = (np.int64(b) << 32) | tokens[i + 2]
                            new_left, new_right = np.int32(new), tokens[i + 2]
                        old = table[_slot(table, old_key, shift), 1]
                        pair_count[old] -= c
                        pair_occ[old] -= 1
                        # Count (new_left, new_right) as the initial pass counts a pair. Written
                        # out, not shared in a function: passing these arrays to a call in this
                        # loop costs reference counting that made the whole loop 1.5x slower.
                        new_key = (np.int64(new_left) << 32) | new_right
                        s = _slot(table, new_key, shift)
                        if table[s, 0] == _EMPTY:
                            p = n_pairs
                            n_pairs += 1
                            table[s, 0] = new_key
                            table[s, 1] = p
                            pair_left[p] = new_left
                            pair_right[p] = new_right
                            pair_count[p] = 0
                            pair_occ[p] = 0
                            pair_last_word[p] = -1
                        else:
                            p = table[s, 1]
                        pair_count[p] += c
                        pair_occ[p] += 1
                        if pair_last_word[p] != w:
                            pair_last_word[p] = w
                            entry_pair[n_entries] = p
                            entry_word[n_entries] = w
                            n_entries += 1
                    tokens[j] = new
                    i += 2
                else:
                    tokens[j] = tokens[i]
                    i += 1
                bits |= np.int64(1) << (tokens[j] & 63)
                j += 1
            words[w, 1] = j - begin
            words[w, 3] = bits

        n_listed = _file_word_lists(entry_pair, entry_word, n_entries, first_new_pair, n_pairs,
                                    list_words, n_listed, list_start, list_end, scratch)
        # Every pair holding the new token was created in this step.
        if n_deferred + most_new_pairs > deferred.shape[0]:
            deferred = grow(deferred, n_deferred + most_new_pairs)
        for p in range(first_new_pair, n_pairs):
            if pair_count[p] > 0 and pair_count[p] >= threshold:
                heap_size = _heap_push(heap, heap_size, p, pair_count[p],
                                       pair_left, pair_right, tok_key, arena, tok_start, tok_len)
            elif pair_count[p] > 0:
                deferred[n_deferred] = p
                n_deferred += 1
        progress[0] = n_merges

    return merge_left[:n_merges], merge_right[:n_merges]


def compile_helpers(all_of_them: bool = False) -> None:
    """On a first run, while another process compiles `learn_merges` (`load_merge_kernels`):
    compile here some of the helpers it types, so that it loads them from the cache when it
    gets there (or waits for this process to finish one: `kernel_cache`).

    By default `_file_word_lists` (~1.5 s into its compile) and those it types last (~3 s in):
    this process counts next, compiling the counting kernel, and with these it ends about when
    the other does (on the first `nbbpe train`, that process was the one the run waited for).
    With `all_of_them` (this process compiles no counting kernel): every helper, from the last
    it types back to the first, while it compiles those it meets first itself; where they meet,
    one loads what the other made. In its order, this process was the one waited for: the
    other typed the next helper sooner than this one had it compiled."""
    ids = np.zeros(1, dtype=np.int32)
    ends = np.zeros(1, dtype=np.int64)
    one = np.int64(1)
    heap = np.zeros((1, 4), dtype=np.int64)
    arena = np.zeros(1, dtype=np.uint8)
    # learn_merges' helpers, called with the argument types of its calls, in the order it first
    # types them: these two, `_file_word_lists`, the heap's two, then the growing of arrays
    typed_first = [lambda: _prefix_key(arena, one, one),
                   lambda: _new_table(one, ids, ids, np.int64(0))]
    word_lists = [lambda: _file_word_lists(ids, ids, 0, 0, 0, ids, 0, ends, ends, ends)]
    heap_calls = [
        lambda: _heap_push(heap, np.int64(0), one, one, ids, ids, ends, arena, ends, ends),
        lambda: _heap_pop(heap, one, ids, ids, arena, ends, ends)]
    typed_last = [lambda: _grow_rows(heap, 1)] + [
        lambda array=np.zeros(1, dtype=dtype): grow(array, 1)
        for dtype in (np.uint8, np.int32, np.int64)]
    if all_of_them:
        helpers = (typed_first + word_lists + heap_calls + typed_last)[::-1]
    else:
        helpers = word_lists + typed_last
    for compile_helper in helpers:
        compile_helper()


def load_merge_kernels() -> None:
    """Compile, or load from Numba's cache, the merge kernels, by running them on a tiny input."""
    # The same argument types as train_bpe's call.
    learn_merges(np.zeros(2, np.int32), np.array([0, 2], np.int64), np.ones(1, np.int64), 1,
                 np.zeros(1, np.int64))
