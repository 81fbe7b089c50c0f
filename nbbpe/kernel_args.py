"""Many arrays passed to a compiled kernel as one: an int64 array of their addresses and lengths.

A call from Python into a Numba kernel unboxes each array argument (a type check and a MemInfo
allocated for it: ~50 ns each), and every array inside a NamedTuple argument too. The encode
kernels take 15 arrays (the text, the tables, the scratch space, the output), so the Python
side of encoding one short text spent more time handing its arguments over (~0.9 µs) than the
kernel spent encoding it. Packed (`PackedArrays`), they are one array to unbox; the kernel
rebuilds each as a view of the same memory (`array_at`, `readonly_array_at`), with the type it
would have had as an argument, so that every function it calls has the same signature as
before (and is compiled once).

The packed values are plain addresses: the `PackedArrays` object holds a reference to every
array packed, and must outlive each call given its `values`.

A compiled function can also call a kernel by the address of its machine code (`call_at`,
`kernel_cache.native_address`): calling it by name would link the kernel into the caller and
compile all of it again with the caller (seconds, for an encode kernel).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from . import kernel_cache  # noqa: F401  (first: keys the cached kernels, see kernel_cache)


class PackedArrays:
    """`values`: for each item of `items` in order, an array as (address, length), a NamedTuple
    as its fields in order (arrays as above), an int or bool as itself. Arrays must be
    one-dimensional and C-contiguous."""

    __slots__ = ("values", "_arrays")

    def __init__(self, *items):
        values: list[int] = []
        arrays: dict[int, np.ndarray] = {}  # where in `values` -> the array packed there
        for item in items:
            for value in (item if isinstance(item, tuple) else (item,)):
                if isinstance(value, np.ndarray):
                    _check_packable(value)
                    arrays[len(values)] = value
                    values += (address(value), len(value))
                else:
                    values.append(int(value))
        self.values = np.array(values, dtype=np.int64)
        self._arrays = arrays  # alive as long as the addresses are used

    def set_array(self, k: int, array: np.ndarray) -> None:
        """Pack `array` at values[k:k + 2], in place of the array packed there (of the same
        dtype: the caller checks), without packing the others again."""
        if k not in self._arrays:
            raise ValueError(f"no array is packed at {k}")
        _check_packable(array)
        self._arrays[k] = array
        self.values[k] = address(array)
        self.values[k + 1] = len(array)

    def release(self, k: int) -> None:
        """Let go of the array packed at values[k:k + 2] (its address stays, unusable, until
        `set_array` packs another there): a large text need not outlive its call."""
        self._arrays[k] = _RELEASED
        self.values[k + 1] = 0


_RELEASED = np.empty(0, dtype=np.uint8)


def _check_packable(array: np.ndarray) -> None:
    if array.ndim != 1 or not array.flags.c_contiguous:
        raise ValueError("only 1-d C-contiguous arrays can be packed")


def address(array: np.ndarray) -> int:
    """Where the data of `array` starts in memory."""
    return array.__array_interface__["data"][0]


def _array_type(dtype, readonly: bool) -> types.Array:
    return types.Array(dtype.dtype, 1, "C", readonly=readonly)


def _array_codegen(array_type):
    def codegen(context, builder, signature, args):
        address, length, _ = args
        array = context.make_array(array_type)(context, builder)
        item_type = context.get_data_type(array_type.dtype)
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(item_type))
        populate_array(array, data=builder.inttoptr(address, item_type.as_pointer()),
                       shape=[length], strides=[itemsize], itemsize=itemsize, meminfo=None)
        return array._getvalue()
    return codegen


@intrinsic
def _array_at(typingctx, address, length, dtype):
    array_type = _array_type(dtype, readonly=False)
    return array_type(types.int64, types.int64, dtype), _array_codegen(array_type)


@intrinsic
def _readonly_array_at(typingctx, address, length, dtype):
    array_type = _array_type(dtype, readonly=True)
    return array_type(types.int64, types.int64, dtype), _array_codegen(array_type)


@njit(inline="always")
def array_at(values, k, dtype):
    """The array packed at values[k:k + 2], as a 1-d C array of `dtype` (a NumPy scalar type)."""
    return _array_at(values[k], values[k + 1], dtype)


@njit(inline="always")
def readonly_array_at(values, k, dtype):
    """`array_at`, typed read-only (as a view of `bytes` is)."""
    return _readonly_array_at(values[k], values[k + 1], dtype)


@njit(inline="always")
def readonly_array_from(address, length, dtype):
    """The `length` items of `dtype` at `address`, as a read-only 1-d C array (no copy)."""
    return _readonly_array_at(address, length, dtype)


@intrinsic
def data_address(typingctx, array):
    """Where the data of `array` (an array, or `bytes`) starts in memory."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, context.get_value_type(types.int64))
    return types.int64(array), codegen


@intrinsic
def copy_bytes(typingctx, to_address, from_address, count):
    """Copy `count` bytes from address `from_address` to `to_address` (a `memcpy`)."""
    if not all(isinstance(t, types.Integer) for t in (to_address, from_address, count)):
        return None

    def codegen(context, builder, signature, args):
        byte_pointer = ir.IntType(8).as_pointer()
        i64 = ir.IntType(64)
        to, source, n = (context.cast(builder, a, t, types.int64)
                         for a, t in zip(args, signature.args))
        cgutils.raw_memcpy(builder, builder.inttoptr(to, byte_pointer),
                           builder.inttoptr(source, byte_pointer), n, i64(1))
        return context.get_dummy_value()

    return types.void(to_address, from_address, count), codegen


def call_at(signature):
    """An intrinsic `call(address, args) -> (ok, result)`: call the compiled function of
    `signature` (a `numba.core.typing.Signature`) whose machine code is at `address`, with the
    tuple `args` (each cast to the type the signature has), in Numba's calling convention; `ok`
    is false if it raised (the exception is dropped: call it again the usual way to see it).
    Define it once, at module level, for a cached caller."""
    restype, argtypes = signature.return_type, tuple(signature.args)
    result_type = types.Tuple((types.boolean, restype))

    def codegen(context, builder, sig, args):
        address, given = args
        given_types = sig.args[1]
        values = [context.cast(builder, builder.extract_value(given, k), given_types[k], to)
                  for k, to in enumerate(argtypes)]
        function_type = context.call_conv.get_function_type(restype, argtypes)
        function = builder.inttoptr(address, function_type.as_pointer())
        status, result = context.call_conv.call_function(builder, function, restype, argtypes,
                                                         values)
        return context.make_tuple(builder, result_type, (status.is_ok, result))

    def call(typingctx, address, args):
        if not isinstance(args, types.BaseTuple) or len(args) != len(argtypes):
            return None
        return result_type(types.int64, args), codegen

    return intrinsic(call)
