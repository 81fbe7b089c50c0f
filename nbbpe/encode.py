"""Encoding kernels: UTF-8 bytes -> token ids in one compiled pass.

`encode_documents` (one cached kernel per scanner family, see `ENCODERS`) reads a batch of
documents (UTF-8 bytes end to end, with the offsets where each ends; or each where it lies, a
batch's ASCII str read in place), and for each document:
finds the next special-token occurrence, scans the pre-tokens of the stretch before it with the
family's scanner, looks each pre-token up, runs the byte-pair merge only when it was never seen,
and writes the ids straight into a preallocated output; then the special token's id, and after
each document an optional separator id. Nothing per pre-token leaves the compiled code.
`encode_pieces` does the same for pre-tokens found by `regex` (any pattern).

Data, all flat arrays in NamedTuples (a call from Python hands them over packed as addresses,
`pack_encode_args`; the kernel sees the NamedTuples):

- `Ranks`: the merges as an open-addressing hash table of one int64 per slot, the pair of token
  ids (left << id_bits | right) above the pair's rank, and for the pairs of small ids a dense
  table of their ranks; the merged id comes from `merged`; and which pairs of bytes some token
  holds side by side (`joins`);
- tables of encoded pre-tokens (`encode_tables.py`): the vocab table holds the single bytes
  and every token's own bytes with their ids, and the cache the threads share (a copy of it)
  every other pre-token they met. Most pre-tokens are found in the vocab table; a merge runs once
  per new pre-token.

Two merge orders, both exact:

- MERGES (GPT-2's `bpe()`, for a trained merge list): each round takes the pair of lowest rank
  anywhere in the pre-token and merges all its occurrences left to right, non-overlapping
  (`a a a` -> `aa a`);
- RANKS (tiktoken's byte-pair merge, for rank files such as cl100k_base): a pre-token that is a
  token is that token; otherwise repeatedly merge the leftmost adjacent pair whose concatenation
  has the lowest rank, one pair at a time.

Short pre-tokens merge by scanning their pairs; long ones on a heap of (rank, position), so no
input, however long and repetitive, takes quadratic time: in the pass those of more than
`_HEAP_FROM` bytes in RANKS order (which merges one pair per round), outside it (`need`) those of
more than `_HEAP_ABOVE` bytes. In the pass, a new pre-token is first cut where two bytes side by
side are held together by no token (`Ranks.joins`): no merge can cross there, so each part
merges alone, to the same ids (text of multi-byte characters cuts often: a Japanese sentence
into its characters, nearly); and the same parts come back, so each thread remembers the ids of
short parts in a small table of its own (the part cache, `_merge_part`).

The kernels are compiled without Numba's reference counting (`_nrt=False`): every array they
touch is passed in, so per pre-token no atomic counter is touched. They allocate nothing; a
pre-token too long for the scratch space makes the kernel return and ask for more.
"""

from __future__ import annotations

import functools
import threading
from typing import NamedTuple

import numpy as np
from numba import njit, types

from .encode_tables import (
    CACHE_FIRST_ROOM,
    LONG,
    MAX_SHORT,
    OWN_HAZARD,
    OWN_ITEMS,
    RECORD_RUN,
    SPARE_IDS,
    SharedCache,
    TABLE_ITEMS,
    Table,
    VOCAB_SPREAD,
    copy_ids,
    copy_short_ids,
    count_entries,
    count_entry,
    enter_table,
    find,
    home,
    inline_count,
    inline_id,
    is_full,
    key_of,
    leave_table,
    lookup,
    new_table,
    prefetch,
    short_hash,
    store,
    table_at,
    with_room,
)
from .id_lists import fill_list, id_list, int_items, int_objects
from .kernel_args import (LIST_ITEMS_OFFSET, NDARRAY_DATA_OFFSET, OB_TYPE_OFFSET, STR_ASCII_BIT,
                          STR_LENGTH_OFFSET, STR_STATE_OFFSET, TUPLE_ITEMS_OFFSET,
                          TUPLE_SIZE_OFFSET, PackedArrays, address, array_at, array_from, bytes_at,
                          c_function_address, call_at, call_c, copy_bytes, fastcall_address,
                          fastcall_builtin, load_word, new_array_address, object_layout_known,
                          readonly_array_at, readonly_array_from)
from .kernel_cache import cached, cfunc_cached, entry_point, native_address
from .scanners.classes import load8, load_upto8, uindex
from .scanners.cl100k import cl100k_block_boundaries, cl100k_pretoken_end
from .scanners.gpt2 import gpt2_block_boundaries, gpt2_pretoken_end
from .scanners.o200k import o200k_block_boundaries, o200k_pretoken_end
from .scanners.specials import SPECIALS_ITEMS, Specials, next_special, specials_at
from .scanners.spans import BLOCK, WINDOW, scan_window_visiting

MERGES, RANKS = 0, 1  # merge orders
NO_MERGE = np.int64(np.iinfo(np.int64).max)
_EMPTY = np.int64(-1)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: Fibonacci hashing
_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
# Pre-tokens longer than this many bytes merge on a heap, outside the one pass (rare in any
# language: a CJK sentence without punctuation of 85 characters is 255 bytes).
_HEAP_ABOVE = 256
# In RANKS order, pre-tokens longer than this merge on a heap in the pass too (`_merge_leftmost`).
_HEAP_FROM = 32
# Pairs of ids below 2**DENSE_BITS (the bytes and the first 256 merges, the pairs a merge meets
# most) find their rank in a dense table of 1 MB: one load, no hash, no probe (a merge is ~10%
# faster than with the hash table alone; encoding multi_1M cold, ~8%). 1 MB rather than 4 (the
# first 768 merges): merging alone, as fast, but in the pass the cache's traffic evicts the
# bigger table's lines, and its load was the merge loop's top stall. A tokenizer's first cold
# pass over web_5M took 0.94x the time (16 alternated fresh processes each, the order swapped
# every round); a later cold pass over multi_1M 0.94x; TinyStories and o200k as before.
DENSE_BITS = 9


class Ranks(NamedTuple):
    """Which adjacent pairs merge, in which order, into what (see the module docstring)."""

    slots: np.ndarray  # int64, a power of two: (left << id_bits | right) << rank_bits | rank
    shift: int  # 64 - log2(len(slots))
    id_bits: int
    rank_bits: int
    merged: np.ndarray  # int32: the id each rank's merge creates
    byte_ids: np.ndarray  # int32[256]: the id of each single byte
    mode: int  # MERGES or RANKS
    dense: np.ndarray  # int32: the rank (-1: none) of (a, b) at a << dense_bits | b ...
    dense_bits: int  # ... for the pairs of ids below 2**dense_bits
    merged_offset: int  # merged[r] == r + merged_offset for every rank r (no load), or -1
    joins: np.ndarray  # uint8[65536]: at x << 8 | y, 0 if byte y never follows byte x in a token
    listed: np.ndarray  # uint64: bits, one set for each pair of the hash table (`_listed_bits`)
    windows: np.ndarray  # uint64: bits, one set for each short window of a token (`token_windows`)


RANKS_ITEMS = 20  # values of a `Ranks` in `kernel_args.PackedArrays`
# `Ranks.listed` has 2**LISTED_BITS bits per slot of the hash table (1/16 of its size).
LISTED_BITS = 3


@njit(inline="always")
def ranks_at(values, k):
    """The `Ranks` packed at values[k:k + RANKS_ITEMS] (`kernel_args.PackedArrays`)."""
    return Ranks(array_at(values, k, np.int64), values[k + 2], values[k + 3], values[k + 4],
                 array_at(values, k + 5, np.int32), array_at(values, k + 7, np.int32),
                 values[k + 9], array_at(values, k + 10, np.int32), values[k + 12],
                 values[k + 13], array_at(values, k + 14, np.uint8),
                 array_at(values, k + 16, np.uint64), array_at(values, k + 18, np.uint64))


def new_scratch() -> np.ndarray:
    """Scratch space of the kernels: a window of pre-token ends, their keys (k0, k1, length
    byte) and hashes, the part cache (`_merge_part`: empty, all zeros; the scratch space of one
    thread and one tokenizer, so it holds that tokenizer's ids), and the pair ranks of a short
    pre-token being merged, or the heap of a long one."""
    # Zeros written, not np.zeros' fresh pages that are read before they are written: the
    # part cache's first lookups map each page to the system's zero page, and the first store
    # then faults again and makes the system flush that page from every CPU running a thread of
    # this process, ~45 us on this project's VM (an interrupt to the other CPU). A 2-thread batch
    # of web_5M met 33 such faults in its second thread's part cache: 0.97x the time (medians
    # of 10 alternated fresh processes, 7 of 10 pairs faster).
    scratch = np.empty(5 * WINDOW + MERGE_ROOM_AT + _heap_space.py_func(_HEAP_ABOVE),
                       dtype=np.int64)
    scratch.fill(0)
    return scratch


# --- the rank table ---------------------------------------------------------------------------


def build_ranks(left, right, rank, merged_of_rank, byte_ids, mode: int, joins=None,
                windows=None) -> Ranks:
    """The `Ranks` of pairs (left[k], right[k]) with ranks rank[k]; `merged_of_rank[r]` is the id
    rank r's merge creates. The pairs must be distinct (the caller checks, naming a duplicate).
    `joins`: `byte_pairs_in_tokens` of every token a merge creates, or more (default: every pair
    of bytes, so that no pre-token is merged in parts); `windows`: `token_windows` of those
    tokens, or more (default: every window, so that `joins` alone cuts)."""
    left = np.ascontiguousarray(left, dtype=np.int64)
    right = np.ascontiguousarray(right, dtype=np.int64)
    rank = np.ascontiguousarray(rank, dtype=np.int64)
    largest_id = int(max(left.max(initial=0), right.max(initial=0), 255))
    id_bits = max(8, (largest_id + 1).bit_length())  # an all-ones id never occurs: empty slots
    rank_bits = 64 - 2 * id_bits - 1  # the sign bit stays clear: -1 marks an empty slot
    if rank_bits < 1 or int(rank.max(initial=0)) >= 1 << rank_bits:
        raise ValueError(f"too many merges or ids for the rank table ({largest_id + 1:,} ids)")
    bits = max(4, int(2 * len(left) - 1).bit_length())  # load factor at most 1/2
    pair = (left << id_bits) | right
    hashed = pair.astype(np.uint64) * _GOLDEN  # as `_pair_rank` hashes a pair
    slots = _fill_ranks(pair, hashed, rank, rank_bits, bits)
    listed = _listed_bits(hashed, bits)
    dense_bits = min(DENSE_BITS, largest_id.bit_length())
    if int(rank.max(initial=0)) >= 1 << 31:
        dense_bits = 0  # ranks that int32 cannot hold: the hash table alone
    dense = np.full(1 << 2 * dense_bits, -1, dtype=np.int32)
    early = (left < 1 << dense_bits) & (right < 1 << dense_bits)
    dense[(left[early] << dense_bits) | right[early]] = rank[early]
    merged_of_rank = np.ascontiguousarray(merged_of_rank, dtype=np.int32)
    joins = _EVERY_PAIR if joins is None else np.ascontiguousarray(joins, dtype=np.uint8)
    if joins.shape != (1 << 16,):
        raise ValueError(f"joins has {joins.size} items, not {1 << 16}")
    windows = _EVERY_WINDOW if windows is None else np.ascontiguousarray(windows, dtype=np.uint64)
    return Ranks(slots, 64 - bits, id_bits, rank_bits, merged_of_rank,
                 np.ascontiguousarray(byte_ids, dtype=np.int32), mode, dense, dense_bits,
                 _offset_of(merged_of_rank), joins, listed, windows)


# Shared, never written; writable all the same, as every `joins` is: a read-only array is
# another type to Numba, and every kernel taking a `Ranks` would be compiled twice.
_EVERY_PAIR = np.ones(1 << 16, dtype=np.uint8)
_EVERY_WINDOW = np.full(1, np.iinfo(np.uint64).max, dtype=np.uint64)


def cut_tables(token_bytes, token_offsets, token_ids) -> tuple[np.ndarray, np.ndarray]:
    """(`joins`, `windows`) of the tokens `token_ids`, `build_ranks`' last two arguments: the
    tables `cut_before` reads, always of the same tokens (the windows only ask about pairs that
    `joins` holds)."""
    return (byte_pairs_in_tokens(token_bytes, token_offsets, token_ids),
            token_windows(token_bytes, token_offsets, token_ids))


def byte_pairs_in_tokens(token_bytes, token_offsets, token_ids) -> np.ndarray:
    """uint8[65536], 1 at x << 8 | y where byte y follows byte x inside one of the tokens
    `token_ids` (token i is token_bytes[token_offsets[i]:token_offsets[i + 1]]), else 0.

    A merge joins two tokens into a token holding the last byte of the one and the first byte of
    the other, so where a pre-token's bytes x, y are a pair no token holds, no merge ever joins
    across them: each side merges alone, to the ids the whole would give, in either order (a
    round takes the lowest rank left on either side, and leaves the other side as it is). The
    encode pass merges a new pre-token in such parts: the merge loop's work grows with the
    square of a part's length, and text of multi-byte characters splits often (with GPT-2's
    files, 15,446 of multi_1M's 21,254 new pre-tokens, into 148,110 parts: their merging took
    a third less time)."""
    ids = np.ascontiguousarray(token_ids, dtype=np.int64)
    starts = token_offsets[ids].astype(np.int64)
    inner = np.maximum(token_offsets[ids + 1] - starts - 1, 0)  # adjacent pairs in each token
    first_pair = np.cumsum(inner) - inner
    at = np.repeat(starts - first_pair, inner) + np.arange(int(inner.sum()), dtype=np.int64)
    joins = np.zeros(1 << 16, dtype=np.uint8)
    joins[(token_bytes[at].astype(np.int64) << 8) | token_bytes[at + 1]] = 1
    return joins


# The windows a token may hold across a cut (`token_windows`), told apart by a tag in the key.
_WHOLE_2 = 1  # a token of 2 bytes
_FIRST_3 = 2  # a token's first 3 bytes
_LAST_3 = 3  # a token's last 3 bytes
_INNER_4 = 4  # any 4 bytes side by side in a token


def token_windows(token_bytes, token_offsets, token_ids) -> np.ndarray:
    """A bit filter (uint64 words, `_window_bit`) of the short windows of the tokens
    `token_ids` around each pair of bytes `_held_across` asks about: the token itself if it has
    2 bytes, its first and its last 3 bytes, and 4 bytes side by side in it. A bit is clear
    only if no token has that window (a set bit may be another window's: the filter errs only
    towards "held").

    Bytes x, y side by side in a pre-token that a token holds (`byte_pairs_in_tokens`) may
    still be a place where no merge ever joins: a merge creates a token, and every token a
    merge creates is bytes of the pre-token, so unless some token occurs in the pre-token over
    both x and y, each side merges alone. Such a token is xy itself, or begins at x and holds
    the byte after y (its first 3 bytes), or ends at y and holds the byte before x (its last
    3), or holds both (4 bytes inside it): if the filter has none of those windows around x, y,
    the pre-token can be cut there (`_held_across`). Pairs of bytes between multi-byte
    characters are held by some token nearly always (a UTF-8 character's last byte, then a
    first byte), so `joins` alone hardly cuts Chinese or Japanese text with the rank files,
    whose tokens hold many of their characters; the windows look at the characters on either
    side. multi_1M's 17,209 new pre-tokens with o200k cut into 47,765 parts instead of 30,394
    (the sum of the squares of the parts' lengths, what merging them costs: 2.5 million instead
    of 6.2); with cl100k 79,540 instead of 65,439 (2.1 million instead of 2.6); with GPT-2's
    files, whose pairs already cut, 150,916 instead of 148,113. Only before a character of 3
    or 4 bytes: looked for also before one of 2 bytes (Cyrillic, Arabic) and after any, the
    windows cut o200k's into 49,125 parts, for no gain beyond the noise (a cold pass over
    multi_1M 0.86x the time either way) and a filter 4 times the size."""
    offsets = np.asarray(token_offsets, dtype=np.int64)
    n = int(offsets[-1])
    data = np.zeros(n + 3, dtype=np.uint8)
    data[:n] = token_bytes[:n]
    four = np.ndarray((n,), dtype="<u4", buffer=data, strides=(1,))  # the 4 bytes from each place
    # Only the windows around a pair that `_held_across` looks for: x, y with y the first byte of
    # a character of 3 or 4 bytes (o200k: 67,324 windows of 1,197,672).
    xs = np.flatnonzero(data[1:n] >= 0xE0)  # where each x is (y after it)
    token = np.searchsorted(offsets, xs, side="right") - 1  # the token holding x
    chosen = np.zeros(len(offsets) - 1, dtype=np.bool_)
    chosen[np.asarray(token_ids, dtype=np.int64)] = True
    start, end = offsets[token], offsets[token + 1]
    inside = chosen[token] & (xs + 2 <= end)  # y in x's token too
    xs, start, end = xs[inside], start[inside], end[inside]
    first, last = xs == start, xs + 2 == end
    keys = np.concatenate([
        _window_key(_WHOLE_2, four[xs[first & last]] & 0xFFFF),
        _window_key(_FIRST_3, four[xs[first & ~last]] & 0xFFFFFF),
        _window_key(_LAST_3, four[xs[~first & last] - 1] & 0xFFFFFF),
        _window_key(_INNER_4, four[xs[~first & ~last] - 1])])
    # Set at 16 bits a window, then halved while at most 1 bit in 32 would be set: windows
    # repeat (o200k's 6,587 differ: 32 KB, 2.5% set), and a small filter stays in the caches.
    n_words = 1 << (len(keys) // 4).bit_length()
    h = keys * _GOLDEN
    flags = np.zeros(64 * n_words, dtype=np.bool_)
    flags[((h >> np.uint64(32)) * np.uint64(n_words)) >> np.uint64(32) << np.uint64(6)
          | ((h >> np.uint64(26)) & np.uint64(63))] = True
    words = _bit_words(flags)
    set_bits = np.count_nonzero(flags)  # no fewer once halved
    while len(words) > 1 and set_bits <= len(words):
        words = words[0::2] | words[1::2]  # `_window_bit` of a filter of half the words
    return words


def _window_key(tag: int, window):
    """The keys of windows (their bytes little-endian, the first lowest) of kind `tag`, as
    `_held_across` makes them."""
    return np.uint64(tag << 32) | window.astype(np.uint64)


@njit(inline="always")
def _window_bit(windows, key):
    """Whether the filter `windows` (`token_windows`) has the bit of window `key`."""
    h = key * _GOLDEN
    word = ((h >> np.uint64(32)) * np.uint64(windows.shape[0])) >> np.uint64(32)
    return (windows[uindex(word)] >> ((h >> np.uint64(26)) & np.uint64(63))) & np.uint64(1) != 0


# Compiled apart: inlined at each place the kernels merge, it made a first encode's compile 1.5 s
# longer (7.3 against 5.8 s; apart, 6.4 s); it is called only where a character of 3 or 4
# bytes begins, and a cold pass over multi_1M with o200k took the same (0.94x first, 1.03x later).
@njit(cache=True, nogil=True, _nrt=False)
def _held_across(windows, buf, start, end, i):
    """Whether some token may occur in pre-token buf[start:end] over bytes i - 1 and i (a
    pair some token holds, where a character of 3 or 4 bytes begins: Chinese, Japanese, Korean,
    emoji...); False: it can be cut there (see `token_windows`)."""
    x = np.uint64(buf[uindex(i - 1)])
    y = np.uint64(buf[uindex(i)])
    pair = x | (y << np.uint64(8))
    after = i + 1 < end
    before = i - 2 >= start
    z = np.uint64(buf[uindex(i + 1)]) if after else np.uint64(0)
    w = np.uint64(buf[uindex(i - 2)]) if before else np.uint64(0)
    # The window that holds the characters on both sides first: where a token holds the two
    # characters, it mostly has this one (o200k, multi_1M: 17,147 of the 26,911 held).
    if before and after and _window_bit(windows, np.uint64(_INNER_4 << 32) | w
                                        | (pair << np.uint64(8)) | (z << np.uint64(24))):
        return True
    if _window_bit(windows, np.uint64(_WHOLE_2 << 32) | pair):
        return True
    if after and _window_bit(windows, np.uint64(_FIRST_3 << 32) | pair | (z << np.uint64(16))):
        return True
    return before and _window_bit(windows, np.uint64(_LAST_3 << 32) | w | (pair << np.uint64(8)))


def _offset_of(merged_of_rank: np.ndarray) -> int:
    """c if merged_of_rank[r] == r + c for every r (GPT-2's files: 256; rank files: 0), else -1."""
    if len(merged_of_rank) == 0:
        return 0
    offset = int(merged_of_rank[0])
    steps = np.arange(offset, offset + len(merged_of_rank), dtype=np.int64)
    return offset if np.array_equal(merged_of_rank, steps) else -1


def _no_merges(byte_ids, mode: int) -> Ranks:
    """`Ranks` in which no pair merges, built without a kernel (tables of the right types)."""
    return Ranks(np.full(16, _EMPTY), 60, 8, 47, np.zeros(1, np.int32),
                 np.ascontiguousarray(byte_ids, dtype=np.int32), mode, np.full(1, -1, np.int32), 0,
                 -1, _EVERY_PAIR, _listed_bits(np.zeros(0, np.uint64), 4), _EVERY_WINDOW)


def _fill_ranks(pair, hashed, rank, rank_bits, bits):
    """The slots of the rank table: each pair at its home slot or the first free one after it
    (linear probing), as inserting them one by one would place them, but in NumPy, with no
    kernel to compile (0.4 s of a first run). Taken in order of home slot, a pair goes to
    max(home, previous pair's slot + 1): so every slot from a pair's home to its own is taken,
    which is all a lookup needs. Those pushed past the end wrap around into the first free
    slots, in order, so every slot before them is taken too."""
    size = 1 << bits
    home = (hashed >> np.uint64(64 - bits)).astype(np.int64)
    order = np.argsort(home, kind="stable")
    steps = np.arange(len(order), dtype=np.int64)
    at = np.maximum.accumulate(home[order] - steps) + steps
    entries = ((pair << rank_bits) | rank)[order]
    slots = np.full(size, _EMPTY, dtype=np.int64)
    inside = at < size
    slots[at[inside]] = entries[inside]
    wrapped = entries[~inside]
    slots[np.flatnonzero(slots == _EMPTY)[: len(wrapped)]] = wrapped
    return slots


def _listed_bits(hashed, bits: int) -> np.ndarray:
    """`Ranks.listed` of a hash table of 2**bits slots: bit h >> (64 - bits - LISTED_BITS) set
    for each pair's hash h in `hashed` (uint64)."""
    at = (hashed >> np.uint64(64 - bits - LISTED_BITS)).astype(np.int64)
    flags = np.zeros(max(64, 1 << (bits + LISTED_BITS)), dtype=np.bool_)
    flags[at] = True
    return _bit_words(flags)


def _bit_words(flags) -> np.ndarray:
    """bool[64 n] as uint64[n] whose bit k of word w is flags[64 w + k] (the filters' layout;
    setting the bits with `np.bitwise_or.at` took 9 ms for o200k's 200k pairs)."""
    return np.packbits(flags, bitorder="little").view("<u8").astype(np.uint64)


@njit(cache=True, nogil=True, _nrt=False)
def _pair_rank(ranks, a, b):
    """The rank of pair (a, b), or NO_MERGE if it does not merge.

    Most pairs a merge looks up in the hash table do not merge, and in the encode pass the
    table's lines are seldom in the CPU's cache (the cache's lookups push them out). So a bit per
    1/8 slot (`Ranks.listed`, 1/16 of the table's size: 128 KB with GPT-2's merges, 4.7% of its
    bits set) says first whether any pair hashes there; clear, the pair does not merge, and the
    table is not read. Merging web_5M's new pre-tokens back to back, 12 rounds in 3 alternated
    processes: 294 ns each against 364 without the bits (medians); with 8 random reads of an
    8 MB array between pre-tokens, as in the pass, 509 against 550. A cold one-call encode of
    web_5M: 47.1-50.8 ms against 54.5-58.0 (medians of 10, 4 alternated processes each); of
    multi_1M, no different beyond the noise."""
    if (a | b) < (1 << ranks.dense_bits):  # bytes and the first merges: one load, no hash
        r = ranks.dense[uindex((np.int64(a) << ranks.dense_bits) | np.int64(b))]
        return NO_MERGE if r < 0 else np.int64(r)
    pair = (np.int64(a) << ranks.id_bits) | np.int64(b)
    h = np.uint64(pair) * _GOLDEN
    bit = h >> np.uint64(ranks.shift - LISTED_BITS)
    if (ranks.listed[uindex(bit >> np.uint64(6))] >> (bit & np.uint64(63))) & np.uint64(1) == 0:
        return NO_MERGE
    slots = ranks.slots
    mask = uindex(slots.shape[0] - 1)
    s = h >> np.uint64(ranks.shift)
    while True:
        entry = slots[s]
        if entry == _EMPTY:
            return NO_MERGE
        if entry >> ranks.rank_bits == pair:
            return entry & ((np.int64(1) << ranks.rank_bits) - 1)
        s = (s + np.uint64(1)) & mask


@njit(inline="always")
def _merged(ranks, rank):
    """The id that the merge of rank `rank` creates: computed when the ids follow the ranks, so
    a merge round does not wait for a load before it looks up the new pairs."""
    if ranks.merged_offset >= 0:
        return np.int32(rank + ranks.merged_offset)
    return ranks.merged[rank]


# --- merging one pre-token --------------------------------------------------------------------


@njit(cache=True, nogil=True, _nrt=False)
def _merge_rounds(work, lo, m, pairs, ranks):
    """MERGES order on work[lo:lo + m], in place; return the new length.

    `pairs[i]` is the rank of the pair at lo + i. A round finds the lowest, then sweeps from its
    first occurrence, merging every occurrence left to right and updating the pairs that change;
    pairs between untouched tokens keep theirs. Each rank belongs to one pair, so
    pairs[i] == best marks an occurrence. Writes go behind the reads, so the sweep is in place.
    """
    for i in range(m - 1):
        pairs[uindex(i)] = _pair_rank(ranks, work[uindex(lo + i)], work[uindex(lo + i + 1)])
    while m > 1:
        best = NO_MERGE
        at = -1
        for i in range(m - 1):
            if pairs[uindex(i)] < best:
                best = pairs[uindex(i)]
                at = i
        if at < 0:
            break
        merged = _merged(ranks, best)
        w = at
        i = at
        prev_copied = at > 0  # work[w - 1] is the old token at i - 1, unchanged
        while i < m:
            if i < m - 1 and pairs[uindex(i)] == best:
                token = merged
                copied = False
                step = 2
            else:
                token = work[uindex(lo + i)]
                copied = True
                step = 1
            if w > 0:
                if copied and prev_copied:
                    pairs[uindex(w - 1)] = pairs[uindex(i - 1)]
                else:
                    pairs[uindex(w - 1)] = _pair_rank(ranks, work[uindex(lo + w - 1)], token)
            work[uindex(lo + w)] = token
            prev_copied = copied
            w += 1
            i += step
        m = w
    return m


@njit(cache=True, nogil=True, _nrt=False)
def _merge_leftmost(work, lo, m, pairs, ranks):
    """RANKS order on work[lo:lo + m], in place: merge the leftmost pair of lowest rank, one at
    a time; return the new length. A pre-token of more than `_HEAP_FROM` bytes merges on a heap
    (`pairs` has room): one merge per round makes rescanning quadratic in its length."""
    if m > _HEAP_FROM:
        return _merge_on_heap(work, lo, m, pairs, ranks)
    for i in range(m - 1):
        pairs[uindex(i)] = _pair_rank(ranks, work[uindex(lo + i)], work[uindex(lo + i + 1)])
    while m > 1:
        best = NO_MERGE
        at = -1
        for i in range(m - 1):
            if pairs[uindex(i)] < best:  # strictly lower: the leftmost wins a tie
                best = pairs[uindex(i)]
                at = i
        if at < 0:
            break
        work[uindex(lo + at)] = _merged(ranks, best)
        for i in range(at + 1, m - 1):
            work[uindex(lo + i)] = work[uindex(lo + i + 1)]
            pairs[uindex(i)] = pairs[uindex(i + 1)]
        m -= 1
        if at > 0:
            pairs[uindex(at - 1)] = _pair_rank(ranks, work[uindex(lo + at - 1)], work[uindex(lo + at)])
        if at < m - 1:
            pairs[uindex(at)] = _pair_rank(ranks, work[uindex(lo + at)], work[uindex(lo + at + 1)])
    return m


@njit(cache=True, nogil=True, _nrt=False)
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


@njit(cache=True, nogil=True, _nrt=False)
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
        s, _, _, _, _ = lookup(vocab, buf, start, end)
        if s >= 0:
            return copy_ids(vocab, s, out, np.int64(0))
    for i in range(length):
        out[i] = ranks.byte_ids[buf[start + i]]
    return _merge_on_heap(out, 0, length, np.empty(_heap_space(length), np.int64), ranks)


@njit(inline="always")
def _heap_space(m):
    """Items of scratch space `_merge_on_heap` needs for m tokens. From Python, call its
    `py_func`: a call of the compiled function would compile it on its own (0.2 s, first run)."""
    return 7 * m + 4


@njit(cache=True, nogil=True, _nrt=False)
def _merge_on_heap(work, lo, m, space, ranks):
    """Either order on work[lo:lo + m] in O(m log m), in place; return the new length. `space`
    (int64) holds at least `_heap_space(m)` items.

    Tokens form a linked list by original position; the heap holds (rank, position) of every
    pair that may merge, as one int64 (rank << 32 | position: the leftmost first on ties).
    An entry is stale if the pair at its position has changed since (a changed pair always has
    another rank); it is skipped when popped. In MERGES order a round merges every occurrence
    of one pair, so the pairs a round creates wait until it ends (GPT-2 looks for the next pair
    only after the sweep).
    """
    nxt = space[:m]
    prv = space[m : 2 * m]
    rank_at = space[2 * m : 3 * m]  # rank of the pair starting at each live position, or -1
    heap = space[3 * m : 5 * m + 2]
    waiting = space[5 * m + 2 : 7 * m + 4]
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
        work[lo + i] = _merged(ranks, r)
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


# --- one pre-token ---------------------------------------------------------------------------


# The part cache: 2**PART_CACHE_BITS slots of two int64 (256 KB: room in a core's L2 cache).
PART_CACHE_BITS = 14
PART_CACHE_ITEMS = 2 << PART_CACHE_BITS
_PART_ID_BITS = 20  # a slot holds up to 3 ids below 2**20 (o200k's are below 2**18)
_PART_ID_MASK = np.int64((1 << _PART_ID_BITS) - 1)
_PART_MAX_BYTES = 7  # a part's bytes and its length make one int64 key
# In a thread's scratch space, after the part cache: the entries it stored in the cache and has
# not counted yet, the records it claimed and the table its kernel reads
# (`encode_tables.OWN_ITEMS`, in a cache line), then room for a merge.
MERGE_ROOM_AT = PART_CACHE_ITEMS + 8
OWN_AT = 5 * WINDOW + PART_CACHE_ITEMS  # those own items, in the whole scratch space


@njit(inline="always")
def own_items(scratch):
    """The thread's own items in its scratch space (`encode_tables.OWN_ITEMS`)."""
    return scratch[OWN_AT : OWN_AT + OWN_ITEMS]


# A kernel's caller publishes the cache table the kernel is to read (`enter_table`) and takes it
# back after: here for the calls from Python, in `_encode_text_at` for the short path's. In the
# kernel itself (at its start and at each return), the same check made a pass over TinyStories
# one document at a time 2-5% slower, warm or cold (alternated fresh processes, 14-16 each):
# the loop compiled differently, even with a plain store in place of the fence.
@njit(cache=True, nogil=True, _nrt=False)
def enter_table_of(table, scratch):
    """`enter_table` for a kernel about to run on `table` with this thread's `scratch`: False
    if `table` was replaced (then take up the cache's table)."""
    return enter_table(table, own_items(scratch))


@njit(cache=True, nogil=True, _nrt=False)
def leave_table_of(scratch):
    """`leave_table`, once the kernel that `enter_table_of` was for has returned."""
    leave_table(own_items(scratch))


def compile_table_entry(table: Table) -> None:
    """Compile (or load) `enter_table_of` and `leave_table_of` for the cache's `table`, with a
    scratch space of their own (no kernel reads the table for it)."""
    scratch = new_scratch()
    enter_table_of(table, scratch)
    leave_table_of(scratch)


@njit(inline="always")  # into `_merge_part` and `merge_in_parts`
def _merge_bytes(merge, buf, start, n, out, at, ranks, pairs):
    """Write the ids of buf[start:start + n], merged by `merge`, to out[at:]; return how many."""
    for k in range(n):
        out[uindex(at + k)] = ranks.byte_ids[buf[uindex(start + k)]]
    return merge(out, at, n, pairs, ranks)


@njit(inline="always")  # into `merge_in_parts`
def _merge_part(merge, buf, part, n, out, at, ranks, pairs, parts):
    """Write the ids of the part buf[part:part + n] (2 to `_PART_MAX_BYTES` bytes) of a new
    pre-token to out[at:] and return how many: from the part cache `parts`, else merged (then
    remembered there, if it has at most 3 ids, each below 2**20).

    The part cache belongs to one thread: a direct-mapped table, slot (key, value): the key is
    the part's bytes, little-endian, with its length in the top byte (never 0, the empty key);
    the value its number of ids in bits 0-1, then each id in 20 bits. Cut pre-tokens repeat
    their parts: multi_1M's 21,254 new pre-tokens, with GPT-2's files, cut into 148,110 parts
    of which 8,751 differ (a part is mostly a character), so most of their merges were done
    before. A part's ids do not depend on what is around it (see `byte_pairs_in_tokens`).
    Writes 3 ids whatever their number: `out` has `SPARE_IDS` items to spare."""
    key = np.int64(load_upto8(buf, part, part + n)) | (np.int64(n) << 56)
    s = ((np.uint64(key) * _GOLDEN) >> np.uint64(64 - PART_CACHE_BITS)) << np.uint64(1)
    if parts[s] == key:
        value = parts[s + np.uint64(1)]
        out[uindex(at)] = np.int32((value >> 2) & _PART_ID_MASK)
        out[uindex(at + 1)] = np.int32((value >> (2 + _PART_ID_BITS)) & _PART_ID_MASK)
        out[uindex(at + 2)] = np.int32((value >> (2 + 2 * _PART_ID_BITS)) & _PART_ID_MASK)
        return value & 3
    m = _merge_bytes(merge, buf, part, n, out, at, ranks, pairs)
    if m <= 3:
        value = np.int64(m)
        fits = True
        for k in range(m):
            token = np.int64(out[uindex(at + k)])
            fits = fits and token <= _PART_ID_MASK
            value |= token << (2 + _PART_ID_BITS * k)
        if fits:
            parts[s] = key
            parts[s + np.uint64(1)] = value
    return m


@njit(inline="always")  # into `merge_in_parts`
def cut_before(ranks, buf, start, end, i):
    """Whether pre-token buf[start:end] can be cut before byte i (start < i < end) with no
    change to its ids: no token holds bytes i - 1 and i side by side (`ranks.joins`, see
    `byte_pairs_in_tokens`), or, where a character of 3 or 4 bytes begins, none occurs over
    them (`ranks.windows`, see `token_windows`)."""
    if not ranks.joins[uindex((np.int64(buf[uindex(i - 1)]) << 8) | buf[uindex(i)])]:
        return True
    return buf[uindex(i)] >= 0xE0 and not _held_across(ranks.windows, buf, start, end, i)


@njit(inline="always")  # into `_encode_new` (and scripts/encode_breakdown.py's timing)
def merge_in_parts(merge, buf, start, end, out, w, ranks, pairs, parts):
    """Write the ids of pre-token buf[start:end] to out[w:], merged by `merge` in parts, cut
    where `cut_before` says it can be: the ids of merging it whole, sooner. Parts of a cut
    pre-token of 2 to `_PART_MAX_BYTES` bytes go through the part cache `parts`
    (`_merge_part`; merging multi_1M's new pre-tokens alone 1.51x faster, web_5M's 1.05x).
    Returns how many."""
    at = w
    part = start
    for i in range(start + 1, end + 1):
        if i < end and not cut_before(ranks, buf, start, end, i):
            continue
        n = i - part
        if n == 1:
            out[uindex(at)] = ranks.byte_ids[buf[uindex(part)]]
        elif n <= _PART_MAX_BYTES and (part > start or i < end):  # a part, not the whole
            n = _merge_part(merge, buf, part, n, out, at, ranks, pairs, parts)
        else:
            n = _merge_bytes(merge, buf, part, n, out, at, ranks, pairs)
        at += n
        part = i
    return at - w


@njit(inline="always")  # into the two below: `merge` is a compile-time choice
def _encode_new(merge, buf, start, end, k0, k1, tag, h, slot, out, w, ranks, cache,
                space):
    """Merge pre-token buf[start:end] (at most `_HEAP_ABOVE` bytes, not in the cache) into
    out[w:]; remember it in a learning cache at -1 - slot (where `find` said it would go);
    return the number of ids. `space`: the thread's part cache, then room for the merge."""
    m = merge_in_parts(merge, buf, start, end, out, w, ranks, space[MERGE_ROOM_AT:],
                       space[:PART_CACHE_ITEMS])
    own = space[PART_CACHE_ITEMS:MERGE_ROOM_AT]
    if cache.learns and store(cache, -1 - slot, k0, k1, tag, buf, start, end - start, out, w, m,
                              own):
        count_entry(cache, own)
    return m


# Inlined into each kernel (at both of its places): the kernel's loop then has no call to a
# function compiled apart, which was passed all its arrays, and is compiled better. A pass over
# web_5M one document at a time took 0.96x the time cold (a tokenizer's first pass in a fresh
# process) and 0.95x warm; multi_1M 0.95x cold, TinyStories 0.96x cold and 0.95x warm (8 to 16
# alternated fresh processes, medians). The merge loop and `store` stay calls. It costs ~0.9 s
# more to compile a kernel (a first encode with an empty cache: 5.7-5.8 s against 4.6-4.9);
# inlined at the first place only, it cost ~0.7 s and gained less than the noise.
@njit(inline="always")
def _encode_new_merges(buf, start, end, k0, k1, tag, h, slot, out, w, ranks, cache,
                       space):
    """`_encode_new` in MERGES order."""
    return _encode_new(_merge_rounds, buf, start, end, k0, k1, tag, h, slot, out, w, ranks,
                       cache, space)


@njit(inline="always")
def _encode_new_ranks(buf, start, end, k0, k1, tag, h, slot, out, w, ranks, cache,
                      space):
    """`_encode_new` in RANKS order."""
    return _encode_new(_merge_leftmost, buf, start, end, k0, k1, tag, h, slot, out, w, ranks,
                       cache, space)


@njit(inline="always")  # into each kernel, with its `encode_new`
def _encode_one(encode_new, buf, start, end, k0, k1, tag, h, out, w, ranks, cache,
                space):
    """Write the ids of pre-token buf[start:end] (2 to `_HEAP_ABOVE` bytes; its key and hash
    from `key_of`) to out[w:] and return how many: from the cache (which holds the vocab table
    too), else by merging (then the cache remembers it)."""
    slot = find(cache, home(cache, h), k0, k1, tag, buf, start, end - start)
    if slot >= 0:
        return copy_ids(cache, slot, out, w)
    return encode_new(buf, start, end, k0, k1, tag, h, slot, out, w, ranks, cache, space)


@njit(inline="always")  # into `scan_window_visiting`, for each pre-token as it is found
def _key_and_prefetch(context, t, start, end):
    """Pre-token t of a window (buf[start:end]) of 1 to 16 bytes: its key and hash, as `key_of`
    gives them, and a prefetch of its cache slot. The cache is several MB, so reading a slot
    mostly waits for memory: asked for a whole window before its first lookup, the reads
    overlap instead of each pre-token waiting for its own. Other pre-tokens get tag 0; of them,
    those of 17 to `_HEAP_ABOVE` bytes get their key and hash too, and a prefetch (the rest
    have theirs computed when met). Done as the scanner finds each pre-token rather than in a
    second pass over the window: web_5M 0.95x the time warm, multi_1M 0.93x, TinyStories 0.94x
    (`scripts/encode_variants.py`'s `fused_scan`, 40 rounds, on 2026-11-29)."""
    buf, cache, keys0, keys1, tags, hashes = context
    length = end - start
    tags[uindex(t)] = 0
    if length <= MAX_SHORT and start + 16 <= buf.shape[0]:  # nearly all: two loads, no branch
        k0 = load8(buf, start) & (_ALL_ONES >> np.uint64(64 - 8 * min(length, 8)))
        k1 = load8(buf, start + 8) & (_ALL_ONES >> np.uint64((128 - 8 * length) & 63))
        k1 = k1 if length > 8 else np.uint64(0)
        h = short_hash(k0, k1, length)
        keys0[uindex(t)] = np.int64(k0)
        keys1[uindex(t)] = np.int64(k1)
        tags[uindex(t)] = length
        hashes[uindex(t)] = np.int64(h)
        prefetch(cache.slots, 4 * home(cache, h))
    elif MAX_SHORT < length <= _HEAP_ABOVE:  # hashed now too, so its slot is prefetched
        k0, k1, _, h = key_of(buf, start, end)
        keys0[uindex(t)] = k0
        keys1[uindex(t)] = k1
        hashes[uindex(t)] = np.int64(h)
        prefetch(cache.slots, 4 * home(cache, h))


# --- the one pass ------------------------------------------------------------------------------


def pack_encode_args(buf, table, doc_ends, doc_out_ends, scratch, out, specials: Specials,
                     ranks: Ranks, cache: Table, text_buffer=None, short_path: tuple = (),
                     doc_addresses=None) -> PackedArrays:
    """The arrays and tables an encode kernel reads, packed as `encode_args` unpacks them: `buf`
    (UTF-8) uint8, the family's class table (of the kernel's `table_dtype`), `doc_ends`,
    `doc_out_ends` and `scratch` int64, `out` int32, `doc_addresses` int64 (default none: the
    documents are in `buf`; see `encode_documents`). For the short path (`_short_path`),
    `text_buffer` (uint8, `COPY_UP_TO` + `TEXT_PAD` bytes) after them, at `TEXT_BUFFER_AT`,
    then the ints `short_path` (`short_path_values`)."""
    doc_addresses = _addresses_of(doc_addresses, doc_ends)
    dtypes = (buf.dtype, doc_ends.dtype, doc_out_ends.dtype, scratch.dtype, out.dtype,
              doc_addresses.dtype)
    if dtypes != _ENCODE_ARG_TYPES:
        raise TypeError(f"encode kernel arguments of dtypes {dtypes}, not {_ENCODE_ARG_TYPES}")
    items = (buf, table, doc_ends, doc_out_ends, scratch, out, doc_addresses, specials, ranks,
             cache)
    if text_buffer is None:
        return PackedArrays(*items)
    if text_buffer.dtype != np.uint8 or len(text_buffer) < COPY_UP_TO + TEXT_PAD:
        raise ValueError(f"a text buffer of uint8 and at least {COPY_UP_TO + TEXT_PAD} bytes, "
                         f"not {text_buffer.dtype} and {len(text_buffer)}")
    return PackedArrays(*items, text_buffer, *short_path)


_ENCODE_ARG_TYPES = tuple(np.dtype(t) for t in (np.uint8, np.int64, np.int64, np.int64, np.int32,
                                                 np.int64))
_IN_BUF = np.empty(0, dtype=np.int64)  # no document addresses: the documents are in `buf`


def _addresses_of(doc_addresses, doc_ends) -> np.ndarray:
    """`doc_addresses` as packed (None or empty: none, the documents are in `buf`), checked to
    give one address per document."""
    if doc_addresses is None:
        return _IN_BUF
    if len(doc_addresses) not in (0, len(doc_ends)):
        raise ValueError(f"{len(doc_addresses)} document addresses for {len(doc_ends)} documents")
    return doc_addresses


def repack_documents(args: PackedArrays, buf, doc_ends, doc_out_ends, doc_addresses=None) -> None:
    """Put other documents in `args` (from `pack_encode_args`), keeping the rest as packed:
    packing all of it takes ~35 µs, held under the GIL, for each call of a batch's groups."""
    doc_addresses = _addresses_of(doc_addresses, doc_ends)
    dtypes = (buf.dtype, doc_ends.dtype, doc_out_ends.dtype, doc_addresses.dtype)
    expected = _ENCODE_ARG_TYPES[:3] + _ENCODE_ARG_TYPES[5:]
    if dtypes != expected:
        raise TypeError(f"documents of dtypes {dtypes}, not {expected}")
    args.set_array(TEXT_AT, buf)
    args.set_array(DOC_ENDS_AT, doc_ends)
    args.set_array(DOC_OUT_ENDS_AT, doc_out_ends)
    args.set_array(DOC_ADDRESSES_AT, doc_addresses)


def release_documents(args: PackedArrays) -> None:
    """Let go of the documents last put in `args` (`repack_documents`)."""
    for k in (TEXT_AT, DOC_ENDS_AT, DOC_OUT_ENDS_AT, DOC_ADDRESSES_AT):
        args.release(k)


@njit(inline="always")
def encode_args(values, table_dtype):
    """The arguments `pack_encode_args` packed: buf, table, doc_ends, doc_out_ends, scratch, out,
    doc_addresses, specials, ranks, cache (the text and the class table typed read-only, as
    they are)."""
    return (readonly_array_at(values, TEXT_AT, np.uint8), readonly_array_at(values, 2, table_dtype),
            array_at(values, DOC_ENDS_AT, np.int64), array_at(values, DOC_OUT_ENDS_AT, np.int64),
            array_at(values, SCRATCH_AT, np.int64), array_at(values, OUT_AT, np.int32),
            array_at(values, DOC_ADDRESSES_AT, np.int64), specials_at(values, SPECIALS_AT),
            ranks_at(values, RANKS_AT), table_at(values, CACHE_AT))


# Where `pack_encode_args` puts the text, the documents' ends, the output buffer and the tables
# (each array takes 2 values).
TEXT_AT = 0
DOC_ENDS_AT = 4
DOC_OUT_ENDS_AT = 6
SCRATCH_AT = 8
OUT_AT = 10
DOC_ADDRESSES_AT = 12
SPECIALS_AT = 14
RANKS_AT = SPECIALS_AT + SPECIALS_ITEMS
CACHE_AT = RANKS_AT + RANKS_ITEMS
ENCODE_ARG_ITEMS = CACHE_AT + TABLE_ITEMS
TEXT_BUFFER_AT = ENCODE_ARG_ITEMS  # the short path's text buffer, after what the kernel reads


# Memory is mapped a page at a time: bytes past a document's end in the same page can be read.
_PAGE = 4096


@njit(inline="always")  # into `encode_documents`
def document_at(doc_addresses, doc_ends, doc):
    """Document `doc` as the kernel reads it: an array whose items doc_ends[doc - 1] (0 for the
    first) to doc_ends[doc] are its bytes, at doc_addresses[doc]. The items before are not
    its (never read: no scanner looks back past a pre-token's start); those after, up to
    `BLOCK` bytes, are whatever follows it in its page of memory, so that its last bytes are
    scanned and keyed a block at a time too (read, never counted as text: see `past_the_end`)."""
    begin = doc_ends[doc - 1] if doc > 0 else np.int64(0)
    end = doc_ends[doc]
    address = doc_addresses[doc]
    past = address + (end - begin)
    readable = min(np.int64(BLOCK), ((past + (_PAGE - 1)) & -_PAGE) - past)
    return readonly_array_from(address - begin, end + readable, np.uint8)


@njit(inline="always")  # into each family's kernel, as `spans.scan_window`
def encode_documents(scanner, block_scanner, table_dtype, encode_new, args, separator, out_base,
                     doc, i):
    """Encode documents doc, doc + 1, ... of `buf` (document d ends at doc_ends[d]; the first
    starts at byte i) into `out`; return (ids written, next document, next byte, need). `args`:
    buf, doc_ends and the rest, packed by `pack_encode_args` (one array for Python to hand over,
    not 15: see `kernel_args`).

    Each document is a text of its own; special tokens are cut out of it (longest first) and
    become their ids; after each document comes `separator` unless it is negative. Stops early,
    at the start of a pre-token, when `out` might not hold its ids, when it is longer than
    `_HEAP_ABOVE` bytes (then `need` is its length: encode it with `encode_long_piece` and call
    again after it), or when the cache is full (`need` -1: `SharedCache.make_room`, then call
    again); else `need` is 0.
    `doc_out_ends[d]` receives out_base + the number of ids written up to the end of document d.
    `table_dtype`: that of the family's class table.

    With `doc_addresses` (one per document), the documents are not in `buf`: document d's
    bytes (doc_ends[d - 1]:doc_ends[d], as if end to end) are where doc_addresses[d] says, read
    there (`document_at`: a batch's ASCII texts where CPython holds them, not copied).
    """
    buf, table, doc_ends, doc_out_ends, scratch, out, doc_addresses, specials, ranks, cache = (
        encode_args(args, table_dtype))
    cap = out.shape[0] - SPARE_IDS  # see `copy_short_ids`
    window = scratch[:WINDOW]
    keys0 = scratch[WINDOW : 2 * WINDOW]
    keys1 = scratch[2 * WINDOW : 3 * WINDOW]
    tags = scratch[3 * WINDOW : 4 * WINDOW]
    hashes = scratch[4 * WINDOW : 5 * WINDOW]
    space = scratch[5 * WINDOW :]  # the part cache, then room for a merge
    keyed = (buf, cache, keys0, keys1, tags, hashes)  # `_key_and_prefetch` fills the last four
    w = np.int64(0)
    n_docs = doc_ends.shape[0]
    while doc < n_docs:
        end = doc_ends[doc]
        if doc_addresses.shape[0] > 0:  # each document where it lies
            buf = document_at(doc_addresses, doc_ends, doc)
            keyed = (buf, cache, keys0, keys1, tags, hashes)
        while i < end:
            stop, which = next_special(buf, i, end, specials)
            while i < stop:
                n = scan_window_visiting(scanner, block_scanner, _key_and_prefetch, keyed, buf,
                                         table, i, stop, window)
                # at most one id per byte: keep the pre-tokens whose ids surely fit
                while n > 0 and w + (window[n - 1] - i) > cap:
                    n -= 1
                if n == 0:  # not even the first: return, or it is long, merged outside
                    first = window[0] - i
                    return w, doc, i, first if first > _HEAP_ABOVE else 0
                for t in range(n):
                    j = window[t]
                    tag = tags[t]
                    if tag:  # nearly all: of 1 to 16 bytes, found, its ids written out
                        found = copy_short_ids(cache, np.uint64(hashes[t]), keys0[t], keys1[t],
                                               tag, out, w)
                        if found > 0:
                            w += found
                        else:  # new: merged, and stored where the search ended
                            w += encode_new(buf, i, j, keys0[t], keys1[t], tag,
                                            np.uint64(hashes[t]), found, out, w, ranks, cache,
                                            space)
                            if is_full(cache):  # it learns no more: let it grow, then go on
                                return w, doc, j, -1
                        i = j
                        continue
                    length = j - i
                    if length == 1:
                        out[uindex(w)] = ranks.byte_ids[buf[uindex(i)]]
                        w += 1
                    elif length > _HEAP_ABOVE:
                        return w, doc, i, length
                    else:  # longer than 16 bytes, or too near the end of buf for two loads
                        if length > MAX_SHORT:  # its key from `_key_and_prefetch`
                            k0, k1, tag, h = keys0[t], keys1[t], LONG, np.uint64(hashes[t])
                        else:
                            k0, k1, tag, h = key_of(buf, i, j)
                        w += _encode_one(encode_new, buf, i, j, k0, k1, tag, h, out, w, ranks,
                                         cache, space)
                        if is_full(cache):  # it learns no more: let it grow, then go on
                            return w, doc, j, -1
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
def encode_gpt2_merges(args, separator, out_base, doc, i):
    """`encode_documents` with GPT-2's scanner, in MERGES order."""
    return encode_documents(gpt2_pretoken_end, gpt2_block_boundaries, np.uint8,
                            _encode_new_merges, args, separator, out_base, doc, i)


@njit(cache=True, nogil=True, _nrt=False)
def encode_gpt2_ranks(args, separator, out_base, doc, i):
    """`encode_documents` with GPT-2's scanner, in RANKS order."""
    return encode_documents(gpt2_pretoken_end, gpt2_block_boundaries, np.uint8,
                            _encode_new_ranks, args, separator, out_base, doc, i)


@njit(cache=True, nogil=True, _nrt=False)
def encode_cl100k_merges(args, separator, out_base, doc, i):
    """`encode_documents` with cl100k's scanner, in MERGES order."""
    return encode_documents(cl100k_pretoken_end, cl100k_block_boundaries, np.uint8,
                            _encode_new_merges, args, separator, out_base, doc, i)


@njit(cache=True, nogil=True, _nrt=False)
def encode_cl100k_ranks(args, separator, out_base, doc, i):
    """`encode_documents` with cl100k's scanner, in RANKS order."""
    return encode_documents(cl100k_pretoken_end, cl100k_block_boundaries, np.uint8,
                            _encode_new_ranks, args, separator, out_base, doc, i)


@njit(cache=True, nogil=True, _nrt=False)
def encode_o200k_merges(args, separator, out_base, doc, i):
    """`encode_documents` with o200k's scanner, in MERGES order."""
    return encode_documents(o200k_pretoken_end, o200k_block_boundaries, np.uint16,
                            _encode_new_merges, args, separator, out_base, doc, i)


@njit(cache=True, nogil=True, _nrt=False)
def encode_o200k_ranks(args, separator, out_base, doc, i):
    """`encode_documents` with o200k's scanner, in RANKS order."""
    return encode_documents(o200k_pretoken_end, o200k_block_boundaries, np.uint16,
                            _encode_new_ranks, args, separator, out_base, doc, i)


# What every encode kernel above is compiled as: (packed arrays, separator, out_base, doc, i)
# -> (ids written, next document, next byte, need).
KERNEL_SIGNATURE = types.UniTuple(types.int64, 4)(types.Array(types.int64, 1, "C"), types.int64,
                                                  types.int64, types.int64, types.int64)
_call_kernel_at = call_at(KERNEL_SIGNATURE)


@njit(inline="always")  # into `_short_path`
def _encode_text_at(data, n, values):
    """Run the encode kernel on one text, the `n` bytes of UTF-8 at address `data`, with the
    other arguments packed in `values` (`pack_encode_args` with the thread's text buffer and
    `short_path_values`). Returns the number of ids written to the packed output (int32), or -1
    if the kernel stopped before the end (or raised): then encode the text the long way. The
    GIL is let go while the kernel runs on a text of `RELEASE_GIL_FROM` bytes or more (its
    value packed at `RELEASE_GIL_FROM_AT`).

    A text of up to `COPY_UP_TO` bytes is copied into the text buffer, which the kernel is told
    goes on `TEXT_PAD` bytes past the text's end: so it cuts the text's last 64 bytes a block at
    a time and keys its last pre-tokens with two loads, as in a batch (the copy costs less than
    those bytes scanned one pre-token at a time: TinyStories' documents of 843 bytes 1.04-1.05x,
    texts of 3-9 bytes 1.03-1.07x). A longer text is read where it is."""
    if n <= COPY_UP_TO:
        copy_bytes(values[TEXT_BUFFER_AT], data, n)
        values[TEXT_AT] = values[TEXT_BUFFER_AT]
        values[TEXT_AT + 1] = n + TEXT_PAD  # the buffer the kernel sees: the text, then the pad
    else:
        values[TEXT_AT] = data
        values[TEXT_AT + 1] = n
    array_at(values, DOC_ENDS_AT, np.int64)[0] = n  # where its only document ends
    own = own_items(array_at(values, SCRATCH_AT, np.int64))
    if not enter_table(table_at(values, CACHE_AT), own):  # replaced: the long way takes it up
        return -1
    release = n >= values[RELEASE_GIL_FROM_AT]
    thread = 0
    if release:
        thread = call_c(values[SAVE_THREAD_AT], ())
    ok, (w, doc, _, _) = _call_kernel_at(values[KERNEL_AT], (values, -1, 0, 0, 0))
    if release:
        call_c(values[RESTORE_THREAD_AT], (thread,))
    leave_table(own)
    if not ok or doc != 1:
        return -1
    return w


@njit(inline="always")  # into `_short_path`
def _ids_object(values, base, w, kind):
    """The first w ids of the packed output as a new object of `kind` (`TEXT_UINT16`,
    `TEXT_UINT32` or `TEXT_LIST`); 0 (NULL) with CPython's error set if it could not be made.
    Made here, not from a view of the buffer in Python: `view[:w].copy()` took ~0.2 us of a
    ~0.65 us call on a short text, `PyArray_New` and a loop take less than half of that."""
    ids = array_at(values, OUT_AT, np.int32)
    if kind == TEXT_LIST:  # of the ints of `int_objects`, one more reference each
        result = call_c(values[LIST_NEW_AT], (w,))
        if result == 0:
            return 0
        fill_list(load_word(result + LIST_ITEMS_OFFSET), ids, 0, w,
                  array_from(values[INT_ITEMS_AT], values[INT_COUNT_AT], np.int64),
                  values[INCREF_AT])
        return result
    wide = kind == TEXT_UINT32
    values[DIMS_AT] = w  # the array's one dimension, read from its address
    result = call_c(values[ARRAY_NEW_AT], (values[NDARRAY_TYPE_AT], 1, base + 8 * DIMS_AT,
                                           values[UINT32_NUM_AT] if wide else values[UINT16_NUM_AT],
                                           0, 0, 0, 0, 0))
    if result == 0:
        return 0
    data = load_word(result + NDARRAY_DATA_OFFSET)
    if wide:  # the ids are below 2**31: their int32 bits are their uint32 ones
        copy_bytes(data, values[OUT_AT], 4 * w)
    else:
        narrowed = array_from(data, w, np.uint16)
        for k in range(w):
            narrowed[uindex(k)] = np.uint16(ids[uindex(k)])
    return result


@njit(inline="always")  # into `_short_path`
def _encode_text_object(values, base, text, own):
    """Encode the text object at address `text` (`_encode_text_at`): for the thread's call, an
    ASCII `str` (read where it lies) or `bytes` of valid UTF-8; for a tokenizer's own call
    (`own`), a `str` only (the methods refuse `bytes`), of any characters: if not ASCII, made
    UTF-8 first (a new `bytes`, as `str.encode` makes it). Returns the number of ids, or -1:
    another type, a text too long for the output buffer, or one the kernel stopped in (then
    encode it the long way), with no exception left set."""
    type_of_text = load_word(text + OB_TYPE_OFFSET)
    room = values[OUT_AT + 1] - SPARE_IDS  # the ids of a shorter text fit
    data = 0
    n = 0
    made = 0
    if type_of_text == values[STR_TYPE_AT]:
        if not own or load_word(text + STR_STATE_OFFSET) & STR_ASCII_BIT:
            data = call_c(values[AS_UTF8_AT], (text, base + 8 * SIZE_OUT_AT))  # no copy
            n = values[SIZE_OUT_AT]
        elif load_word(text + STR_LENGTH_OFFSET) < room:  # (else longer in UTF-8 too)
            made = call_c(values[AS_UTF8_STRING_AT], (text,))  # 0 for a lone surrogate
            if made != 0:
                data = call_c(values[BYTES_DATA_AT], (made,))
                n = call_c(values[BYTES_SIZE_AT], (made,))
    elif type_of_text == values[BYTES_TYPE_AT] and not own:
        data = call_c(values[BYTES_DATA_AT], (text,))
        n = call_c(values[BYTES_SIZE_AT], (text,))
    w = -1
    if data == 0:  # another type, or a str CPython could not give as UTF-8
        call_c(values[ERR_CLEAR_AT], ())
    elif n < room:
        w = _encode_text_at(data, n, values)
    if made != 0:
        call_c(values[DECREF_AT], (made,))
    return w


def _short_path(self_object, args, nargs, kwnames):
    """The short path's one call, compiled as a C function (`short_path_address`) and called
    as a builtin (`kernel_args.fastcall_builtin`) bound to a tuple, in one of two ways:

    - `(values,)`, a thread's packed values: the thread's call (`ThreadState.text_call`),
      call(text, kind), `text` an ASCII `str` (read where it lies) or `bytes` of valid UTF-8.
      Returns, by `kind`: `TEXT_COUNT`, the number of ids written to the output buffer (int32),
      or -1; `TEXT_UINT16`, `TEXT_UINT32` or `TEXT_LIST`, the ids as a new uint16 or uint32
      array or a list, or None. -1 and None say: encode the text the long way (the kernel
      stopped, `text` was of another type, or `kind` of none of these).
    - `(entry, fallback, state)`: a tokenizer's own `encode` or `encode_to_numpy`
      (`DocumentEncoder.own_call`). Called with one `str` (of any characters) from the thread
      that made it, while that thread's short path is ready, it returns the ids as its entry's
      kind, as the thread's call above; any other call, or a text the kernel stopped in (then
      run again by the method: rare, a cache that filled), is `fallback`'s (the method it
      stands for, bound), with the same arguments. So a short text costs no Python at all
      (~0.25 us of 0.45 for "Hi!" through the method).

    Against the call of a Numba function, which unboxed a `bytes` and the values array and let
    go of the GIL each time, and a `str.encode` before it: see PERFORMANCE.md's "What moved
    encoding". The values' address is read from the array in the tuple."""
    # Each helper below is inlined once, for both ways (twice, it took 0.9-1.2 s to compile
    # against 0.4-0.6).
    first = load_word(self_object + TUPLE_ITEMS_OFFSET)
    own = load_word(self_object + TUPLE_SIZE_OFFSET) != 1
    entry = array_from(load_word(first + NDARRAY_DATA_OFFSET),
                       OWN_CALL_ITEMS if own else SHORT_PATH_ITEMS, np.int64)
    kind = -1  # none: no text to encode here
    if own:
        base = entry[OWN_VALUES]  # 0 while the thread's short path is not ready
        if (base != 0 and nargs == 1 and kwnames == 0
                and call_c(entry[OWN_THREAD_IDENT], ()) == entry[OWN_THREAD]):
            kind = entry[OWN_KIND]
    else:  # the thread's call: `entry` is its values
        base = load_word(first + NDARRAY_DATA_OFFSET)
        if nargs == 2 and kwnames == 0:
            kind = call_c(entry[AS_SSIZE_AT], (load_word(args + 8),))  # -1 if it is not an int
            if not TEXT_COUNT <= kind <= TEXT_LIST:  # (an error set if not an int)
                kind = -1
                call_c(entry[ERR_CLEAR_AT], ())
    values = array_from(base, SHORT_PATH_ITEMS, np.int64)  # read only with a kind
    w = -1
    if kind >= 0:
        w = _encode_text_object(values, base, load_word(args), own)
        if w >= 0 and kind != TEXT_COUNT:
            return _ids_object(values, base, w, kind)
    if own:
        fallback = load_word(self_object + TUPLE_ITEMS_OFFSET + 8)
        return call_c(entry[OWN_VECTORCALL], (fallback, args, nargs, kwnames))
    if kind == TEXT_COUNT:
        return call_c(values[NEW_INT_AT], (w,))
    call_c(values[INCREF_AT], (values[NONE_AT],))
    return values[NONE_AT]


# What the short path's call returns (`_short_path`'s `kind`).
TEXT_COUNT, TEXT_UINT16, TEXT_UINT32, TEXT_LIST = range(4)

# What `_short_path` reads after the short path's text buffer in the packed values: the
# kernel's address, the C API functions it calls (CPython's and NumPy's `PyArray_New`: their
# addresses in this process, since the compiled code is cached, and holds none) and the
# objects it tells apart or makes (`short_path_values`), where the items of `int_objects` are
# and how many, a slot for a size the C API returns and one for the length of an array it
# makes.
SHORT_PATH_FUNCTIONS = ("PyUnicode_AsUTF8AndSize", "PyUnicode_AsUTF8String", "PyBytes_AsString",
                        "PyBytes_Size", "PyErr_Clear", "PyLong_FromSsize_t", "PyLong_AsSsize_t",
                        "PyList_New", "Py_IncRef", "Py_DecRef", "PyEval_SaveThread",
                        "PyEval_RestoreThread")
(KERNEL_AT, AS_UTF8_AT, AS_UTF8_STRING_AT, BYTES_DATA_AT, BYTES_SIZE_AT, ERR_CLEAR_AT, NEW_INT_AT,
 AS_SSIZE_AT, LIST_NEW_AT, INCREF_AT, DECREF_AT, SAVE_THREAD_AT, RESTORE_THREAD_AT,
 ARRAY_NEW_AT, STR_TYPE_AT, BYTES_TYPE_AT, NDARRAY_TYPE_AT, NONE_AT, UINT16_NUM_AT, UINT32_NUM_AT,
 INT_ITEMS_AT, INT_COUNT_AT, RELEASE_GIL_FROM_AT, SIZE_OUT_AT, DIMS_AT, SHORT_PATH_ITEMS) = range(
    TEXT_BUFFER_AT + 2, TEXT_BUFFER_AT + 28)
# What a tokenizer's own call (`own_call`) holds in its entry array: the address of its thread's
# packed values (0 while there are none), the thread (`threading.get_ident`), the kind of its
# result, and the addresses of `PyThread_get_thread_ident` and `PyObject_Vectorcall`.
(OWN_VALUES, OWN_THREAD, OWN_KIND, OWN_THREAD_IDENT, OWN_VECTORCALL, OWN_CALL_ITEMS) = range(6)
# A text of this many bytes or more lets go of the GIL while the kernel runs (other threads
# run meanwhile); a shorter one keeps it: letting go and taking it again costs ~50-80 ns, and
# the kernel takes less than a microsecond on less than this.
RELEASE_GIL_FROM = 256


def short_path_values(kernel: int, ints: list) -> tuple:
    """The ints `_short_path` reads after the text buffer, for the kernel at `kernel`, making
    lists of `ints[id]` (`int_objects`)."""
    return ((kernel,) + _c_api_addresses()
            + (id(str), id(bytes), id(np.ndarray), id(None), np.dtype(np.uint16).num,
               np.dtype(np.uint32).num, int_items(ints), len(ints),
               RELEASE_GIL_FROM, 0, 0))


@functools.cache  # the same for the process: not looked up again each time a thread repacks
def _c_api_addresses() -> tuple:
    """The addresses of `SHORT_PATH_FUNCTIONS`, then NumPy's `PyArray_New`'s."""
    return (tuple(c_function_address(name) for name in SHORT_PATH_FUNCTIONS)
            + (new_array_address(),))


def short_path_address() -> int:
    """Where `_short_path`'s machine code is, as a C function: compiled on first use (or loaded
    from the cache: `short_path_cached`)."""
    return fastcall_address(_short_path)


def short_path_cached() -> bool:
    """Whether Numba's cache holds `_short_path` for the current source."""
    return cfunc_cached(_short_path)


# The short path copies texts of up to this many bytes (at ~20 GB/s, a copy of 2 KB costs about
# what scanning 64 bytes one pre-token at a time does) into a buffer with `TEXT_PAD` bytes after
# them, which the kernel may read but does not use: a block (the block scanners read 64 bytes
# from a pre-token's start; `_key_and_prefetch` 16).
COPY_UP_TO = 2048
TEXT_PAD = BLOCK


# scanner family -> its `encode_documents` kernels, in MERGES and RANKS order
ENCODERS = {
    "gpt2": (encode_gpt2_merges, encode_gpt2_ranks),
    "cl100k": (encode_cl100k_merges, encode_cl100k_ranks),
    "o200k": (encode_o200k_merges, encode_o200k_ranks),
}


def warm_up(family: str, mode: int) -> None:
    """Compile (or load) a family's encode kernel in one merge order, on a tiny input (see
    `kernel_cache`)."""
    from .scanners.specials import make_specials

    # Tables of the right types, built without a kernel: the process that asked for this one
    # compiles the kernel that fills the vocab table (`_fill_vocab_table`) meanwhile.
    ranks = _no_merges(np.arange(256, dtype=np.int32), mode)
    vocab = new_table(16, _HEAP_ABOVE, 64)
    table, kernel = encoder_for(family, mode)
    buf = np.frombuffer(b"ab ab<|x|>", dtype=np.uint8)
    out = np.empty(len(buf) + 2, dtype=np.int32)
    args = pack_encode_args(buf, table, np.array([len(buf)], dtype=np.int64),
                            np.empty(1, dtype=np.int64), new_scratch(), out,
                            make_specials([("<|x|>", 257)]), ranks, vocab._replace(learns=True))
    kernel(args.values, -1, 0, 0, 0)


def compile_shared_first(mode: int) -> None:
    """On a first run, while another process compiles the encode kernel (`warm_up`): compile here
    helpers of that kernel, each before that process reaches it, so that it loads them from the
    cache: the merge loop (`_merge_rounds` or `_merge_leftmost`) and `store`, which it types
    second, then `is_full`, `find` and `copy_ids` (which it types last), while it compiles the
    rest (with the merge loop compiled there, this process waited ~1.5 s for it at the end).
    This process needs the merge loop and `store` for the vocab table anyway. Calls on tiny
    inputs of the argument types the kernels call them with."""
    buf = np.frombuffer(b"ab", dtype=np.uint8)  # read-only, as the kernels' text
    table = new_table(16, _HEAP_ABOVE, 64)._replace(learns=True)
    ranks = _no_merges(np.arange(256, dtype=np.int32), mode)
    ids = np.zeros(2 + SPARE_IDS, dtype=np.int32)
    merge = _merge_rounds if mode == MERGES else _merge_leftmost
    m = merge(ids, 0, 2, np.zeros(_heap_space.py_func(2), np.int64), ranks)
    # pre-token "ab" stored at slot 0 of the throwaway table, its key unused
    store(table, 0, 0, 0, 2, buf, 0, 2, ids, 0, m, np.zeros(OWN_ITEMS, np.int64))
    is_full(table)
    copy_ids(table, find(table, 0, 0, 0, 2, buf, 0, 2), ids, 0)


def encoder_for(family: str, mode: int):
    """(class table, encode kernel) of a scanner family, in merge order `mode`."""
    from .scanners import cl100k, gpt2, o200k

    tables = {"gpt2": gpt2.class_table, "cl100k": cl100k.class_table, "o200k": o200k.class_table}
    return tables[family](), ENCODERS[family][mode]


@njit(inline="always")  # into the two kernels below
def _encode_pieces(encode_new, buf, offsets, special_slots, special_ids, ranks, cache,
                   scratch, out, k):
    """The ids of pre-tokens found elsewhere (by `regex`), from piece k on: piece k is
    buf[offsets[k]:offsets[k + 1]], and the pieces listed in `special_slots` are special tokens
    with ids `special_ids`. `out` holds one id per byte and `SPARE_IDS` more (`_merge_part`).
    Returns (ids written, next piece, need): it stops before a piece longer than `_HEAP_ABOVE`
    bytes (`need`, its length) and after one that filled the cache (`need` -1)."""
    space = scratch[5 * WINDOW :]  # the part cache, then room for a merge
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
        elif offsets[k + 1] - offsets[k] == 1:
            out[w] = ranks.byte_ids[buf[offsets[k]]]
            w += 1
        elif offsets[k + 1] > offsets[k]:
            k0, k1, tag, h = key_of(buf, offsets[k], offsets[k + 1])
            w += _encode_one(encode_new, buf, offsets[k], offsets[k + 1], k0, k1, tag, h, out, w,
                             ranks, cache, space)
            if is_full(cache):
                return w, k + 1, -1
        k += 1
    return w, k, 0


@njit(cache=True, nogil=True, _nrt=False)
def encode_pieces_merges(buf, offsets, special_slots, special_ids, ranks, cache, scratch,
                         out, k):
    """`_encode_pieces` in MERGES order."""
    return _encode_pieces(_encode_new_merges, buf, offsets, special_slots, special_ids, ranks,
                          cache, scratch, out, k)


@njit(cache=True, nogil=True, _nrt=False)
def encode_pieces_ranks(buf, offsets, special_slots, special_ids, ranks, cache, scratch,
                        out, k):
    """`_encode_pieces` in RANKS order."""
    return _encode_pieces(_encode_new_ranks, buf, offsets, special_slots, special_ids, ranks,
                          cache, scratch, out, k)


PIECE_ENCODERS = (encode_pieces_merges, encode_pieces_ranks)


# --- the vocab table ---------------------------------------------------------------------------


@njit(cache=True, nogil=True, _nrt=False)
def _fill_vocab_table(token_bytes, token_offsets, token_ids, byte_values, ranks, table, scratch,
                      work, own):
    """Store every single byte (byte_values[b] is b) with its id, then every token of two or
    more bytes with the ids its own bytes encode to: in RANKS order the token itself (tiktoken's
    rule), in MERGES order whatever the merges make of them (nearly always the token too, but a
    merge list need not promise it; tokens longer than `_HEAP_ABOVE` bytes are left to
    `encode_long_piece`). With the bytes in it, a pre-token of one byte (a third of those of web
    text) is looked up like any other: one case fewer, one unpredictable branch fewer, in the
    kernels' loop."""
    stored = 0
    for b in range(256):
        slot, k0, k1, tag, h = lookup(table, byte_values, b, b + 1)
        work[0] = ranks.byte_ids[b]
        # np.int64: a literal 1 would compile `store` once more
        stored += store(table, -1 - slot, k0, k1, tag, byte_values, b, np.int64(1), work,
                        np.int64(0), np.int64(1), own)
    for t in range(token_ids.shape[0]):
        start = token_offsets[token_ids[t]]
        end = token_offsets[token_ids[t] + 1]
        length = end - start
        if length < 2 or length > table.max_key_len:
            continue
        if ranks.mode == MERGES and length > _HEAP_ABOVE:
            continue  # merged when it is met (`encode_long_piece`)
        slot, k0, k1, tag, h = lookup(table, token_bytes, start, end)
        if slot >= 0:
            continue  # the same bytes twice: the first (lowest) id stays
        if ranks.mode == RANKS:
            work[0] = token_ids[t]
            m = np.int64(1)
        else:
            for i in range(length):
                work[i] = ranks.byte_ids[token_bytes[start + i]]
            m = _merge_rounds(work, np.int64(0), length, scratch, ranks)
        stored += store(table, -1 - slot, k0, k1, tag, token_bytes, start, length, work,
                        np.int64(0), m, own)
    count_entries(table, stored)


def build_vocab_table(token_bytes: np.ndarray, token_offsets: np.ndarray, token_ids: np.ndarray,
                      ranks: Ranks) -> Table:
    """The vocab table of the single bytes and the tokens with ids `token_ids`, in order of
    preference (token i is token_bytes[token_offsets[i]:token_offsets[i + 1]]; see
    `_fill_vocab_table`)."""
    token_ids = np.ascontiguousarray(token_ids, dtype=np.int32)
    lengths = token_offsets[token_ids + 1] - token_offsets[token_ids]
    longest = max(int(lengths.max(initial=2)), _HEAP_ABOVE)
    records = int(lengths[lengths > MAX_SHORT].sum()) + 4 * len(token_ids) + 64 + RECORD_RUN
    # Room for a thread cache's first entries too: copying it then makes that cache (`_copy`);
    # spread over more slots, so that fewer lookups go past their home (`VOCAB_SPREAD`).
    table = new_table(VOCAB_SPREAD * (256 + len(token_ids) + CACHE_FIRST_ROOM), longest, records)
    table = with_room(table, VOCAB_SPREAD)
    byte_values = np.arange(256, dtype=np.uint8)
    byte_values.setflags(write=token_bytes.flags.writeable)  # one type: one compile of `lookup`
    _fill_vocab_table(token_bytes, token_offsets, token_ids, byte_values, ranks, table,
                      np.empty(_heap_space.py_func(_HEAP_ABOVE), np.int64),
                      np.empty(_HEAP_ABOVE, np.int32), np.zeros(OWN_ITEMS, np.int64))
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


@njit(cache=True, nogil=True, _nrt=False)
def _token_id(buf, start, end, byte_ids, vocab):
    """The id of token buf[start:end] (from the vocab table in RANKS order), or -1."""
    if end - start == 1:
        return byte_ids[buf[start]]
    if end - start > vocab.max_key_len:
        return -1
    s, _, _, _, _ = lookup(vocab, buf, start, end)
    if s < 0:
        return -1
    meta = vocab.slots[4 * s + 2]
    if inline_count(meta) == 1:
        return inline_id(meta, 0, 0)
    return np.int64(vocab.records[vocab.slots[4 * s + 3] + 1])  # a long token: [1, its id, ...]


def build_split_ranks(token_bytes, token_offsets, token_ids, byte_ids, n_vocab: int) -> Ranks:
    """The `Ranks` of a rank file (RANKS order; ids are ranks) whose regular tokens are
    `token_ids`: every pair of tokens whose joined bytes are a token merges into it."""
    placeholder = _no_merges(byte_ids, RANKS)
    vocab = build_vocab_table(token_bytes, token_offsets, token_ids, placeholder)
    token_ids = np.ascontiguousarray(token_ids, dtype=np.int64)
    cuts = int(np.maximum(token_offsets[token_ids + 1] - token_offsets[token_ids] - 1, 0).sum())
    left, right, rank = (np.empty(cuts, dtype=np.int64) for _ in range(3))
    n = _split_pairs(token_bytes, token_offsets, token_ids, placeholder.byte_ids, vocab, left,
                     right, rank)
    return build_ranks(left[:n], right[:n], rank[:n], np.arange(n_vocab, dtype=np.int32),
                       byte_ids, RANKS, *cut_tables(token_bytes, token_offsets, token_ids))


# --- driving the kernels -------------------------------------------------------------------------


class ThreadState:
    """What one thread's encoding writes to: the tokenizer's shared cache, this thread's scratch
    space and output buffer; and the short path's packed kernel arguments, ready but for the
    text (`DocumentEncoder.encode_text`)."""

    def __init__(self, cache: SharedCache):
        self.cache = cache
        self.scratch = new_scratch()
        # where its kernels' callers publish the cache table they read (`enter_table`)
        self.hazard_address = address(self.scratch) + 8 * (OWN_AT + OWN_HAZARD)
        cache.attach(self)  # (with its hazard address: another thread may read it at once)
        self.out = np.empty(0, dtype=np.int32)  # the kernels' output, reused: no page faults
        self.doc_end = np.empty(1, dtype=np.int64)  # for one text at a time
        self.doc_out_end = np.empty(1, dtype=np.int64)
        # The short path: its call, `text_call(text, kind)` (`_short_path`, bound to its
        # packed arguments, the text left out: `text_args`), and the bytes of text it has room
        # for (fewer than `text_room`). Set through `set_text_call`, which tells the
        # tokenizer's own calls made for this thread (`own_call`: their entries).
        self.text_call = None
        self.own_entries: list[np.ndarray] = []
        self.text_args: PackedArrays | None = None
        self.text_room = 0
        # Its ids out[:w] (int32) by w, as views made once (`IdViews`), for `TEXT_COUNT`.
        self.text_ids: IdViews | None = None
        self.text_buffer = np.zeros(COPY_UP_TO + TEXT_PAD, dtype=np.uint8)  # see _short_path
        # The other calls' packed arguments (`DocumentEncoder._packed`), and the output buffer
        # and cache table they hold.
        self.run_args: PackedArrays | None = None
        self.run_holds = (None, None)
        self.text_holds = (None, None)  # the output buffer and cache table text_args holds
        self.utf8 = np.empty(0, dtype=np.uint8)  # see `utf8_room`

    def output(self, items: int) -> np.ndarray:
        """The output buffer, with room for `items` ids (at most `_OUT_ITEMS`: the kernels
        return when it is full, and are called again)."""
        items = min(items, _OUT_ITEMS) + SPARE_IDS  # see `copy_short_ids`
        if len(self.out) < items:
            self.set_text_call(None)  # its arguments hold the old buffer
            self.out = np.empty(max(items, 2 * len(self.out)), dtype=np.int32)
        return self.out

    def ready_for_groups(self) -> None:
        """Make the output buffer and the UTF-8 buffer as large as a batch's groups ask for
        (`GROUP_OUT_ITEMS` ids, `GROUP_UTF8_BYTES`) and write their first pages, as many as a
        group of 1M characters mostly fills, so that they fault in now: a pool thread does it
        in the background, before it takes its first group (`Tokenizer._ready_pool_states`)."""
        self.output(GROUP_OUT_ITEMS)[:GROUP_OUT_WRITTEN] = 0
        self.utf8_room(GROUP_UTF8_BYTES)[:GROUP_UTF8_WRITTEN] = 0

    def utf8_room(self, items: int) -> np.ndarray:
        """A buffer of at least `items` bytes for UTF-8 made from a str (`text_bytes`), kept
        for the thread: pages fault in once, not for every group of a batch."""
        if len(self.utf8) < items:
            self.utf8 = np.empty(max(items, 2 * len(self.utf8)), dtype=np.uint8)
        return self.utf8

    def make_room(self, full: Table) -> None:
        """A kernel found `full`, the cache's table it had, full: let the cache grow
        (`SharedCache.make_room`), and take up its table."""
        self.cache.make_room(full, self)
        self.set_text_call(None)  # its arguments hold the old table

    def enter(self, table: Table) -> bool:
        """Before a kernel runs on `table` (the cache's) in this thread: publish it
        (`enter_table_of`); if it was replaced meanwhile, False, after `make_room` (then take up
        the cache's table again)."""
        if enter_table_of(table, self.scratch):
            return True
        self.make_room(table)
        return False

    def leave(self) -> None:
        """After the kernel that `enter` was for (`leave_table_of`)."""
        leave_table_of(self.scratch)

    def set_text_call(self, call) -> None:
        """Make `call` the short path's call (None: there is none), bound to `text_args`; the
        tokenizer's own calls for this thread read the values it is bound to from then on."""
        self.text_call = call
        for entry in self.own_entries:
            self._tell(entry)

    def add_own_entry(self, entry: np.ndarray) -> None:
        """Tell `entry` (an own call's, `DocumentEncoder.own_call`) what `set_text_call` sets,
        from now on."""
        self.own_entries.append(entry)
        self._tell(entry)

    def _tell(self, entry: np.ndarray) -> None:
        entry[OWN_VALUES] = 0 if self.text_call is None else address(self.text_args.values)


class IdViews(dict):
    """`ids[:w]` by w, each view made on first use and kept (for w up to `_KEPT_VIEWS`): the
    short path's result is a copy of its first w ids, and slicing the buffer took about as long
    as copying the slice (0.12-0.15 µs each for a short text), where a dict lookup takes 0.03.
    A count not met before costs ~0.15 µs more than a slice (this method's frame): texts of a
    few lengths gain, texts of every length lose it, at most `_KEPT_VIEWS` times."""

    __slots__ = ("ids",)

    def __init__(self, ids: np.ndarray):
        super().__init__()
        self.ids = ids

    def __missing__(self, w: int) -> np.ndarray:
        view = self.ids[:w]
        if w <= _KEPT_VIEWS:
            self[w] = view
        return view


_KEPT_VIEWS = 1 << 10  # views kept per buffer at most (~150 bytes each with its entry)
_OUT_ITEMS = 1 << 22  # ids per kernel call at most (16 MB)
# `ThreadState.ready_for_groups`: a group of up to 1M characters asks for an id a byte; its
# ids fill 70-250K items (web_5M, TinyStories and multi_1M in groups of 130-330K characters)
GROUP_OUT_ITEMS = 1 << 21
GROUP_OUT_WRITTEN = 1 << 18  # 1 MB
GROUP_UTF8_BYTES = 1 << 21
GROUP_UTF8_WRITTEN = 1 << 19
_TEXT_ROOM = 1 << 16  # ids the short path's output buffer has room for at least
# A text of fewer bytes than this that the short path has no room for makes that much room, for
# the next one as long (`encode_text_long`): each then takes the short path's one call, not the
# long way's Python and fresh buffers. web_5M one document at a time in a fresh process (its 11
# documents of 64 to 163 KB): 0.94x the time, 12 of 14 alternated pairs faster; multi_1M, whose
# one long document is 593 KB, goes as before (1 MB of room for every text was no faster for
# it: 1.05x, 4 of 14 pairs faster).
_TEXT_ROOM_GROWS_TO = 1 << 18
_UINT8 = np.dtype(np.uint8)
_NO_TEXT = np.empty(0, dtype=np.uint8)  # packed in the short path's place of the text
_AFTER_FIRST_TEXT = object()  # `DocumentEncoder._text_entry` once a first text is encoded
_frombuffer = np.frombuffer


def load_rare_kernels(ranks: Ranks, vocab: Table) -> None:
    """Load the kernels encoding calls only now and then (for a pre-token of more than
    `_HEAP_ABOVE` bytes, a cache that grows, a long text's UTF-8) if they are in Numba's
    cache, so that their first use does not load them then: loading takes ~10 ms holding the
    GIL, which on a first batch stops every other thread (a first 2-thread batch of multi_1M
    took 29 ms, 21 with them loaded). Not cached yet: they compile when first needed. (A batch's
    UTF-8 and lengths, `gather_utf8` and `str_lengths`, are not rare; they are loaded here all
    the same: ~2.6 ms more for the second.)"""
    from .encode_tables import _rehash
    from .text_bytes import gather_layout_known, gather_utf8, str_lengths

    if cached(encode_long_piece):
        text = np.frombuffer(b"x" * (_HEAP_ABOVE + 1), dtype=np.uint8)  # the types of real calls
        encode_long_piece(text, 0, len(text), ranks, vocab, np.empty(len(text), np.int32))
    if cached(_rehash):
        small = new_table(1, 16, 8)._replace(learns=True)
        _rehash(small, new_table(2, 16, 8)._replace(learns=True))
    if gather_layout_known():  # a batch's UTF-8 and lengths (`text_bytes`)
        texts = ["\xe9"]
        if cached(gather_utf8):
            gather_utf8(id(texts), 1, np.zeros(0, dtype=np.int64), np.empty(4, dtype=np.uint8),
                        np.empty(1, dtype=np.int64), np.empty(1, dtype=np.int64))
        if cached(str_lengths):
            str_lengths(id(texts), 1, id(str), np.empty(1, dtype=np.int64))


def long_piece_ids(buf, start: int, length: int, ranks: Ranks, vocab: Table) -> np.ndarray:
    """The ids of the pre-token buf[start:start + length] (more than `_HEAP_ABOVE` bytes)."""
    out = np.empty(length, dtype=np.int32)
    return out[: encode_long_piece(buf, start, start + length, ranks, vocab, out)]


class DocumentEncoder:
    """A family's encode kernel bound to one tokenizer's tables, called from Python.

    The kernel is called at its compiled entry point (`kernel_cache.entry_point`), found on its
    first call: its arguments, the packed arrays (`pack_encode_args`) and four ints, are always
    of the same types."""

    def __init__(self, kernel, class_table, specials: Specials, ranks: Ranks, vocab: Table,
                 n_ids: int):
        self.kernel = kernel
        self.tables = (class_table, specials, ranks, vocab)
        self.n_ids = n_ids  # ids are below it: the ints a list of ids is made of (`int_objects`)
        self._entry = None
        # The short path's (`_short_path`'s address, the kernel's address); False if there is
        # none; None before a first text, `_AFTER_FIRST_TEXT` after it.
        self._text_entry = None

    def encode_text(self, data, state: ThreadState, dtype) -> np.ndarray:
        """The ids (as `dtype`, or a list if it is None) of one document, `data`: valid UTF-8
        `bytes`, or an ASCII `str`. The short path, for texts encoded one at a time: one
        compiled call (`state.text_call`, see `_short_path`) with the arguments kept packed in
        `state`, so that the Python around it costs well under 1 µs besides the copy of the ids:
        it is most of what a short text costs. `Tokenizer.encode` and `encode_to_numpy` make
        this call themselves for a list and their default dtypes (uint16 and uint32: the call
        makes the result), a frame less; other dtypes come here."""
        call = state.text_call
        if call is not None and len(data) < state.text_room:
            if dtype is None:
                ids = call(data, TEXT_LIST)
                if ids is not None:
                    return ids
            else:
                w = call(data, TEXT_COUNT)
                if w >= 0:
                    return state.text_ids[w].astype(dtype)
        return self.encode_text_long(data, state, dtype)

    def encode_text_long(self, data, state: ThreadState, dtype):
        """`encode_text` the long way: a first call, a text longer than the output buffer, a
        pre-token too long for the pass, a cache that grew, or a text the kernel stopped in."""
        if type(data) is str:  # ASCII
            data = data.encode("ascii")
        state.doc_end[0] = len(data)
        # The output buffer as it is (at least `_TEXT_ROOM` ids): a longer text takes more
        # calls, its ids gathered in the result, rather than a buffer as long as the longest text
        # kept for the thread (and a multi_1M document of 593 KB faulted in 1.4 MB of it). But
        # one of fewer than `_TEXT_ROOM_GROWS_TO` bytes makes that much room, at once, so that
        # the next such text takes the short path.
        if max(len(state.out) - SPARE_IDS, _TEXT_ROOM) <= len(data) < _TEXT_ROOM_GROWS_TO:
            state.output(_TEXT_ROOM_GROWS_TO)
        room = max(len(state.out) - SPARE_IDS, _TEXT_ROOM + 1)
        ids = self._run(_frombuffer(data, _UINT8), state.doc_end, -1, state, state.doc_out_end,
                        np.int32 if dtype is None else dtype, room)
        self._ready_text_call(state)
        return id_list(ids, self.n_ids) if dtype is None else ids

    def _ready_text_call(self, state: ThreadState) -> None:
        """Ready the short path in `state`: pack its arguments (the cache and the output buffer
        may be new), for texts shorter than the output buffer (at least `_TEXT_ROOM` bytes)."""
        if self._text_entry is None:  # a first text
            self._text_entry = _AFTER_FIRST_TEXT
            if not short_path_cached():  # compiling takes ~0.8 s: not for one text (the
                return                   # CLI's, a warm-up), so it waits for a second
            # Cached, it loads now: at the second text, loading took 3-8 ms of the first
            # document's encode after a warm-up (a fresh process's pass over web_5M: ~47 ms).
        if self._text_entry is _AFTER_FIRST_TEXT:
            self._text_entry = self._text_call()
        if not self._text_entry:
            return
        table, specials, ranks, _ = self.tables
        out = state.output(_TEXT_ROOM + 1)
        cache = state.cache.table
        if (state.text_call is not None and state.text_holds[0] is out
                and state.text_holds[1] is cache):
            return  # ready as it is (packing took 65-85 us, 13% of a text of 100k characters)
        address, kernel = self._text_entry
        state.set_text_call(None)  # its values hold the arrays packed before, let go of here
        state.text_args = pack_encode_args(_NO_TEXT, table, state.doc_end, state.doc_out_end,
                                           state.scratch, out, specials, ranks, cache,
                                           state.text_buffer,
                                           short_path_values(kernel, int_objects(self.n_ids)))
        state.text_holds = (out, cache)
        state.text_room = len(out) - SPARE_IDS  # the ids of a shorter text fit
        state.text_ids = IdViews(out)
        # bound to the values (which it holds), from which it reads the arrays' addresses
        state.set_text_call(fastcall_builtin(address, (state.text_args.values,), "encode_text"))

    def own_call(self, state: ThreadState, kind: int, fallback, name: str, doc: str):
        """A tokenizer's own `encode` or `encode_to_numpy` for one text (see `_short_path`): a
        builtin that, called with one text from this thread, takes `state`'s short path
        (which must be ready: `_ready_text_call`) and returns the ids as `kind`, with no Python
        between; any other call is `fallback`'s (the method, bound), as it would have been."""
        entry = np.zeros(OWN_CALL_ITEMS, dtype=np.int64)
        entry[OWN_THREAD] = threading.get_ident()
        entry[OWN_KIND] = kind
        entry[OWN_THREAD_IDENT] = c_function_address("PyThread_get_thread_ident")
        entry[OWN_VECTORCALL] = c_function_address("PyObject_Vectorcall")
        state.add_own_entry(entry)
        return fastcall_builtin(self._text_entry[0], (entry, fallback, state), name, doc)

    def _text_call(self):
        """(`_short_path`'s address, the kernel's address), compiled or loaded; False if this
        Numba does not say where the kernel is, or cannot compile the call, or objects are not
        laid out as it reads them, or NumPy's `PyArray_New` is not found (then every text goes
        the long way: the tests check that it does not, with the Numba, the Python and the
        NumPy they run on)."""
        values = np.zeros(ENCODE_ARG_ITEMS, dtype=np.int64)
        kernel = native_address(self.kernel, (values, -1, 0, 0, 0), KERNEL_SIGNATURE)
        if kernel is None or not object_layout_known() or _c_api_addresses()[-1] is None:
            return False
        try:  # `call_at` builds on Numba's internals, which another Numba may have changed
            return short_path_address(), kernel
        except Exception:
            return False

    def encode(self, buf, doc_ends, separator: int, state: ThreadState, doc_out_ends,
               dtype, doc_addresses=None) -> np.ndarray:
        """All ids (as `dtype`; None: int32, a view of the thread's output buffer if one kernel
        call did it all, valid until the thread encodes again) of the documents of `buf`
        (UTF-8, validated), document d ending at doc_ends[d], each followed by `separator`
        unless it is negative; `doc_out_ends` receives where each document's ids end. The
        arrays must be C-contiguous. With `doc_addresses` (int64, one per document), each
        document's bytes are at its address instead, not in `buf` (see `encode_documents`; the
        caller keeps them alive)."""
        return self._run(buf, doc_ends, separator, state, doc_out_ends, dtype,
                         doc_addresses=doc_addresses)

    def _run(self, buf, doc_ends, separator, state, doc_out_ends, dtype, room=None,
             doc_addresses=None):
        """Call the kernel until every document is done, merging the long pre-tokens it stops
        at and letting the cache grow when it asks; then let go of the documents. `room`: the
        most ids the output buffer is asked to hold (default: all of them)."""
        try:
            return self._calls(buf, doc_ends, separator, state, doc_out_ends, dtype, room,
                               doc_addresses)
        finally:
            if state.run_args is not None:
                release_documents(state.run_args)

    def _calls(self, buf, doc_ends, separator, state, doc_out_ends, dtype, room, doc_addresses):
        n_docs = len(doc_ends)
        size = len(buf) if doc_addresses is None else (int(doc_ends[-1]) if n_docs else 0)
        most = size + (n_docs if separator >= 0 else 0) + 1  # one id a byte, separators
        out = state.output(most if room is None else min(most, room))
        ids = None  # once a call does not do it all: room for `most`, filled as they come
        total = 0
        doc = i = 0
        while True:
            cache = state.cache.table
            args = self._packed(state, buf, doc_ends, doc_out_ends, out, cache, doc_addresses)
            if not state.enter(cache):
                continue
            try:
                if self._entry is None:  # the first call: through the dispatcher
                    w, doc, i, need = self.kernel(args.values, separator, total, doc, i)
                    self._entry = entry_point(self.kernel,
                                              (args.values, separator, total, doc, i))
                else:
                    w, doc, i, need = self._entry(args.values, separator, total, doc, i)
            finally:
                state.leave()
            if doc == n_docs and ids is None:  # the common case: one call did it all
                return out[:w] if dtype is None else out[:w].astype(dtype)
            if ids is None:  # pages never written are never touched
                ids = np.empty(most, dtype=np.int32 if dtype is None else dtype)
            ids[total : total + w] = out[:w]
            total += w
            if doc == n_docs:
                ids.resize(total, refcheck=False)  # realloc: in place, the tail let go of
                return ids
            if need > 0:
                _, _, ranks, vocab = self.tables
                if doc_addresses is None:
                    piece = long_piece_ids(buf, i, need, ranks, vocab)
                else:  # from its document, where it lies
                    begin = int(doc_ends[doc - 1]) if doc > 0 else 0
                    data = bytes_at(int(doc_addresses[doc]) + i - begin, need)
                    piece = long_piece_ids(data, 0, need, ranks, vocab)
                ids[total : total + len(piece)] = piece
                total += len(piece)
                i += need
            elif need < 0:
                state.make_room(cache)

    def _packed(self, state: ThreadState, buf, doc_ends, doc_out_ends, out, cache: Table,
                doc_addresses=None) -> PackedArrays:
        """The kernel's packed arguments for these documents: the thread's, with the documents
        put in, or packed anew if the output buffer or the cache's table is not the one they
        hold."""
        args = state.run_args
        if args is None or state.run_holds[0] is not out or state.run_holds[1] is not cache:
            table, specials, ranks, _ = self.tables
            args = state.run_args = pack_encode_args(buf, table, doc_ends, doc_out_ends,
                                                     state.scratch, out, specials, ranks, cache,
                                                     doc_addresses=doc_addresses)
            state.run_holds = (out, cache)
        else:
            repack_documents(args, buf, doc_ends, doc_out_ends, doc_addresses)
        return args


def run_piece_encoder(mode: int, buf, offsets, special_slots, special_ids, ranks: Ranks,
                      vocab: Table, state: ThreadState) -> np.ndarray:
    """All ids (int32) of the pieces (see `_encode_pieces`)."""
    kernel = PIECE_ENCODERS[mode]
    # one id per byte and special token, and `SPARE_IDS` (see `_merge_part`)
    out = np.empty(len(buf) + len(special_slots) + SPARE_IDS, dtype=np.int32)
    parts = []
    k = 0
    while True:
        cache = state.cache.table
        if not state.enter(cache):
            continue
        try:
            w, k, need = kernel(buf, offsets, special_slots, special_ids, ranks, cache,
                                state.scratch, out, k)
        finally:
            state.leave()
        parts.append(out[:w].copy())
        if not need:
            break
        if need > 0:
            parts.append(long_piece_ids(buf, offsets[k], need, ranks, vocab))
            k += 1
        else:
            state.make_room(cache)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
