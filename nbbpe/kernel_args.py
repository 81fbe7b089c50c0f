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

import ctypes

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from . import kernel_cache  # noqa: F401  (first: keys the cached kernels, see kernel_cache)
from .kernel_cache import cached_cfunc


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
def array_from(address, length, dtype):
    """The `length` items of `dtype` at `address`, as a 1-d C array (no copy)."""
    return _array_at(address, length, dtype)


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


# --- a compiled function Python calls as a builtin ----------------------------------------------
#
# Numba's entry point for a compiled function is a builtin that takes a tuple of arguments and
# unboxes each (a `bytes` through the buffer protocol and a MemInfo, an array through another
# MemInfo), and a text had to become `bytes` first: for a short text that is most of what a call
# costs. A Numba `cfunc` of the C signature of a METH_FASTCALL | METH_KEYWORDS method,
# `PyObject *f(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)`
# (every pointer an int64 here), wrapped in a builtin function object by `fastcall_builtin`,
# receives the objects as they are: it reads what it needs through CPython's C API, whose
# functions it calls by address (`call_c`; addresses of this process, handed over in its packed
# values, never compiled into cached code). The few facts of object layout it reads directly
# are below, and `object_layout_known` checks each.

OB_TYPE_OFFSET = 8  # PyObject: its reference count, then its type
NDARRAY_DATA_OFFSET = 16  # PyArrayObject: PyObject's head, then the data pointer
TUPLE_SIZE_OFFSET = 16  # PyTupleObject: PyObject's head, its size, then its items
TUPLE_ITEMS_OFFSET = 24
LIST_ITEMS_OFFSET = 24  # PyListObject: PyObject's head, its size, then its items' address
STR_LENGTH_OFFSET = 16  # PyASCIIObject: PyObject's head, its length in characters, its hash,
STR_STATE_OFFSET = 32  # then its state bits: interned (2), kind (3), compact (1), ascii (1)
STR_ASCII_BIT = 1 << 6


@intrinsic
def load_word(typingctx, address):
    """The int64 at `address`."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        at = context.cast(builder, args[0], signature.args[0], types.int64)
        return builder.load(builder.inttoptr(at, i64.as_pointer()))

    return types.int64(address), codegen


@intrinsic
def call_c(typingctx, address, args):
    """Call the C function at `address` with the integers of the tuple `args`, each passed as
    an int64 (a pointer, a Py_ssize_t); return what it returns as an int64 (so: only for
    functions returning a pointer, a Py_ssize_t or nothing)."""
    if not (isinstance(address, types.Integer) and isinstance(args, types.BaseTuple)
            and all(isinstance(t, types.Integer) for t in args)):
        return None

    def codegen(context, builder, signature, llargs):
        i64 = ir.IntType(64)
        given = [context.cast(builder, builder.extract_value(llargs[1], k), t, types.int64)
                 for k, t in enumerate(signature.args[1])]
        function_type = ir.FunctionType(i64, [i64] * len(given))
        at = context.cast(builder, llargs[0], signature.args[0], types.int64)
        return builder.call(builder.inttoptr(at, function_type.as_pointer()), given)

    return types.int64(address, args), codegen


def c_function_address(name: str) -> int:
    """Where CPython's C API function `name` is in this process."""
    return ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value


def load_int(at: int) -> int:
    """The int64 at address `at`, read from Python."""
    return ctypes.c_int64.from_address(at).value


def bytes_at(at: int, length: int) -> np.ndarray:
    """A copy of the `length` bytes at address `at`, as a read-only uint8 array."""
    return np.frombuffer(ctypes.string_at(at, length), dtype=np.uint8)


# A str of each kind CPython holds (ASCII, 1, 2 and 4 bytes a character), read to check the
# offsets above and `text_bytes`' own.
LAYOUT_SAMPLE_STRS = ("Hi!", "é" * 5, "日本" + "x" * 40, "😀" * 3, "a" * 200)


def object_layout_known() -> bool:
    """Whether objects here are laid out as the offsets above say (a CPython of the usual
    build: not a debug build that traces references, nor a free-threaded one)."""
    array = np.zeros(1, dtype=np.int64)
    pair = (array, "x")
    listed = [1000, 1001]
    word = load_int

    def ascii_bit(text: str) -> bool:
        return bool(word(id(text) + STR_STATE_OFFSET) & STR_ASCII_BIT)

    return (word(id("x") + OB_TYPE_OFFSET) == id(str)
            and word(id(array) + NDARRAY_DATA_OFFSET) == address(array)
            and word(id(pair) + TUPLE_SIZE_OFFSET) == 2
            and word(id(pair) + TUPLE_ITEMS_OFFSET) == id(array)
            and word(id(pair) + TUPLE_ITEMS_OFFSET + 8) == id("x")
            and word(word(id(listed) + LIST_ITEMS_OFFSET) + 8) == id(listed[1])
            and all(word(id(text) + STR_LENGTH_OFFSET) == len(text)
                    and ascii_bit(text) == text.isascii() for text in LAYOUT_SAMPLE_STRS))


# `PyArray_New(subtype, nd, dims, type_num, strides, data, itemsize, flags, obj)`: entry 93 of
# NumPy's C API table (`PyArray_API`, numpy/__multiarray_api.h; the same in NumPy 1 and 2).
_PYARRAY_NEW_INDEX = 93
_new_array_type = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_int,
                                    ctypes.POINTER(ctypes.c_ssize_t), ctypes.c_int, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)


def new_array_address() -> int | None:
    """Where NumPy's `PyArray_New` is in this process, found in NumPy's C API table; None if it
    is not there, or if a call of it does not make the uninitialized one-dimensional array it
    should (checked here through ctypes), so that a caller can take another way."""
    try:
        try:
            from numpy._core import _multiarray_umath
        except ImportError:  # NumPy 1
            from numpy.core import _multiarray_umath
        get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
            ("PyCapsule_GetPointer", ctypes.pythonapi))  # a prototype of its own: none set globally
        table = get_pointer(_multiarray_umath._ARRAY_API, None)
        function = ctypes.c_void_p.from_address(table + 8 * _PYARRAY_NEW_INDEX).value
        for dtype in (np.uint16, np.uint32):
            array = _new_array_type(function)(id(np.ndarray), 1, (ctypes.c_ssize_t * 1)(3),
                                              np.dtype(dtype).num, None, None, 0, 0, None)
            if not (type(array) is np.ndarray and array.shape == (3,) and array.dtype == dtype
                    and array.flags.owndata and array.flags.writeable
                    and array.flags.c_contiguous):
                return None
        return function
    except Exception:  # no such table here (the index is NumPy's ABI, which NumPy keeps)
        return None


class _PyMethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p),
                ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


# The C signature of a METH_FASTCALL | METH_KEYWORDS method (every pointer an int64)
FASTCALL_SIGNATURE = types.int64(types.int64, types.int64, types.int64, types.int64)
_fastcall_functions: dict = {}  # py_func -> its cfunc, compiled or loaded once per process


def fastcall_address(py_func) -> int:
    """Where `py_func`, compiled as a C function of `FASTCALL_SIGNATURE`, is: compiled on first
    use in the process, or loaded from Numba's cache (`kernel_cache.cached_cfunc`). Raises if it
    does not compile here (`call_c` and friends build on Numba's internals)."""
    function = _fastcall_functions.get(py_func)
    if function is None:
        function = _fastcall_functions[py_func] = cached_cfunc(py_func, FASTCALL_SIGNATURE)
    return function.address


def usable_fastcall_address(py_func) -> int | None:
    """`fastcall_address(py_func)`, or None if objects are not laid out as such a function
    reads them (`object_layout_known`) or it does not compile here."""
    if not object_layout_known():
        return None
    try:
        return fastcall_address(py_func)
    except Exception:
        return None


_METH_FASTCALL_KEYWORDS = 0x0080 | 0x0002  # METH_FASTCALL | METH_KEYWORDS
_method_defs: dict = {}  # (address, name, doc) -> its PyMethodDef, alive as long as the process
_new_function = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.py_object,
                                  ctypes.c_void_p)(("PyCFunction_NewEx", ctypes.pythonapi))
_keep_forever = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", ctypes.pythonapi))


def fastcall_builtin(function_address: int, self_object, name: str = "call",
                     doc: str | None = None):
    """A builtin function object calling the C function at `function_address` as a
    METH_FASTCALL | METH_KEYWORDS method bound to `self_object` (which it holds): f(*args,
    **kwargs) calls it with `self_object`, the arguments as an array of object pointers, the
    number of positional ones, and the keywords' names (a tuple, or NULL if none). The
    function must return a new reference, or NULL with an exception set. `doc` is its
    `__doc__` (a first line `name($self, ...)` and `--` give its signature)."""
    key = (function_address, name, doc)
    method = _method_defs.get(key)
    if method is None:  # CPython keeps a pointer to it in every function object made from it
        method = _method_defs[key] = _PyMethodDef(
            name.encode(), function_address, _METH_FASTCALL_KEYWORDS,
            None if doc is None else doc.encode())
        # ... and reads it when the function object goes: one may outlive this module's dict
        # at exit (an own call in a reference cycle, collected last), so the PyMethodDef (and
        # the strings it holds) is never freed: one reference more, never given back.
        _keep_forever(ctypes.py_object(method))
    return _new_function(ctypes.byref(method), self_object, None)
