"""The shared cache of encoded pre-tokens under threads: stores without a lock, growth while other
threads still store (`encode_tables.store`, `_rehash`, `SharedCache`)."""

import threading

import numpy as np
import pytest
from numba import njit

from nbbpe.encode_tables import (BUSY, ENTRY_BATCH, ID_BITS, INLINE_IDS, MAX_SHORT, OWN_ITEMS,
                                  OWN_PENDING, RECORD_RUN, SPARE_IDS, _rehash, _same_bytes,
                                  copy_ids, copy_short_ids, count_entries, count_entry, lookup,
                                  new_table, store)

THREADS = 4


def make_keys(n, seed):
    """n distinct byte strings of 1 to 40 bytes (so short keys and hashed long ones), end to end."""
    rng = np.random.default_rng(seed)
    seen = set()
    while len(seen) < n:
        length = int(rng.integers(1, 41))
        seen.add(bytes(rng.integers(0, 4, length, dtype=np.uint8) + 97))  # few letters: collisions
    keys = sorted(seen)
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(k) for k in keys])
    return np.frombuffer(b"".join(keys), dtype=np.uint8), offsets


@njit(nogil=True)
def ids_of(buf, start, end, out):
    """The ids a key is stored with: 1 to 6 of them (so inline and record entries), from its bytes."""
    m = 1 + (end - start) % 6
    for i in range(m):
        out[i] = (end - start) * 1000 + buf[start + i % (end - start)] * 7 + i
    return m


@njit(nogil=True)
def store_all(table, buf, offsets, order, out):
    """Look up each key in `order`, storing it if absent (as a thread's misses do, counted as
    they count them, then the rest counted); return how many stores were refused for lack of
    room."""
    refused = 0
    own = np.zeros(OWN_ITEMS, np.int64)
    for k in order:
        start, end = offsets[k], offsets[k + 1]
        s, k0, k1, tag, _ = lookup(table, buf, start, end)
        if s < 0:
            m = ids_of(buf, start, end, out)
            if store(table, -1 - s, k0, k1, tag, buf, start, end - start, out, 0, m, own):
                count_entry(table, own)
            else:
                refused += 1
    count_entries(table, own[OWN_PENDING])
    return refused


@njit
def check_all(table, buf, offsets, out, want):
    """How many keys are found with the ids `ids_of` gives them, by `copy_ids` and, for short
    keys, by the encode loop's `copy_short_ids` (which writes at most `SPARE_IDS` items past
    them); -1 - k for the first found with other ids."""
    found = 0
    for k in range(offsets.shape[0] - 1):
        start, end = offsets[k], offsets[k + 1]
        s, k0, k1, tag, h = lookup(table, buf, start, end)
        if s < 0:  # not stored: both searches end at the same empty slot
            if tag <= MAX_SHORT and copy_short_ids(table, h, k0, k1, tag, out, 0) != s:
                return -1 - k
            continue
        n = ids_of(buf, start, end, want)
        if copy_ids(table, s, out, 0) != n or not (out[:n] == want[:n]).all():
            return -1 - k
        if tag <= MAX_SHORT:
            out[:] = -1
            if copy_short_ids(table, h, k0, k1, tag, out, 0) != n:
                return -1 - k
            if not (out[:n] == want[:n]).all() or (out[n + SPARE_IDS :] != -1).any():
                return -1 - k
        found += 1
    return found


def run_threads(target, args_of):
    threads = [threading.Thread(target=target, args=args_of(t)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.mark.parametrize("seed", range(4))
def test_threads_storing_at_once_leave_every_key_whole(seed):
    buf, offsets = make_keys(30_000, seed=seed)
    n = len(offsets) - 1
    table = new_table(2 * n, 64, 60 * n)._replace(learns=True)
    refused = []
    # Every thread meets the same keys in the same order, so they race to store each one.
    order = np.random.default_rng(seed).permutation(n)
    start = threading.Barrier(THREADS)

    def work():
        start.wait()
        refused.append(store_all(table, buf, offsets, order, np.empty(8, np.int32)))

    run_threads(work, lambda t: ())
    assert refused == [0] * THREADS
    metas = table.slots[2::4]
    assert not (metas == BUSY).any()  # every claimed slot was published
    assert check_all(table, buf, offsets, np.empty(16, np.int32), np.empty(16, np.int32)) == n
    # a key stored by two threads at once may take two slots, never more than one per thread
    assert n <= table.fill[1] == (metas != 0).sum() <= THREADS * n


def test_the_encode_loops_search_ends_where_find_does():
    # a pre-token the encode loop does not find is merged and stored at the empty slot where its
    # search (`copy_short_ids`) ended: the one `find` gives
    buf, offsets = make_keys(20_000, seed=9)
    n = len(offsets) - 1
    table = new_table(n, 64, 60 * n)._replace(learns=True)
    assert store_all(table, buf, offsets, np.arange(0, n, 2), np.empty(8, np.int32)) == 0
    assert check_all(table, buf, offsets, np.empty(16, np.int32), np.empty(16, np.int32)) == n // 2


@njit
def store_one(table, buf, ids, own):
    """Store the whole of `buf` with `ids` (absent from `table`); whether it had room."""
    s, k0, k1, tag, _ = lookup(table, buf, 0, buf.shape[0])
    return store(table, -1 - s, k0, k1, tag, buf, 0, buf.shape[0], ids, 0, ids.shape[0], own)


@njit
def ids_found(table, buf, out):
    """(ids by `copy_ids`, ids by the encode loop's `copy_short_ids`) of the whole of `buf`."""
    s, k0, k1, tag, h = lookup(table, buf, 0, buf.shape[0])
    n = copy_ids(table, s, out, 0)
    first = out[:n].copy()
    out[:] = -1
    m = copy_short_ids(table, h, k0, k1, tag, out, 0)
    return first, out[:m].copy()


def test_a_slot_holds_up_to_five_ids_below_two_to_the_21st_and_a_record_the_rest():
    # A hit on a pre-token of at most `INLINE_IDS` ids, each below 2**ID_BITS, reads its slot
    # and nothing else; more ids, or a larger one, go to a record. Both read back the same.
    largest = (1 << ID_BITS) - 1
    inline = [[7], [largest, 0], [1, 2, 3], [largest] * 4, [5, largest, 0, 9, largest - 1]]
    assert max(map(len, inline)) == INLINE_IDS
    in_records = [[1, 2, 3, 4, 5, 6], [largest + 1], [3, 1 << 30], [largest] * 9]
    table = new_table(64, 64, 4096)._replace(learns=True)
    own = np.zeros(OWN_ITEMS, np.int64)
    out = np.empty(16 + SPARE_IDS, np.int32)
    keys = {}
    for k, ids in enumerate(inline + in_records):
        if k == len(inline):
            assert table.fill[0] == 0  # no record taken so far
        key = np.frombuffer(f"key{k}".encode(), dtype=np.uint8)
        assert store_one(table, key, np.array(ids, np.int32), own)
        keys[k] = (key, ids)
    assert table.fill[0] > 0
    for key, ids in keys.values():
        by_copy, by_loop = ids_found(table, key, out)
        assert by_copy.tolist() == ids and by_loop.tolist() == ids


def test_growing_while_threads_store_copies_only_whole_entries():
    buf, offsets = make_keys(20_000, seed=3)
    n = len(offsets) - 1
    table = new_table(2 * n, 64, 60 * n)._replace(learns=True)
    rng = np.random.default_rng(4)
    orders = [rng.permutation(n) for _ in range(THREADS)]
    copies = []

    def work(order):
        if order is None:  # this thread grows the table, again and again, meanwhile
            for _ in range(20):
                bigger = new_table(4 * n, 64, 60 * n)._replace(learns=True)
                _rehash(table, bigger)
                copies.append(bigger)
        else:
            store_all(table, buf, offsets, order, np.empty(8, np.int32))

    run_threads(work, lambda t: (orders[t] if t else None,))
    final = new_table(4 * n, 64, 60 * n)._replace(learns=True)
    _rehash(table, final)
    for copy in [*copies, final]:
        found = check_all(copy, buf, offsets, np.empty(16, np.int32), np.empty(16, np.int32))
        assert found >= 0  # no entry with other ids than its key's
        assert copy.fill[1] == (copy.slots[2::4] != 0).sum() >= found
    assert found == n


def test_a_full_table_refuses_stores_and_never_fills_up():
    buf, offsets = make_keys(5_000, seed=5)
    table = new_table(1_000, 64, 60 * 5_000)._replace(learns=True)
    refused = []

    def work(order):
        refused.append(store_all(table, buf, offsets, order, np.empty(8, np.int32)))

    run_threads(work, lambda t: (np.random.default_rng(t).permutation(5_000),))
    slots = len(table.slots) // 4
    assert min(refused) > 0  # the table said it was full
    # the threads count their entries a batch at a time: room stays for the probes all the same
    assert table.fill[1] <= table.max_entries + THREADS * ENTRY_BATCH < slots


def test_slots_start_on_a_cache_line_and_large_tables_on_a_huge_page(gpt2):
    # A slot is 32 bytes: at numpy's usual start (16 bytes past a line) every other slot
    # straddled two cache lines.
    from nbbpe.encode_tables import SharedCache

    for entries in (1, 100, 10_000, 200_000):
        slots = new_table(entries, 16, 8).slots
        start = slots.__array_interface__["data"][0]
        assert slots.dtype == np.int64 and slots.flags.c_contiguous and not slots.any()
        assert start % (2 << 20 if slots.nbytes >= 2 << 20 else 64) == 0
    vocab = gpt2._get_engine().cache.vocab
    copy = SharedCache(vocab, 1 << 16).table  # room in the vocab table's: a copy of its slots
    assert copy.slots.__array_interface__["data"][0] % (2 << 20) == 0
    assert np.array_equal(copy.slots, vocab.slots) and copy.slots is not vocab.slots


@njit
def _differing_key_found(table, record, buf, length, other):
    """Whether `_same_bytes` says the long key at `record` (buf[:length]) is `other`[:n] for some
    n or byte changed (it must not): every byte changed, and every other length."""
    if not _same_bytes(table, record, buf, 0, length):
        return True  # not even the key itself
    for p in range(length):
        other[:length] = buf[:length]
        other[p] ^= 1 << (p % 8)
        if _same_bytes(table, record, other, 0, length):
            return True
    for n in range(length - 9, length + 10):
        if n != length and n > 16:
            other[:] = 0
            other[:min(n, length)] = buf[:min(n, length)]
            if _same_bytes(table, record, other, 0, n):
                return True
    return False


def test_a_threads_run_of_records_is_used_in_its_own_table_only():
    # A thread claims records a run at a time and keeps what is left of the run for its next
    # entries (`_claim_records`): in another table that part of its records is not its own.
    buf = np.frombuffer(b"abcdefgh", dtype=np.uint8)
    ids = np.arange(6, dtype=np.int32)
    own = np.zeros(OWN_ITEMS, np.int64)
    first, second = (new_table(64, 64, 4 * RECORD_RUN)._replace(learns=True) for _ in range(2))
    for table, end in ((first, 2), (first, 3), (second, 4)):
        s, k0, k1, tag, _ = lookup(table, buf, 0, end)
        assert store(table, -1 - s, k0, k1, tag, buf, 0, end, ids, 0, 6, own)
    records_of = lambda table, end: table.slots[4 * lookup(table, buf, 0, end)[0] + 3]
    assert (records_of(first, 2), records_of(first, 3)) == (0, 7)  # [6, ids...] each, one run
    assert first.fill[0] == second.fill[0] == RECORD_RUN
    assert records_of(second, 4) == 0  # not 14, where the run of `first` went on
    assert list(second.records[:7]) == [6, *ids]


@pytest.mark.parametrize("length", [17, 23, 24, 25, 40, 63, 64, 65, 256])
def test_a_long_key_matches_its_own_bytes_only(length):
    # Long keys are found by two 64-bit hashes, then their bytes compared, 8 at a time: the
    # compare alone must tell them apart (a collision of the hashes would otherwise be trusted).
    rng = np.random.default_rng(length)
    buf = rng.integers(1, 256, length + 16, dtype=np.uint8)  # bytes after the key: not in it
    table = new_table(8, 256, 1 << 12)._replace(learns=True)
    s, k0, k1, tag, _ = lookup(table, buf, 0, length)
    assert s < 0 and store(table, -1 - s, k0, k1, tag, buf, 0, length, np.arange(5, dtype=np.int32),
                           0, 5, np.zeros(OWN_ITEMS, np.int64))
    found, *_ = lookup(table, buf, 0, length)
    record = table.slots[4 * found + 3]
    assert not _differing_key_found(table, record, buf, length, np.zeros(length + 16, np.uint8))


def test_retiring_a_table_marks_it_stale_and_finds_a_thread_that_reads_it():
    # `_retire` (before a cache starts again in its table's memory): the table is marked
    # `STALE`, and a thread reads it if its hazard word (`enter_table`) holds the table's serial.
    from nbbpe.encode_tables import SERIAL, STALE, _retire

    table = new_table(64, 64, 1 << 12)._replace(learns=True)
    other = new_table(64, 64, 1 << 12)._replace(learns=True)
    words = np.zeros(24, dtype=np.int64)  # three threads' hazard words, a cache line apart
    addresses = words.ctypes.data + 8 * np.array([0, 8, 16], dtype=np.int64)
    assert not _retire(table.fill, addresses) and table.fill[STALE] == 1
    assert not _retire(table.fill, addresses[:0])
    words[8] = other.fill[SERIAL]  # a thread in a kernel reading another table
    assert not _retire(table.fill, addresses)
    words[16] = table.fill[SERIAL]
    assert _retire(table.fill, addresses)
    assert not _retire(other.fill, addresses[::2])
