"""Tables of encoded pre-tokens: pre-token bytes -> token ids, for the encoding kernels.

The *vocab table*, built once per tokenizer and never written after, holds every single byte
and every token's own bytes with the ids they encode to: the common words (about 85% of the
pre-tokens of web text are one token). The threads encode with one shared *cache*
(`SharedCache`), which starts as a copy of the vocab table with room for `cache_size` more
pre-tokens and remembers every other pre-token any thread encodes (growing, rehashed, only if
their records outgrow it); once it holds `cache_size` of them it starts again from the vocab
table (in the memory it has, if one thread alone uses it), so memory stays bounded. The lookup
of any pre-token is one probe of one table, and a pre-token is merged once, not once per
thread.

Threads read and add entries at the same time, without a lock (see `store`): a writer claims an
empty slot by compare-and-swap, writes the key and ids, and publishes the slot by writing `meta`
last (a release store); a reader loads `meta` first (an acquire load, or in the encode loop a
load of the key whose address depends on `meta`: `load_after`), so it sees a slot either empty,
being written (`BUSY`: no key matches it), or whole. Slots are never changed once published. A
writer's records go in a run of them it claimed for itself (`_claim_records`). Growing copies the
published slots into a new table, which the threads take up on their next call; what they add
to the old one meanwhile is forgotten, and merged again if met. While one thread grows it, the
others read the old table and add nothing (`SharedCache.make_room`). A cache that starts again
empties its table in place unless another thread's kernel may be reading it: before each kernel
call the thread publishes the table the kernel is to read, and takes up the cache's table
instead if that one has been marked replaced (`enter_table`, `_retire`).

A slot is four int64, `[k0, k1, meta, ext]`, so two share a 64-byte cache line:

- a pre-token of 1 to 16 bytes is its own key: k0 and k1 its bytes packed little-endian (zero
  padded), its length in `meta`'s low byte. A lookup is one multiply and usually one probe, and
  compares no bytes elsewhere;
- a longer one is keyed by two hashes of its bytes (k0, k1), with the length byte `LONG`; its
  bytes are kept in a record and compared on a match (longer pre-tokens are rare);
- `meta` = length byte | count << 8 | first id << 11 | second id << 32, `count` being how
  many ids are in the slot (1 to `INLINE_IDS`, each below 2**`ID_BITS`; the third to fifth in
  `ext`, `ID_BITS` each). Count 0: the ids are in a record at `ext` (more ids, a larger one,
  or a long key): [number of ids, ids..., then for a long key: its length, its bytes four per
  item (`_key_items`)].

About 98% of the pre-tokens of web text encode to at most three ids, and of text whose words
are not the vocab's (the scale corpus's rotated words) 93% to at most five: a hit is one cache
line and nothing else. `meta` is 0 for an empty slot, `BUSY` for one being written.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import kernel_cache  # noqa: F401  (first: keys the cached kernels, see kernel_cache)
from .kernel_args import array_at, array_from
from .scanners.classes import item_pointer, load_upto8, uindex

MAX_SHORT = 16  # pre-tokens up to this many bytes are their own key
INLINE_IDS = 5  # ids a slot holds itself (see the module docstring)
ID_BITS = 21  # of each of them: ids below 2**21 (2M, more than any vocab in use has)
_ID_MASK = np.int64((1 << ID_BITS) - 1)
_FIRST_ID_AT = 11  # `meta`'s bits: the length byte, the count (3 bits), then two ids
SPARE_IDS = 2  # items `copy_short_ids` may write past a pre-token's ids
LONG = np.int64(255)  # the length byte of a hashed key
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: Fibonacci hashing
_MIX = np.uint64(0xC2B2AE3D27D4EB4F)
# `meta` of a slot claimed but not yet published: its length byte (0) and count-and-flag bits
# match no key's, so lookups pass over it.
BUSY = np.int64(512)


class Table(NamedTuple):
    """Pre-tokens -> ids (see the module docstring)."""

    slots: np.ndarray  # int64, 4 per slot; the number of slots is a power of two
    records: np.ndarray  # int32
    fill: np.ndarray  # int64[8]: items of `records` used, entries, times emptied, `STALE`,
    # `SERIAL`, 0, 0, 0 (a cache line)
    shift: int  # 64 - log2(number of slots)
    max_entries: int  # so probes stay short: at most 3/4 of the slots
    max_key_len: int  # longer pre-tokens are never stored
    learns: bool  # a cache; the vocab table is never written after it is built


TABLE_ITEMS = 10  # values of a `Table` in `kernel_args.PackedArrays`


@njit(inline="always")
def table_at(values, k):
    """The `Table` packed at values[k:k + TABLE_ITEMS] (`kernel_args.PackedArrays`)."""
    return Table(array_at(values, k, np.int64), array_at(values, k + 2, np.int32),
                 array_at(values, k + 4, np.int64), values[k + 6], values[k + 7], values[k + 8],
                 values[k + 9] != 0)


def new_table(max_entries: int, max_key_len: int, record_items: int) -> Table:
    """An empty table for up to `max_entries` pre-tokens of at most `max_key_len` bytes, whose
    records (multi-id and long entries) hold `record_items` items."""
    max_entries = min(max(1, int(max_entries)), 1 << 28)
    bits = max(4, int(4 * max_entries // 3).bit_length())
    return Table(_aligned_slots(4 << bits),
                 np.zeros(max(record_items, 4 + 2 * max_key_len), dtype=np.int32),
                 _new_fill(), 64 - bits, max_entries, int(max_key_len), False)


# `Table.fill[SERIAL]`: a number no other table of this process has had (`_new_fill`), so that
# a thread's run of records is known to be of the table it has (`_claim_records`).
SERIAL = 4
_serials = itertools.count(1)


def _new_fill(old: np.ndarray | None = None) -> np.ndarray:
    """A table's `fill`: zeros, or `old`'s values; with a serial of its own."""
    fill = np.zeros(8, dtype=np.int64) if old is None else old.copy()
    fill[SERIAL] = next(_serials)
    return fill


_HUGE_PAGE = 2 << 20


def _aligned_slots(items: int, zeroed: bool = True) -> np.ndarray:
    """int64[items] for a table's slots, starting on a cache line (64 bytes; on a 2 MB page
    boundary if it is that large): numpy's own start is 16 bytes past one, so that every other
    slot of 32 bytes straddled two lines (two lines read for one lookup, the second one not
    prefetched), and on huge pages the table costs the TLB a few entries."""
    size = 8 * items
    align = _HUGE_PAGE if size >= _HUGE_PAGE else 64
    raw = (np.zeros if zeroed else np.empty)(size + align, dtype=np.uint8)
    start = -raw.__array_interface__["data"][0] % align
    return raw[start : start + size].view(np.int64)


# Pre-tokens the vocab table has room for beyond its tokens: at least this many, and as many
# more as the smallest table (a power of two, at most 3/4 full) holding them and the vocab has
# room for (its slots then `VOCAB_SPREAD` times as many): about 146k with GPT-2's vocab
# (cl100k's and o200k's tables hold this many anyway). A cache that learns no more than that
# is a copy of it (`_copy`); the default cache is larger (`SharedCache._fresh`). Measured when
# every cache began as such a copy: in a table of 4 MB, a cold pass over web_5M
# filled it to 68%, and the pre-tokens it learned then waited on two more slots on average past
# their home: with 8 MB, one thread's cold pass over web_5M was 4.0% faster, over TinyStories
# 2.7% (medians of 15 alternated rounds); two threads' no slower.
CACHE_FIRST_ROOM = 1 << 16

# The vocab table (and so a cache that is a copy of it) has this many times the slots those
# entries need at 3/4 full, and such a cache fills it to 3/8 before it grows: 16 MB with GPT-2's
# and cl100k's vocabs, 32 MB with o200k's. Most tokens are never a whole pre-token of a given
# text (30k of GPT-2's 50k in web_5M), yet each holds a slot that a pre-token the cache learns
# may have for its home: after a cold pass over web_5M in 8 MB, 8.6% of the lookups of 2 to 16
# bytes went past their home slot, for 85% of them because a token sat there, and the probes
# after the home took 7.6% of a warm pass's samples. In twice the slots, a warm pass over
# web_5M took 0.92-0.94x as long, a cold one 0.95-1.00x (cl100k 0.93x and 0.94x, o200k 0.95x
# and 0.95x; TinyStories, whose words are few, no different): medians of 21 alternated rounds
# with the tables rehashed into twice the slots, and of 15 with them built so.
VOCAB_SPREAD = 2


# The fewest pre-tokens a learning cache holds before it starts again. Starting again copies the
# vocab table (16 MB with GPT-2's vocab, 2-4 ms), so a smaller cache would copy it more often than
# merging saves: with room for 100 pre-tokens, 200 kB of multi_1M took 0.16 s to encode, with
# room for 1, 16 s, against 0.017 s with no cache at all. The records of this many take 2 MB.
MIN_CACHE_SIZE = 1 << 16


def entries_in(table: Table) -> int:
    """The pre-tokens `table` holds, exactly: its slots taken. (`fill[1]` counts them too, but
    each thread adds its own a batch at a time, `count_entry`.)"""
    return int(np.count_nonzero(table.slots[2::4]))


def with_room(table: Table, spread: int = 1) -> Table:
    """`table` allowed to fill its slots to 3/4 (3/8 for `spread` 2): the room a vocab table
    leaves its caches."""
    return table._replace(max_entries=3 * (len(table.slots) >> 2) // (4 * spread))


class SharedCache:
    """The cache of one tokenizer (`table`, see the module docstring), shared by its threads: a
    copy of the vocab table that learns up to `limit` more pre-tokens (0: none, the vocab table
    itself; else at least `MIN_CACHE_SIZE`). The kernels store into it until it is full and then
    return; `make_room` starts it again from the vocab table at the limit (or grows it, if its
    records ran out first)."""

    def __init__(self, vocab: Table, limit: int):
        self.vocab = vocab
        self.limit = max(limit, MIN_CACHE_SIZE) if limit else 0
        self._lock = threading.Lock()
        self.table = self._fresh()
        self._users: weakref.WeakSet = weakref.WeakSet()  # the threads' states (`attach`)

    def attach(self, user) -> None:
        """Count `user` (a thread's state) among those that read and write this cache, until
        it is let go of: a cache with one user may start again in its own memory."""
        with self._lock:
            self._users.add(user)

    def _fresh(self) -> Table:
        """A new table of the cache: a copy of the vocab table with room for the whole limit
        (rehashed into more slots if the vocab table has not the room, as with the default
        `cache_size`), so that the cache never grows before it starts again. A cache that first
        had the vocab table's room (146k pre-tokens with GPT-2's) grew into 32 MB of new slots
        in the scale corpus's second batch of 15 MB, where memory the system had not given a
        process for a while made that 9-150 ms: that batch ran at 91-174 MB/s in 4 runs of
        `bench_encode.py /tmp/scale_1G.txt --max-bytes 200M --tools nbbpe,gigatoken --threads
        1 --repeat 3`, at 214-221 with its table made so when the tokenizer first encodes."""
        if self.limit == 0:  # learns nothing: share the vocab table itself
            return self.vocab
        vocab = self.vocab
        return _copy(vocab, int(vocab.fill[1]) + self.limit, len(vocab.records) + 8 * self.limit)

    def make_room(self, full: Table, user) -> None:
        """Called when `full`, the table a kernel had, `is_full`. Once it has learned `limit`
        pre-tokens, start again: in `full`'s own memory if no other thread can be reading it
        (`_read_by_others`), else in new memory. Before that (its records ran out first, as
        `_fresh` gives it room for the whole limit): grow into a new table with four times the
        records and, as `_fresh`'s, room for the whole limit (rehashing it all; room for four
        times the pre-tokens learned, as when growing was the usual way, made a cache of long
        pre-tokens smaller: GPT-2's, 65,536 at most, ran out of records at 9,472 and went on
        with room for 37,888). If another thread has already replaced it, there is nothing to
        do: the caller takes up `table` again.

        Meanwhile `table` is a stand-in read only (`_read_only`), so that the other threads go
        on encoding, learning nothing, rather than wait on the lock: in 2-thread batches over
        200 MB of the scale corpus (16 MB each), a growth took 10-20 ms, sometimes up to 95
        while its new table's memory was slow to come, and the other thread waited it out. The
        stand-in is `full`, or the vocab table when `full` is emptied in place (a thread that
        comes meanwhile reads that)."""
        with self._lock:  # (one thread replaces `full`: the others find it replaced)
            if self.table is not full:
                return
            learned = int(full.fill[1] - self.vocab.fill[1])
            again = learned >= self.limit
            # (`attach` takes the lock: no thread comes between this and the stand-in)
            in_place = again and not self._read_by_others(full, user)
            self.table = meanwhile = _read_only(self.vocab if in_place else full)
        table = full  # if growing fails: every thread finds it full again, and tries again
        try:
            if again:
                times = int(full.fill[2])
                table = self._start_again_in(full) if in_place else self._fresh()
                table.fill[2] = times + 1
            else:
                table = new_table(int(self.vocab.fill[1]) + self.limit, full.max_key_len,
                                  4 * len(full.records))._replace(learns=True)
                _rehash(full, table)  # read while other threads may still add to it
        finally:
            self.table = table
            meanwhile.fill[STALE] = 1  # then the kernels using it stop, and take up `table`

    def _read_by_others(self, full: Table, user) -> bool:
        """Whether a thread other than `user`'s may be in a kernel that reads `full`, after
        waiting up to `_READERS_WAIT` seconds for those that are to take it back. `full` is
        marked `STALE` first, so that no kernel is called on it after this (`enter_table`), and
        a kernel that reads it returns at its next new pre-token (it finds it full); then each
        other thread's `hazard_address` is read: the serial of the table its kernel reads, 0
        between kernels. Starting again in new memory costs page faults, and memory not given to
        a process for a while is slow to touch on this project's VM: a cache with two threads'
        states started again in new memory in 81 ms (of a 15 MB batch of the scale corpus at
        148 MB/s, against 340-480 for the others; in place, 7 ms)."""
        # held meanwhile: a thread's state let go of would take the memory its word is in
        others = [other for other in self._users if other is not user]
        hazards = np.array([other.hazard_address for other in others], dtype=np.int64)
        deadline = time.perf_counter() + _READERS_WAIT
        while _retire(full.fill, hazards):
            if time.perf_counter() > deadline:
                return True
            time.sleep(_READERS_POLL)  # (the GIL let go of: a thread's Python takes it back)
        return False

    def _start_again_in(self, full: Table) -> Table:
        """A fresh cache in `full`'s memory, which no kernel reads meanwhile: its slots
        emptied and the vocab table put in them again. New memory costs page faults, and
        memory the system has not given a process for a while is slow to touch on this
        project's VM (a new table of 32 MB took 9-150 ms): in place, 6.3-7.8 ms (32 MB of
        slots, the scale corpus, one thread)."""
        full.slots[:] = 0
        table = full._replace(fill=_new_fill(), learns=True)
        _rehash(self.vocab, table)
        return table


# How long a cache that starts again waits for other threads' kernels to stop reading its table
# (`SharedCache._read_by_others`), and how often it looks: a kernel returns at its next new
# pre-token once the table is full, mostly within microseconds. In 2-thread batches of 15 MB
# with a cache of 65,536, before it waited, 3 of 4 starts (web_100M) and 2 of 5 (the scale
# corpus) found the other thread in a kernel.
_READERS_WAIT = 0.005
_READERS_POLL = 0.0001

# `Table.fill[STALE]` set: the table is a cache's read-only stand-in (`_read_only`) that has
# been replaced, or a table the cache starts again from (`_retire`); `is_full` says so, and the
# kernels using it return to take up the new one; none is called on it (`enter_table`).
STALE = 3


def _read_only(table: Table) -> Table:
    """`table` (slots and records shared) as a table no kernel writes to, with a `fill` of
    its own, to be made `STALE` (not yet, if `table` is)."""
    fill = table.fill.copy()
    fill[STALE] = 0
    return table._replace(fill=fill, learns=False)


@njit(cache=True, nogil=True, _nrt=False)
def _retire(fill, hazards):
    """Mark the table of `fill` `STALE`, then say whether a thread may be in a kernel that
    reads it: whether any of the words at `hazards` (each thread's, see `enter_table`) holds its
    serial. Either the thread's kernel sees the mark, or this sees its serial: both sides write
    then read, in a single total order (sequentially consistent)."""
    store_seq_cst(fill, STALE, 1)
    serial = fill[SERIAL]
    for k in range(hazards.shape[0]):
        if load_seq_cst(array_from(hazards[k], 1, np.int64), 0) == serial:
            return True
    return False


@njit(inline="always")
def enter_table(table, own):
    """Before a kernel runs on `table`: publish its serial in the thread's own items
    (`own[OWN_HAZARD]`); False (and nothing published) if `table` is `STALE` already: then
    the caller takes up the cache's table instead. A cache starts again in its table's memory
    only when no other thread has published that table's serial (`_read_by_others`)."""
    store_seq_cst(own, OWN_HAZARD, table.fill[SERIAL])
    if load_seq_cst(table.fill, STALE) != 0:
        store_release(own, OWN_HAZARD, 0)
        return False
    return True


@njit(inline="always")
def leave_table(own):
    """After the kernel: its table is read no more (see `enter_table`)."""
    store_release(own, OWN_HAZARD, 0)


def _copy(table: Table, max_entries: int, record_items: int) -> Table:
    """A learning copy of `table` (one no thread writes to) with room for `max_entries` entries
    and `record_items`. When its slots have the room they are copied as they are: the vocab
    table is built with room for a cache's first entries (`with_room`), so a new cache is a
    copy of memory, not a rehash (3-10 ms, more than encoding a few documents)."""
    if max_entries <= table.max_entries:
        records = np.zeros(max(record_items, len(table.records)), dtype=np.int32)
        used = int(table.fill[0])
        records[:used] = table.records[:used]
        slots = _aligned_slots(len(table.slots), zeroed=False)
        slots[:] = table.slots
        return table._replace(slots=slots, records=records, fill=_new_fill(table.fill),
                              max_entries=max_entries, learns=True)
    bigger = new_table(max_entries, table.max_key_len, record_items)._replace(learns=True)
    _rehash(table, bigger)
    return bigger


@njit(inline="always")
def short_hash(k0, k1, length):
    """The hash of a pre-token of 1 to 16 bytes, packed as k0, k1."""
    return ((k0 ^ (k1 * _MIX)) + np.uint64(length)) * _GOLDEN


@njit(cache=True, nogil=True, _nrt=False)
def key_of(buf, start, end):
    """(k0, k1, length byte, hash) of pre-token buf[start:end], of two or more bytes."""
    length = end - start
    if length <= MAX_SHORT:
        k0 = load_upto8(buf, start, end)
        k1 = np.uint64(0)
        if length > 8:
            k1 = load_upto8(buf, start + 8, end)
        return np.int64(k0), np.int64(k1), np.int64(length), short_hash(k0, k1, length)
    h0 = np.uint64(length)
    h1 = _MIX
    i = start
    while i < end:
        word = load_upto8(buf, i, end)
        h0 = (h0 ^ word) * _GOLDEN
        h0 ^= h0 >> np.uint64(29)
        h1 = (h1 + word) * _MIX
        h1 ^= h1 >> np.uint64(31)
        i += 8
    return np.int64(h0), np.int64(h1), LONG, (h0 ^ h1) * _GOLDEN  # = `_slot_hash`


def prefetch_with_locality(locality: int):
    """An intrinsic `prefetch(array, index)`: ask the CPU to bring the cache line of
    array[index] in, a hint which neither faults nor waits, so the next reads of the line find
    it close (LLVM's `llvm.prefetch`, a read of data, with this locality: 3 keeps the line in
    every cache level, 0 asks for it non-temporally; scripts/encode_variants.py tries others)."""

    @intrinsic
    def prefetch(typingctx, array, index):
        def codegen(context, builder, signature, args):
            address = item_pointer(context, builder, signature, args)
            byte_pointer = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            hint = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32]),
                "llvm.prefetch.p0")
            builder.call(hint, [builder.bitcast(address, byte_pointer), i32(0), i32(locality),
                                i32(1)])
            return context.get_dummy_value()

        return types.void(array, types.intp), codegen

    return prefetch


prefetch = prefetch_with_locality(3)  # what the encode pass uses: kept in all cache levels


def _int64_array_and_index(array, index) -> bool:
    return (isinstance(array, types.Array) and array.dtype == types.int64
            and isinstance(index, types.Integer))


def _atomic_load(ordering: str):
    """An intrinsic `load(array, index)`: array[index] of an int64 array, as an atomic load
    of LLVM's `ordering`."""

    def load(typingctx, array, index):
        if not _int64_array_and_index(array, index):
            return None

        def codegen(context, builder, signature, args):
            return builder.load_atomic(item_pointer(context, builder, signature, args), ordering, 8)

        return types.int64(array, index), codegen

    load.__name__ = f"load_{ordering}"
    return intrinsic(load)


def _atomic_store(ordering: str):
    """An intrinsic `store(array, index, value)`: array[index] = value in an int64 array, as an
    atomic store of LLVM's `ordering`."""

    def store(typingctx, array, index, value):
        if not _int64_array_and_index(array, index):
            return None

        def codegen(context, builder, signature, args):
            value = context.cast(builder, args[2], signature.args[2], types.int64)
            builder.store_atomic(value, item_pointer(context, builder, signature, args), ordering,
                                 8)
            return context.get_dummy_value()

        return types.void(array, index, types.int64), codegen

    store.__name__ = f"store_{ordering}"
    return intrinsic(store)


# array[index], read before any read that follows it in the code (an acquire load: a plain load
# on x86, which the compiler may not move later reads above)
load_acquire = _atomic_load("acquire")
# array[index] = value, written after every write that precedes it in the code (a release
# store): a reader that sees the value with `load_acquire` sees those writes too
store_release = _atomic_store("release")
# the same, in the single total order of sequentially consistent operations (on x86 the store
# is an `xchg`: later reads wait for it to be seen), for `enter_table` and `_retire`
load_seq_cst = _atomic_load("seq_cst")
store_seq_cst = _atomic_store("seq_cst")


@intrinsic
def load_after(typingctx, array, index, earlier):
    """array[index], read after `earlier` (a value read before): the address depends on
    `earlier` through an empty inline asm the compiler cannot see through, so neither the
    compiler nor the CPU (which orders loads by address dependency) reads it first. An acquire
    load ordered every later read in the encode loop and cost 10% there; this orders one."""
    if not (_int64_array_and_index(array, index) and earlier == types.int64):
        return None

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        opaque = builder.asm(ir.FunctionType(i64, [i64]), "", "=r,0", [args[2]], False)
        zero = builder.xor(opaque, args[2])  # 0, but only once `earlier` is known
        address = builder.ptrtoint(item_pointer(context, builder, signature, args), i64)
        address = builder.inttoptr(builder.add(address, zero), i64.as_pointer())
        return builder.load(address, align=8)

    return types.int64(array, index, types.int64), codegen


@intrinsic
def compare_and_swap(typingctx, array, index, expected, value):
    """Atomically: if array[index] == expected, set it to value. Returns what it held."""
    if not _int64_array_and_index(array, index):
        return None

    def codegen(context, builder, signature, args):
        address = item_pointer(context, builder, signature, args)
        expected = context.cast(builder, args[2], signature.args[2], types.int64)
        value = context.cast(builder, args[3], signature.args[3], types.int64)
        pair = builder.cmpxchg(address, expected, value, "acq_rel", "acquire")
        return builder.extract_value(pair, 0)

    return types.int64(array, index, types.int64, types.int64), codegen


@intrinsic
def fetch_add(typingctx, array, index, value):
    """Atomically add value to array[index]; return what it held."""
    if not _int64_array_and_index(array, index):
        return None

    def codegen(context, builder, signature, args):
        value = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", item_pointer(context, builder, signature, args), value,
                                  "acq_rel")

    return types.int64(array, index, types.int64), codegen


@njit(inline="always")
def home(table, h):
    """The slot where the search for a key of hash `h` starts."""
    return np.int64(h >> np.uint64(table.shift))


@njit(cache=True, nogil=True, _nrt=False)
def find(table, s, k0, k1, tag, buf, start, length):
    """The slot of `table` holding pre-token buf[start:start + length] (its key from `key_of`;
    the search starts at slot s, `home` of its hash), or -1 - the empty slot where it would go."""
    slots = table.slots
    mask = (slots.shape[0] >> 2) - 1
    while True:
        meta = load_acquire(slots, 4 * s + 2)  # then the key and ids as published with it
        if meta == 0:
            return -1 - s
        if slots[4 * s] == k0 and slots[4 * s + 1] == k1 and (meta & 255) == tag:
            if tag != LONG or _same_bytes(table, slots[4 * s + 3], buf, start, length):
                return s
        s = (s + 1) & mask


@njit(inline="always")
def _key_items(length):
    """Items of `records` a long key's bytes take: 8 bytes in two items (little-endian, the last
    zero padded), so that a compare reads them a word at a time."""
    return 2 * ((length + 7) >> 3)


@njit(inline="always")
def _same_bytes(table, r, buf, start, length):
    """Whether the long key stored in record r holds buf[start:start + length]: 8 bytes at a
    time (`_key_items`; byte by byte, this compare was 8% of a warm pass over multi_1M)."""
    records = table.records
    at = r + 1 + records[uindex(r)]  # the length, then the bytes
    if records[uindex(at)] != length:
        return False
    end = start + length
    for k in range(_key_items(length) >> 1):  # a word (two items) at a time
        low = np.uint64(np.uint32(records[uindex(at + 1 + 2 * k)]))
        high = np.uint64(np.uint32(records[uindex(at + 2 + 2 * k)]))
        if low | (high << np.uint64(32)) != load_upto8(buf, start + 8 * k, end):
            return False
    return True


@njit(inline="always")  # into the encode loop: its path for nearly every pre-token
def copy_short_ids(table, h, k0, k1, tag, out, w):
    """If the pre-token of 1 to 16 bytes keyed (k0, k1, tag), of hash h, is in `table`, write its
    ids to out[w:] and return how many; else return -1 - the empty slot where it would go, as
    `find` does (a hint for `store`, which takes the next empty slot if another thread has taken
    that one since).

    A slot's first three id fields are written whatever its number of ids (the fourth and
    fifth only if it has them), so `out` needs `SPARE_IDS` more items than the pre-token has
    bytes: how many ids a pre-token has changes from one to the next, and
    branches on it were mispredicted often (on text of many two- to three-id pre-tokens this
    loop took 211 ms where it now takes 151). Like `find`, it reads a slot's `meta` before its
    key and ids (`load_after`)."""
    slots = table.slots
    mask = (slots.shape[0] >> 2) - 1
    s = home(table, h)
    while True:
        meta = slots[uindex(4 * s + 2)]
        if meta == 0:
            return -1 - s
        if ((meta & 255) == tag and load_after(slots, 4 * s, meta) == k0
                and load_after(slots, 4 * s + 1, meta) == k1):
            count = inline_count(meta)
            ext = load_after(slots, 4 * s + 3, meta)
            if count == 0:  # in a record, written before `meta` too
                return _copy_record_ids(table.records, ext, out, w)
            _write_inline_ids(meta, ext, out, w, count)
            return count
        s = (s + 1) & mask


@njit(inline="always")
def _write_inline_ids(meta, ext, out, w, count):
    """Write the `count` ids a slot's `meta` and `ext` hold to out[w:]: the first three
    fields whatever the count (the fields past it are 0), the other two if it has them."""
    out[uindex(w)] = np.int32(inline_id(meta, ext, 0))  # (each a shift and a mask)
    out[uindex(w + 1)] = np.int32(inline_id(meta, ext, 1))
    out[uindex(w + 2)] = np.int32(inline_id(meta, ext, 2))
    if count > 3:
        out[uindex(w + 3)] = np.int32(inline_id(meta, ext, 3))
        out[uindex(w + 4)] = np.int32(inline_id(meta, ext, 4))


@njit(inline="always")
def _copy_record_ids(records, r, out, w):
    """Write the ids of the record at r ([number of ids, ids...]) to out[w:]; return how many."""
    count = records[uindex(r)]
    for k in range(count):
        out[uindex(w + k)] = records[uindex(r + 1 + k)]
    return count


@njit(cache=True, nogil=True, _nrt=False)
def copy_ids(table, s, out, w):
    """Write the ids stored at slot s to out[w:]; return how many."""
    meta = table.slots[4 * s + 2]
    ext = table.slots[4 * s + 3]
    count = inline_count(meta)
    if count == 0:
        return _copy_record_ids(table.records, ext, out, w)
    for k in range(count):  # (no more than `count`: the caller's `out` may have no spare)
        out[w + k] = np.int32(inline_id(meta, ext, k))
    return count


@njit(inline="always")
def inline_count(meta):
    """How many ids a slot holds itself, by its `meta` (0: they are in a record)."""
    return (meta >> 8) & 7


@njit(inline="always")
def inline_id(meta, ext, k):
    """Id k (0 to `INLINE_IDS` - 1) of a slot whose ids it holds itself."""
    if k < 2:
        return (meta >> (_FIRST_ID_AT + ID_BITS * k)) & _ID_MASK
    return (ext >> (ID_BITS * (k - 2))) & _ID_MASK


# A thread's own items (`store`'s `own`, in its scratch space): the entries it stored and has
# not counted (`count_entry`), the run of records it claimed last: where the next one goes,
# where the run ends, and the `SERIAL` of the table it is in; and the `SERIAL` of the table its
# kernel reads (0 between kernels: `enter_table`).
OWN_PENDING, OWN_NEXT, OWN_END, OWN_TABLE, OWN_HAZARD = 0, 1, 2, 3, 4
OWN_ITEMS = 5

# Records are claimed this many items at a time (4 KB): claimed an entry at a time, two threads
# storing at once passed `fill`'s cache line back and forth, an atomic add each time, and each
# new pre-token's `is_full` then read it from the other CPU (multi_1M has 21k new pre-tokens,
# 14k of them with a record). A fresh 2-thread batch of multi_1M took 0.95x and 0.93x the time
# (medians of 15 and 20 alternated processes, 12 and 17 faster), web_5M 0.98x (14); 200 MB of
# the scale corpus ran at 325 against 301 MB/s (12 alternated pairs, 9 faster).
RECORD_RUN = 1024


@njit(inline="always")
def _claim_records(table, need, own):
    """Where `need` items of `table.records` are this thread's to write, or -1 if the table has
    no more room: taken from the run of records the thread claimed last (`own`), else from a
    new run of `RECORD_RUN` items (or `need`, if more) claimed with one atomic add."""
    serial = table.fill[SERIAL]
    at = own[OWN_NEXT]
    if own[OWN_TABLE] != serial or at + need > own[OWN_END]:
        run = max(RECORD_RUN, need)
        at = fetch_add(table.fill, 0, run)
        if at + run > table.records.shape[0]:
            own[OWN_TABLE] = 0  # (another thread may have taken the room meanwhile)
            return np.int64(-1)
        own[OWN_TABLE] = serial
        own[OWN_END] = at + run
    own[OWN_NEXT] = at + need
    return at


@njit(cache=True, nogil=True, _nrt=False)
def store(table, s, k0, k1, tag, buf, start, length, ids, w, m, own):
    """Store pre-token buf[start:start + length] -> ids[w:w + m], at slot s (where `find` said
    it would go) or, if another thread has taken it since, the next empty slot, if the table
    has room; return whether it had. Other threads may look up and store at the same time.
    `own`: the calling thread's own items (`OWN_ITEMS`, see `_claim_records`). The caller
    counts the entry (`count_entries`, `count_entry`)."""
    slots = table.slots
    records = table.records
    fill = table.fill
    inline = tag != LONG and m <= INLINE_IDS
    for i in range(m if inline else 0):
        inline = inline and ids[w + i] <= _ID_MASK
    if fill[1] >= table.max_entries:
        return False
    ext = np.int64(0)
    meta = tag
    if inline:
        meta = tag | (m << 8)
        for i in range(m):
            if i < 2:
                meta |= np.int64(ids[w + i]) << (_FIRST_ID_AT + ID_BITS * i)
            else:
                ext |= np.int64(ids[w + i]) << (ID_BITS * (i - 2))
    else:
        ext = _claim_records(table, 1 + m + (1 + _key_items(length) if tag == LONG else 0),
                             own)
        if ext < 0:
            return False
        records[ext] = m
        for i in range(m):
            records[ext + 1 + i] = ids[w + i]
        if tag == LONG:
            records[ext + 1 + m] = length
            for k in range(_key_items(length) >> 1):
                word = load_upto8(buf, start + 8 * k, start + length)
                records[ext + 2 + m + 2 * k] = np.int32(word & np.uint64(0xFFFFFFFF))
                records[ext + 3 + m + 2 * k] = np.int32(word >> np.uint64(32))
    mask = (slots.shape[0] >> 2) - 1
    while compare_and_swap(slots, 4 * s + 2, 0, BUSY) != 0:  # taken: the next slot
        s = (s + 1) & mask
    slots[4 * s] = k0
    slots[4 * s + 1] = k1
    slots[4 * s + 3] = ext
    store_release(slots, 4 * s + 2, meta)  # published: the writes above are seen with it
    return True


@njit(inline="always")
def count_entries(table, n):
    """Add n entries stored to `table`'s count."""
    fetch_add(table.fill, 1, n)


# A thread adds the entries it stores in a cache to the count `ENTRY_BATCH` at a time
# (`count_entry`): counted one by one, two threads storing at once passed the count's cache line
# back and forth, an atomic add each time it had moved. A fresh 2-thread batch of web_5M (39k
# new pre-tokens) took 0.97x the time counted 16 at a time, 0.95-0.96x with no count at all
# (medians of 21 alternated processes each, twice); 256 at a time against 16, 0.976x and 0.970x
# (16 and 12 alternated pairs; multi_1M 0.997x). The count may then be short of the entries by
# up to ENTRY_BATCH - 1 a thread: a table stops learning at 3/4 of its slots (`new_table`, at
# least `MIN_CACHE_SIZE` entries), so a quarter stays free for the probes, less a few hundred.
ENTRY_BATCH = 256


# Compiled apart, not inlined: an atomic add in the kernel's loop orders the loads and stores
# around it, and the batch above was then no faster than before (1.00x).
@njit(cache=True, nogil=True, _nrt=False)
def count_entry(table, own):
    """One more entry stored in `table` by this thread, whose entries not yet counted are
    own[OWN_PENDING] (its own memory)."""
    n = own[OWN_PENDING] + 1
    if n >= ENTRY_BATCH:
        count_entries(table, n)
        n = 0
    own[OWN_PENDING] = n


@njit(cache=True, nogil=True, _nrt=False)
def is_full(table):
    """Whether a learning cache can take no more (entries, or records for the longest key),
    or the table has been replaced (`STALE`, read as another thread sets it): either way,
    the kernel returns to take up the cache's table."""
    return load_acquire(table.fill, STALE) != 0 or (
        table.learns and (table.fill[1] >= table.max_entries
                          or table.fill[0] + 4 + 2 * table.max_key_len > table.records.shape[0]))


@njit(inline="always")
def _slot_hash(k0, k1, tag):
    """The hash `key_of` gave the key (k0, k1, tag)."""
    a = np.uint64(k0)
    b = np.uint64(k1)
    if tag == LONG:
        return (a ^ b) * _GOLDEN
    return short_hash(a, b, tag)


@njit(cache=True, nogil=True)
def _rehash(old, new):
    """Put every published entry of `old` into the empty, larger table `new` (records as they
    are), while other threads may still add to `old`: each slot's `meta` is read first, and the
    records after the slots, so every entry copied has its records within those copied."""
    mask = (new.slots.shape[0] >> 2) - 1
    entries = 0
    for s in range(old.slots.shape[0] >> 2):
        meta = load_acquire(old.slots, 4 * s + 2)
        if meta == 0 or meta == BUSY:
            continue
        t = home(new, _slot_hash(old.slots[4 * s], old.slots[4 * s + 1], meta & 255))
        while new.slots[4 * t + 2] != 0:
            t = (t + 1) & mask
        new.slots[4 * t] = old.slots[4 * s]
        new.slots[4 * t + 1] = old.slots[4 * s + 1]
        new.slots[4 * t + 3] = old.slots[4 * s + 3]
        new.slots[4 * t + 2] = meta
        entries += 1
    used = min(load_acquire(old.fill, 0), old.records.shape[0])
    for i in range(used):
        new.records[i] = old.records[i]
    new.fill[0] = used
    new.fill[1] = entries
    new.fill[2] = old.fill[2]


@njit(cache=True, nogil=True, _nrt=False)
def lookup(table, buf, start, end):
    """(slot or -1 - empty slot, k0, k1, length byte, hash) of pre-token buf[start:end]."""
    k0, k1, tag, h = key_of(buf, start, end)
    return find(table, home(table, h), k0, k1, tag, buf, start, end - start), k0, k1, tag, h
