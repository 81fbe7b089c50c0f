"""The merge loop: Numba kernels that learn BPE merges over interned words.

Input: every unique pre-token ("word") as a run of byte ids in one flat int32 array, with int64
offsets and int64 occurrence counts. Output: the merges in order of creation, as pairs of token
ids where merge k creates token 256 + k.

Data structures, all flat arrays inside one compiled function:

- pair table: pair id -> (left, right, count, unweighted occurrences, head of its word list),
  found from the (left, right) key by open addressing;
- word lists: for each pair, a singly linked list of the words that held it when it was created.
  A word is appended at most once per pair, because a pair gets words only in the step that
  creates it (every new pair contains the new token); a listed word may since have lost the pair,
  which merging finds harmlessly;
- a binary max-heap over (count, left bytes, right bytes), the order of Python's
  `max((count, (left_bytes, right_bytes)))`. Counts only ever fall for pairs already in the heap,
  so entries are updated lazily: a popped entry whose count is stale goes back with its count;
- a byte arena holding each token's bytes, for the tie-break.

Each step merges every occurrence of the best pair, left to right, in only the words on its list,
rewriting each word in place and applying the count changes of the neighbouring pairs at once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_EMPTY = -1
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: Fibonacci hashing


@njit(cache=True)
def _grow(array, min_size):
    """A copy of `array` with room for at least `min_size` items (doubling)."""
    size = max(min_size, 2 * array.shape[0])
    out = np.empty(size, dtype=array.dtype)
    out[: array.shape[0]] = array
    return out


@njit(cache=True)
def _slot(keys, key, shift):
    """The table slot holding `key`, or the empty slot where it would go."""
    mask = keys.shape[0] - 1
    slot = np.int64((np.uint64(key) * _HASH_MULTIPLIER) >> np.uint64(shift))
    while keys[slot] != key and keys[slot] != _EMPTY:
        slot = (slot + 1) & mask
    return slot


@njit(cache=True)
def _rebuild_table(capacity_bits, pair_left, pair_right, n_pairs):
    keys = np.full(1 << capacity_bits, _EMPTY, dtype=np.int64)
    ids = np.empty(1 << capacity_bits, dtype=np.int64)
    shift = 64 - capacity_bits
    for p in range(n_pairs):
        key = (np.int64(pair_left[p]) << 32) | pair_right[p]
        s = _slot(keys, key, shift)
        keys[s] = key
        ids[s] = p
    return keys, ids


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


@njit(cache=True)
def _ranks_above(count_x, px, count_y, py, pair_left, pair_right, arena, start, length):
    """Whether (count_x, bytes of pair px) > (count_y, bytes of pair py)."""
    if count_x != count_y:
        return count_x > count_y
    c = _compare_bytes(arena, start, length, pair_left[px], pair_left[py])
    if c != 0:
        return c > 0
    return _compare_bytes(arena, start, length, pair_right[px], pair_right[py]) > 0


@njit(cache=True)
def _heap_push(heap_pair, heap_count, size, p, count, pair_left, pair_right, arena, start, length):
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if not _ranks_above(count, p, heap_count[parent], heap_pair[parent],
                            pair_left, pair_right, arena, start, length):
            break
        heap_pair[i] = heap_pair[parent]
        heap_count[i] = heap_count[parent]
        i = parent
    heap_pair[i] = p
    heap_count[i] = count
    return size + 1


@njit(cache=True)
def _heap_pop(heap_pair, heap_count, size, pair_left, pair_right, arena, start, length):
    """Remove the top entry; return the new size."""
    size -= 1
    p, count = heap_pair[size], heap_count[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and _ranks_above(heap_count[right], heap_pair[right],
                                         heap_count[child], heap_pair[child],
                                         pair_left, pair_right, arena, start, length):
            child = right
        if not _ranks_above(heap_count[child], heap_pair[child], count, p,
                            pair_left, pair_right, arena, start, length):
            break
        heap_pair[i] = heap_pair[child]
        heap_count[i] = heap_count[child]
        i = child
    if size > 0:
        heap_pair[i] = p
        heap_count[i] = count
    return size


@njit(cache=True)
def learn_merges(tokens, offsets, word_counts, num_merges):
    """Learn up to `num_merges` merges; return (left ids, right ids) in order of creation.

    tokens (int32, rewritten in place), offsets (int64, n_words + 1), word_counts (int64).
    Token ids 0-255 are bytes; merge k creates id 256 + k. Stops early when no pair is left.
    """
    n_words = offsets.shape[0] - 1
    lengths = offsets[1:] - offsets[:-1]

    # Token bytes, for the tie-break.
    n_ids = 256 + num_merges
    tok_start = np.empty(n_ids, dtype=np.int64)
    tok_len = np.empty(n_ids, dtype=np.int64)
    arena = np.empty(max(1024, 16 * n_ids), dtype=np.uint8)
    for t in range(256):
        arena[t] = t
        tok_start[t] = t
        tok_len[t] = 1
    arena_used = 256

    # Pair table. The first pairs are of bytes: at most 256 * 256 of them.
    pair_cap = 1 << 16
    pair_left = np.empty(pair_cap, dtype=np.int32)
    pair_right = np.empty(pair_cap, dtype=np.int32)
    pair_count = np.zeros(pair_cap, dtype=np.int64)
    pair_occ = np.zeros(pair_cap, dtype=np.int64)
    pair_head = np.empty(pair_cap, dtype=np.int64)
    pair_last_word = np.empty(pair_cap, dtype=np.int64)
    n_pairs = 0
    table_bits = 17
    keys = np.full(1 << table_bits, _EMPTY, dtype=np.int64)
    ids = np.empty(1 << table_bits, dtype=np.int64)

    # Word-list nodes.
    node_cap = max(16, tokens.shape[0])
    node_word = np.empty(node_cap, dtype=np.int64)
    node_next = np.empty(node_cap, dtype=np.int64)
    n_nodes = 0

    # Initial pair counts and word lists.
    for w in range(n_words):
        c = word_counts[w]
        for i in range(offsets[w], offsets[w + 1] - 1):
            key = (np.int64(tokens[i]) << 32) | tokens[i + 1]
            s = _slot(keys, key, 64 - table_bits)
            if keys[s] == _EMPTY:
                p = n_pairs
                n_pairs += 1
                keys[s] = key
                ids[s] = p
                pair_left[p] = tokens[i]
                pair_right[p] = tokens[i + 1]
                pair_head[p] = -1
                pair_last_word[p] = -1
            else:
                p = ids[s]
            pair_count[p] += c
            pair_occ[p] += 1
            if pair_last_word[p] != w:
                pair_last_word[p] = w
                node_word[n_nodes] = w
                node_next[n_nodes] = pair_head[p]
                pair_head[p] = n_nodes
                n_nodes += 1

    heap_pair = np.empty(pair_cap, dtype=np.int64)
    heap_count = np.empty(pair_cap, dtype=np.int64)
    heap_size = 0
    for p in range(n_pairs):
        heap_size = _heap_push(heap_pair, heap_count, heap_size, p, pair_count[p],
                               pair_left, pair_right, arena, tok_start, tok_len)

    merge_left = np.empty(num_merges, dtype=np.int32)
    merge_right = np.empty(num_merges, dtype=np.int32)
    n_merges = 0
    while n_merges < num_merges:
        # Pop until the top entry's count is current (lazy deletion).
        best = -1
        while heap_size > 0:
            p, snapshot = heap_pair[0], heap_count[0]
            heap_size = _heap_pop(heap_pair, heap_count, heap_size,
                                  pair_left, pair_right, arena, tok_start, tok_len)
            current = pair_count[p]
            if current == snapshot:
                best = p
                break
            if current > 0:
                heap_size = _heap_push(heap_pair, heap_count, heap_size, p, current,
                                       pair_left, pair_right, arena, tok_start, tok_len)
        if best < 0:
            break  # no pair left anywhere

        a = pair_left[best]
        b = pair_right[best]
        new = 256 + n_merges
        merge_left[n_merges] = a
        merge_right[n_merges] = b
        n_merges += 1

        # The new token's bytes.
        need = tok_len[a] + tok_len[b]
        if arena_used + need > arena.shape[0]:
            arena = _grow(arena, arena_used + need)
        tok_start[new] = arena_used
        tok_len[new] = need
        arena[arena_used : arena_used + tok_len[a]] = arena[tok_start[a] : tok_start[a] + tok_len[a]]
        arena[arena_used + tok_len[a] : arena_used + need] = (
            arena[tok_start[b] : tok_start[b] + tok_len[b]]
        )
        arena_used += need

        # Room for this step: each occurrence creates at most two new pairs and two list nodes.
        most_new = 2 * pair_occ[best]
        if n_pairs + most_new > pair_cap:
            pair_cap = max(2 * pair_cap, n_pairs + most_new)
            pair_left = _grow(pair_left, pair_cap)
            pair_right = _grow(pair_right, pair_cap)
            pair_count = _grow(pair_count, pair_cap)
            pair_occ = _grow(pair_occ, pair_cap)
            pair_head = _grow(pair_head, pair_cap)
            pair_last_word = _grow(pair_last_word, pair_cap)
        while 2 * (n_pairs + most_new) > (1 << table_bits):
            table_bits += 1
            keys, ids = _rebuild_table(table_bits, pair_left, pair_right, n_pairs)
        if n_nodes + most_new > node_word.shape[0]:
            node_word = _grow(node_word, n_nodes + most_new)
            node_next = _grow(node_next, n_nodes + most_new)
        if heap_size + most_new > heap_pair.shape[0]:
            heap_pair = _grow(heap_pair, heap_size + most_new)
            heap_count = _grow(heap_count, heap_size + most_new)
        shift = 64 - table_bits
        first_new_pair = n_pairs

        node = pair_head[best]
        while node != -1:
            w = node_word[node]
            node = node_next[node]
            begin = offsets[w]
            end = begin + lengths[w]
            c = word_counts[w]
            i = begin
            j = begin  # write position: the word is rewritten in place
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
                        old = ids[_slot(keys, old_key, shift)]
                        pair_count[old] -= c
                        pair_occ[old] -= 1
                        new_key = (np.int64(new_left) << 32) | new_right
                        s = _slot(keys, new_key, shift)
                        if keys[s] == _EMPTY:
                            p = n_pairs
                            n_pairs += 1
                            keys[s] = new_key
                            ids[s] = p
                            pair_left[p] = new_left
                            pair_right[p] = new_right
                            pair_count[p] = 0
                            pair_occ[p] = 0
                            pair_head[p] = -1
                            pair_last_word[p] = -1
                        else:
                            p = ids[s]
                        pair_count[p] += c
                        pair_occ[p] += 1
                        if pair_last_word[p] != w:
                            pair_last_word[p] = w
                            node_word[n_nodes] = w
                            node_next[n_nodes] = pair_head[p]
                            pair_head[p] = n_nodes
                            n_nodes += 1
                    tokens[j] = new
                    i += 2
                else:
                    tokens[j] = tokens[i]
                    i += 1
                j += 1
            lengths[w] = j - begin

        # Every pair holding the new token was created in this step.
        for p in range(first_new_pair, n_pairs):
            if pair_count[p] > 0:
                heap_size = _heap_push(heap_pair, heap_count, heap_size, p, pair_count[p],
                                       pair_left, pair_right, arena, tok_start, tok_len)

    return merge_left[:n_merges], merge_right[:n_merges]
