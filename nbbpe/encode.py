"""Encoding kernels: pre-token bytes -> token ids by merge rank, with a cache of repeats.

Input of the main kernel, `encode_pretokens`: the UTF-8 bytes of many pre-tokens in one flat
uint8 buffer, int64 offsets (pre-token k is `data[offsets[k]:offsets[k + 1]]`), and the indices
of the pre-tokens that are special tokens with their ids. Any pre-tokenizer that produces such
offsets (the `regex` one in tokenizer.py, or a compiled scanner) can feed it.

Data structures, all flat arrays:

- rank table: the merges as an open-addressing hash table keyed by the pair of token ids
  (left << 32 | right), giving the merge's rank and the id of the token it creates;
- cache: already-encoded pre-tokens, keyed by their bytes (FNV-1a hash, open addressing), each
  entry's bytes and ids in one record of a flat arena. It has a fixed size and is emptied at once
  when full: memory stays bounded and the frequent pre-tokens come straight back.

Merging follows GPT-2's `bpe()`: each round takes the pair of lowest rank anywhere in the
pre-token and merges all its occurrences left to right, non-overlapping (`a a a` -> `aa a`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

NO_MERGE = np.int64(np.iinfo(np.int64).max)  # sorts after every (rank << 32 | merged id)
_EMPTY = np.int64(-1)
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: Fibonacci hashing
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


class RankTable(NamedTuple):
    """Merges as a hash table over token-id pairs: pair -> (rank, merged id).

    Slot s is `entries[2s]`, the key (left << 32 | right, -1 where empty), and `entries[2s + 1]`,
    the merge (rank << 32 | merged id): one probe reads one cache line, and merges compare by
    rank as plain integers.
    """

    entries: np.ndarray  # int64; twice a power of two
    shift: int  # 64 - log2(number of slots): the top bits of the hashed key pick the slot
    byte_ids: np.ndarray  # int32[256]: the id of each single byte


class EncodeCache(NamedTuple):
    """Encoded pre-tokens by their bytes; emptied whenever it is full.

    `slots` is the hash table: 0 where empty, else (upper 32 bits of the key's hash) << 32 |
    (record + 1). A record in `records` is [number of bytes, number of ids, the ids, the bytes
    one per item], so a hit reads one slot and one record, mostly a single cache line each.
    """

    slots: np.ndarray  # int64; length a power of two
    records: np.ndarray  # int32
    fill: np.ndarray  # int64[3]: items of `records` used, entries, times emptied
    shift: int  # 64 - log2(len(slots))
    max_entries: int  # at most half the slots, so probes stay short
    max_key_len: int  # longer pre-tokens are not cached (rare, and would crowd out the rest)


def build_rank_table(left: np.ndarray, right: np.ndarray, merged: np.ndarray,
                     byte_ids: np.ndarray) -> RankTable:
    """The rank table of merges `(left[r], right[r]) -> merged[r]`, rank r being the position.

    The pairs must be distinct (the caller checks, naming the duplicate).
    """
    n = len(left)
    bits = max(4, int(2 * n - 1).bit_length())  # load factor at most 1/2
    entries = _fill_rank_table(
        np.ascontiguousarray(left, dtype=np.int32),
        np.ascontiguousarray(right, dtype=np.int32),
        np.ascontiguousarray(merged, dtype=np.int32),
        bits,
    )
    return RankTable(entries, 64 - bits, np.ascontiguousarray(byte_ids, dtype=np.int32))


def new_cache(max_entries: int = 1 << 17, max_key_len: int = 64) -> EncodeCache:
    """An empty cache for up to `max_entries` pre-tokens of at most `max_key_len` bytes."""
    max_entries = min(max(1, int(max_entries)), 1 << 26)
    bits = int(2 * max_entries - 1).bit_length()
    words = max(max_entries * 12, 2 + 2 * max_key_len)  # a mean record is 8-10 items
    return EncodeCache(
        slots=np.zeros(1 << bits, dtype=np.int64),
        records=np.zeros(words, dtype=np.int32),
        fill=np.zeros(3, dtype=np.int64),
        shift=64 - bits,
        max_entries=max_entries,
        max_key_len=int(max_key_len),
    )


def encode_pretokens(data: np.ndarray, offsets: np.ndarray, special_slots: np.ndarray,
                     special_ids: np.ndarray, table: RankTable, cache: EncodeCache | None) -> np.ndarray:
    """Token ids (int32) of all pre-tokens, in order; see the module docstring for the input."""
    if cache is None:
        cache = _NO_CACHE
    return _encode_pretokens(
        data, offsets, special_slots, special_ids,
        table.entries, table.shift, table.byte_ids,
        cache.slots, cache.records, cache.fill, cache.shift, cache.max_entries, cache.max_key_len,
    )


# --- kernels -------------------------------------------------------------------------------


@njit(cache=True)
def _fill_rank_table(left, right, merged, bits):
    size = 1 << bits
    entries = np.full(2 * size, _EMPTY, dtype=np.int64)
    shift = 64 - bits
    mask = size - 1
    for r in range(left.shape[0]):
        key = (np.int64(left[r]) << 32) | np.int64(right[r])
        slot = np.int64((np.uint64(key) * _HASH_MULTIPLIER) >> np.uint64(shift))
        while entries[2 * slot] != _EMPTY and entries[2 * slot] != key:
            slot = (slot + 1) & mask
        entries[2 * slot] = key
        entries[2 * slot + 1] = (np.int64(r) << 32) | np.int64(merged[r])
    return entries


@njit(cache=True, inline="always")
def _pair_merge(entries, shift, a, b):
    """(rank << 32 | merged id) of pair (a, b), or NO_MERGE if it is not a merge."""
    key = (np.int64(a) << 32) | np.int64(b)
    mask = (entries.shape[0] >> 1) - 1
    slot = np.int64((np.uint64(key) * _HASH_MULTIPLIER) >> np.uint64(shift))
    while True:
        k = entries[2 * slot]
        if k == key:
            return entries[2 * slot + 1]
        if k == _EMPTY:
            return NO_MERGE
        slot = (slot + 1) & mask


@njit(cache=True)
def _merge(work, merges, m, entries, shift):
    """Merge `work[:m]` in place, GPT-2 style; return the new length.

    `merges[i]` is the merge (rank << 32 | merged id) of pair (work[i], work[i + 1]). A round
    finds the lowest, then sweeps from its first occurrence, merging every occurrence left to
    right and updating the pairs that change; pairs between untouched tokens keep theirs.
    """
    for i in range(m - 1):
        merges[i] = _pair_merge(entries, shift, work[i], work[i + 1])
    while m > 1:
        best = NO_MERGE
        at = -1
        for i in range(m - 1):
            if merges[i] < best:
                best = merges[i]
                at = i
        if at < 0:
            break
        merged = np.int32(best & 0xFFFFFFFF)
        # Each rank belongs to one pair, so merges[i] == best marks an occurrence of it. Writes
        # go to w <= i, behind the reads, so the sweep can rewrite work and merges in place.
        w = at
        i = at
        prev_copied = at > 0  # work[w - 1] is the old token at i - 1, unchanged
        while i < m:
            if i < m - 1 and merges[i] == best:
                token = merged
                copied = False
                step = 2
            else:
                token = work[i]
                copied = True
                step = 1
            if w > 0:
                if copied and prev_copied:
                    merges[w - 1] = merges[i - 1]
                else:
                    merges[w - 1] = _pair_merge(entries, shift, work[w - 1], token)
            work[w] = token
            prev_copied = copied
            w += 1
            i += step
        m = w
    return m


@njit(cache=True, inline="always")
def _hash_bytes(data, start, end):
    h = _FNV_OFFSET
    for i in range(start, end):
        h = (h ^ np.uint64(data[i])) * _FNV_PRIME
    return h


@njit(cache=True)
def _encode_pretokens(data, offsets, special_slots, special_ids,
                      entries, shift, byte_ids,
                      slots, records, fill, cache_shift, max_entries, max_key_len):
    n = offsets.shape[0] - 1
    longest = 1
    for k in range(n):
        longest = max(longest, offsets[k + 1] - offsets[k])
    work = np.empty(longest, dtype=np.int32)
    merges = np.empty(longest, dtype=np.int64)
    out = np.empty(offsets[n] - offsets[0] + 1, dtype=np.int32)  # at most one id per byte
    w = 0
    next_special = 0
    n_special = special_slots.shape[0]
    slot_mask = slots.shape[0] - 1
    room = records.shape[0]
    high = np.uint64(0xFFFFFFFF00000000)

    for k in range(n):
        if next_special < n_special and special_slots[next_special] == k:
            out[w] = special_ids[next_special]
            w += 1
            next_special += 1
            continue
        start = offsets[k]
        end = offsets[k + 1]
        length = end - start
        if length == 1:
            out[w] = byte_ids[data[start]]
            w += 1
            continue
        if length == 0:
            continue

        cacheable = length <= max_key_len
        tag = np.int64(0)
        slot = np.int64(0)
        if cacheable:
            h = _hash_bytes(data, start, end)
            tag = np.int64(h & high)
            slot = np.int64((h * _HASH_MULTIPLIER) >> np.uint64(cache_shift))
            found = -1
            while slots[slot] != 0:
                entry = slots[slot]
                if (entry & np.int64(high)) == tag:
                    r = (entry & 0xFFFFFFFF) - 1
                    if records[r] == length:
                        key = r + 2 + records[r + 1]
                        same = True
                        for i in range(length):
                            if records[key + i] != data[start + i]:
                                same = False
                                break
                        if same:
                            found = r
                            break
                slot = (slot + 1) & slot_mask
            if found >= 0:
                for i in range(found + 2, found + 2 + records[found + 1]):
                    out[w] = records[i]
                    w += 1
                continue

        for i in range(length):
            work[i] = byte_ids[data[start + i]]
        m = _merge(work, merges, length, entries, shift)
        for i in range(m):
            out[w + i] = work[i]
        w += m

        if cacheable:
            r = fill[0]
            if fill[1] == max_entries or r + 2 + m + length > room:
                slots[:] = 0  # full: start again empty (bounded memory, simple eviction)
                fill[0] = 0
                fill[1] = 0
                fill[2] += 1
                r = 0
                slot = np.int64((h * _HASH_MULTIPLIER) >> np.uint64(cache_shift))
            records[r] = length
            records[r + 1] = m
            for i in range(m):
                records[r + 2 + i] = work[i]
            for i in range(length):
                records[r + 2 + m + i] = data[start + i]
            slots[slot] = tag | (r + 1)
            fill[0] = r + 2 + m + length
            fill[1] += 1
    return out[:w]


@njit(cache=True)
def char_to_byte_offsets(data, char_lengths):
    """Byte offsets of consecutive pieces of valid UTF-8 `data` given their lengths in characters."""
    n = char_lengths.shape[0]
    offsets = np.empty(n + 1, dtype=np.int64)
    b = 0
    offsets[0] = 0
    for k in range(n):
        for _ in range(char_lengths[k]):
            lead = data[b]
            if lead < 0x80:
                b += 1
            elif lead < 0xE0:
                b += 2
            elif lead < 0xF0:
                b += 3
            else:
                b += 4
        offsets[k + 1] = b
    return offsets


@njit(cache=True)
def gather_token_bytes(ids, token_offsets, token_bytes):
    """The bytes of tokens `ids` (all known to be valid) laid end to end."""
    total = 0
    for i in ids:
        total += token_offsets[i + 1] - token_offsets[i]
    out = np.empty(total, dtype=np.uint8)
    w = 0
    for i in ids:
        for j in range(token_offsets[i], token_offsets[i + 1]):
            out[w] = token_bytes[j]
            w += 1
    return out


_NO_CACHE = EncodeCache(
    slots=np.zeros(1, dtype=np.int64),
    records=np.zeros(1, dtype=np.int32),
    fill=np.zeros(3, dtype=np.int64),
    shift=63,
    max_entries=0,
    max_key_len=0,  # nothing is cacheable
)
