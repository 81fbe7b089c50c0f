"""Arrays handed to a kernel packed as addresses (`kernel_args`) are the same arrays inside."""

import gc
import weakref

import numpy as np
import pytest
from numba import njit, typeof, types

from nbbpe.encode import (
    COPY_UP_TO,
    DOC_ADDRESSES_AT,
    DOC_ENDS_AT,
    DOC_OUT_ENDS_AT,
    ENCODE_ARG_ITEMS,
    RANKS,
    SPECIALS_AT,
    TEXT_AT,
    TEXT_BUFFER_AT,
    TEXT_PAD,
    _no_merges,
    encode_args,
    new_scratch,
    pack_encode_args,
    release_documents,
    repack_documents,
)
from nbbpe.encode_tables import SharedCache, new_table
from nbbpe.kernel_args import (PackedArrays, address, array_at, call_at, copy_bytes,
                               data_address, readonly_array_at)
from nbbpe.kernel_cache import native_address
from nbbpe.scanners.specials import make_specials


@njit
def _s(a):
    return len(a), np.int64(a.astype(np.int64).sum()), np.int64(a[0])


@njit
def _unpacked_encode_args(values):
    # What the kernel sees of each packed item, as numbers Python can compare: for each array
    # its length, sum and first item; the tables' ints.
    unpacked = encode_args(values, np.uint8)
    buf, table, doc_ends, doc_out_ends, scratch, out, doc_addresses, specials, ranks, cache = (
        unpacked)
    doc_out_ends[0] = 77  # written through to the caller's array
    out[-1] = -5
    summary = (_s(buf), _s(table), _s(doc_ends), _s(scratch), _s(doc_addresses), _s(specials.data),
               _s(specials.offsets), _s(ranks.slots), _s(cache.slots), _s(cache.fill), _s(out),
               _s(specials.ids), _s(ranks.merged), _s(ranks.byte_ids), _s(ranks.dense),
               _s(cache.records),
               (len(specials.first_bytes), np.int64(specials.first_bytes.sum()),
                np.int64(specials.first_byte)))
    ints = (ranks.shift, ranks.id_bits, ranks.rank_bits, ranks.mode, ranks.dense_bits,
            ranks.merged_offset, cache.shift, cache.max_entries, cache.max_key_len,
            np.int64(cache.learns))
    return summary, ints


def _summary(a):
    return (len(a), int(a.astype(np.int64).sum()), int(a[0]))


def test_every_array_and_int_of_the_encode_kernels_arrives_whole():
    rng = np.random.default_rng(7)
    buf = np.frombuffer(b"some text <|x|> more", dtype=np.uint8)
    table = np.frombuffer(bytes(range(256)), dtype=np.uint8)
    doc_ends = np.array([5, len(buf)], dtype=np.int64)
    doc_out_ends = np.zeros(2, dtype=np.int64)
    scratch = rng.integers(-99, 99, size=new_scratch().size)
    out = rng.integers(0, 50000, size=300).astype(np.int32)
    specials = make_specials([("<|x|>", 257), ("<|longer|>", 258)])
    ranks = _no_merges(np.arange(256, dtype=np.int32)[::-1].copy(), RANKS)
    ranks = ranks._replace(slots=rng.integers(-9, 9, size=len(ranks.slots)), shift=51,
                           id_bits=17, rank_bits=19, dense_bits=3, merged_offset=-1)
    cache = SharedCache(new_table(40, 256, 64), 100).table
    cache.fill[:] = (3, 4, 5, 6, 7, 8, 9, 10)
    doc_addresses = np.array([1 << 40, 3], dtype=np.int64)
    packed = pack_encode_args(buf, table, doc_ends, doc_out_ends, scratch, out, specials, ranks,
                              cache, doc_addresses=doc_addresses)
    assert len(packed.values) == ENCODE_ARG_ITEMS

    summary, ints = _unpacked_encode_args(packed.values)

    expected = [_summary(a) for a in (buf, table, doc_ends, scratch, doc_addresses, specials.data,
                                      specials.offsets, ranks.slots, cache.slots, cache.fill)]
    out_after = out.copy()
    out_after[-1] = -5
    expected += [_summary(a) for a in (out_after, specials.ids, ranks.merged, ranks.byte_ids,
                                       ranks.dense, cache.records)]
    expected.append((256, int(specials.first_bytes.sum()), specials.first_byte))
    assert [tuple(map(int, s)) for s in summary] == expected
    assert tuple(map(int, ints)) == (51, 17, 19, RANKS, 3, -1, cache.shift, cache.max_entries,
                                     cache.max_key_len, 1)
    assert doc_out_ends[0] == 77 and out[-1] == -5  # the caller's arrays, not copies


def test_the_text_and_class_table_are_typed_read_only_as_views_of_bytes():
    # So the kernels they are handed on to have the signature they had as arguments.
    packed = PackedArrays(np.zeros(4, dtype=np.uint8), np.zeros(4, dtype=np.uint8))

    @njit
    def types_of(values):
        return readonly_array_at(values, 0, np.uint8), array_at(values, 2, np.uint8)

    types_of(packed.values)
    signature = types_of.nopython_signatures[0]
    assert signature.return_type[0] == typeof(np.frombuffer(b"ab", dtype=np.uint8))
    assert signature.return_type[1] == typeof(np.zeros(2, dtype=np.uint8))


def test_wrong_arrays_are_refused_before_any_kernel_sees_them():
    specials = make_specials([])
    ranks = _no_merges(np.arange(256, dtype=np.int32), RANKS)
    cache = SharedCache(new_table(4, 256, 64), 10).table
    good = dict(buf=np.zeros(4, np.uint8), table=np.zeros(256, np.uint8),
                doc_ends=np.zeros(1, np.int64), doc_out_ends=np.zeros(1, np.int64),
                scratch=new_scratch(), out=np.zeros(8, np.int32))
    pack_encode_args(**good, specials=specials, ranks=ranks, cache=cache)
    with pytest.raises(TypeError, match="dtypes"):
        pack_encode_args(**{**good, "out": np.zeros(8, np.int64)}, specials=specials,
                         ranks=ranks, cache=cache)
    with pytest.raises(ValueError, match="contiguous"):
        pack_encode_args(**{**good, "buf": np.zeros(8, np.uint8)[::2]}, specials=specials,
                         ranks=ranks, cache=cache)
    with pytest.raises(ValueError, match="2 document addresses for 1 documents"):
        pack_encode_args(**good, specials=specials, ranks=ranks, cache=cache,
                         doc_addresses=np.zeros(2, np.int64))
    with pytest.raises(TypeError, match="dtypes"):
        pack_encode_args(**good, specials=specials, ranks=ranks, cache=cache,
                         doc_addresses=np.zeros(1, np.int32))
    # The short path's text buffer goes after the rest, and has room for a text and its pad.
    buffer = np.zeros(COPY_UP_TO + TEXT_PAD, np.uint8)
    packed = pack_encode_args(**good, specials=specials, ranks=ranks, cache=cache,
                              text_buffer=buffer)
    assert len(packed.values) == ENCODE_ARG_ITEMS + 2
    assert packed.values[TEXT_BUFFER_AT] == address(buffer)
    for small in (np.zeros(COPY_UP_TO, np.uint8), np.zeros(COPY_UP_TO + TEXT_PAD, np.int8)):
        with pytest.raises(ValueError, match="text buffer"):
            pack_encode_args(**good, specials=specials, ranks=ranks, cache=cache,
                             text_buffer=small)


def test_documents_put_in_packed_arguments_replace_the_old_and_are_let_go():
    specials = make_specials([])
    ranks = _no_merges(np.arange(256, dtype=np.int32), RANKS)
    cache = SharedCache(new_table(4, 256, 64), 10).table
    packed = pack_encode_args(np.zeros(4, np.uint8), np.zeros(256, np.uint8),
                              np.zeros(1, np.int64), np.zeros(1, np.int64), new_scratch(),
                              np.zeros(8, np.int32), specials, ranks, cache)
    before = packed.values.copy()
    buf, ends, out_ends = np.arange(9, dtype=np.uint8), np.array([4, 9]), np.zeros(2, np.int64)
    at = np.array([1000, 2000], dtype=np.int64)
    repack_documents(packed, buf, ends, out_ends, at)
    expected = before.copy()
    expected[[TEXT_AT, TEXT_AT + 1, DOC_ENDS_AT, DOC_ENDS_AT + 1, DOC_OUT_ENDS_AT,
              DOC_OUT_ENDS_AT + 1, DOC_ADDRESSES_AT, DOC_ADDRESSES_AT + 1]] = [
        address(buf), 9, address(ends), 2, address(out_ends), 2, address(at), 2]
    assert packed.values.tolist() == expected.tolist()  # the rest as packed
    repack_documents(packed, buf, ends, out_ends)  # no addresses: the documents are in buf
    assert packed.values[DOC_ADDRESSES_AT + 1] == 0
    with pytest.raises(TypeError, match="dtypes"):
        repack_documents(packed, buf, ends.astype(np.int32), out_ends)
    with pytest.raises(ValueError, match="1 document addresses for 2 documents"):
        repack_documents(packed, buf, ends, out_ends, at[:1])
    with pytest.raises(ValueError, match="no array"):
        packed.set_array(SPECIALS_AT - 1, buf)  # not where an array is packed
    held = weakref.ref(buf)
    release_documents(packed)
    del buf
    gc.collect()
    assert held() is None


@njit
def _weighted(values, k, scale):
    if k < 0:
        raise ValueError("negative k")
    return values[k] * scale, np.int64(len(values))


_WEIGHTED = types.Tuple((types.float64, types.int64))(types.Array(types.int64, 1, "C"), types.int64,
                                                      types.float64)
_call_weighted_at = call_at(_WEIGHTED)


@njit
def _call_weighted(function, values, k, scale):
    return _call_weighted_at(function, (values, k, scale))


def test_a_compiled_function_is_called_at_its_address_with_its_arguments_and_result():
    values = np.array([3, 5, 7], dtype=np.int64)
    args = (values, 1, 2.5)
    _weighted(*args)
    function = native_address(_weighted, args, _WEIGHTED)
    assert function
    assert _call_weighted(function, values, 1, 2.5) == (True, (12.5, 3))
    assert _call_weighted(function, values, 2, 0.5) == (True, (3.5, 3))
    ok, _ = _call_weighted(function, values, -1, 1.0)  # it raised: said, not propagated
    assert not ok
    # not compiled for these types, or compiled as another signature: no address
    assert native_address(_weighted, (values, 1.5, 2.5), _WEIGHTED) is None
    assert native_address(_weighted, args, types.int64(types.int64)) is None


@njit
def _address_of(data):
    return data_address(data)


def test_data_address_is_where_the_bytes_or_array_are():
    data = b"some text"
    assert _address_of(data) == address(np.frombuffer(data, dtype=np.uint8))
    array = np.arange(5, dtype=np.int32)[1:]
    assert _address_of(array) == address(array)


@njit
def _copy_into(to, data, n):
    copy_bytes(data_address(to), data_address(data), n)


def test_copy_bytes_copies_that_many_bytes_and_no_more():
    to = np.full(12, 7, dtype=np.uint8)
    _copy_into(to, b"abcdefgh", 5)
    assert bytes(to) == b"abcde" + bytes([7] * 7)
    _copy_into(to, b"xyz", 0)
    assert bytes(to[:5]) == b"abcde"


def test_new_array_address_is_numpys_pyarray_new_or_none(monkeypatch):
    # The short path makes its result arrays with NumPy's `PyArray_New`, found in NumPy's C API
    # table: called at that address, it makes a fresh, writable one-dimensional array of the
    # length and type number asked for. Where the table cannot be read, None: the short path is
    # then not used.
    import ctypes

    from nbbpe import kernel_args

    at = kernel_args.new_array_address()
    assert isinstance(at, int) and at != 0
    new_array = kernel_args._new_array_type(at)
    for dtype, n in ((np.uint16, 0), (np.uint32, 7), (np.int64, 3)):
        array = new_array(id(np.ndarray), 1, (ctypes.c_ssize_t * 1)(n), np.dtype(dtype).num,
                          None, None, 0, 0, None)
        assert type(array) is np.ndarray and array.shape == (n,) and array.dtype == dtype
        array[:] = 5
        assert array.flags.owndata and array.tolist() == [5] * n
    try:
        from numpy._core import _multiarray_umath
    except ImportError:  # NumPy 1
        from numpy.core import _multiarray_umath
    monkeypatch.setattr(_multiarray_umath, "_ARRAY_API", "not a capsule")
    assert kernel_args.new_array_address() is None


def test_a_builtins_method_def_is_never_freed(monkeypatch):
    # A builtin made by `fastcall_builtin` reads its PyMethodDef when it goes, and an own call
    # (`Tokenizer.encode`, in a reference cycle) may go at exit after this module's dict has:
    # so each PyMethodDef is kept for the process (when it was not, a script that used own
    # calls crashed at exit now and then, once that memory had been used again).
    from nbbpe import encode, kernel_args

    made = {}
    monkeypatch.setattr(kernel_args, "_method_defs", made)
    call = kernel_args.fastcall_builtin(encode.short_path_address(), (np.zeros(1),), "probe",
                                        "probe($self, text)\n--\n\nA probe.")
    assert call.__name__ == "probe" and call.__doc__ == "A probe."
    [method] = made.values()
    held = weakref.ref(method)
    made.clear()
    del method
    gc.collect()
    assert held() is not None and held().ml_name == b"probe"
    assert call.__name__ == "probe"


def test_new_scratch_is_zeros_even_in_reused_memory():
    # Its zeros are written (not left to fresh pages, see `new_scratch`), so they must be
    # there whatever memory it is given: here that of arrays just filled and let go of.
    size = new_scratch().size
    for _ in range(3):
        dirty = np.full(size, -1, dtype=np.int64)
        del dirty
        assert not new_scratch().any()
