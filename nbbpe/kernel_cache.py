"""The first run: compiling the kernels once, on both cores, and saying so.

Numba compiles each kernel on its first use and keeps it in its cache (`__pycache__` beside the
package, or NUMBA_CACHE_DIR); later runs load it in milliseconds. Compiling is Python code
holding the GIL, so a thread cannot overlap it with other compiling: where a stage knows it
will need kernels that are not cached yet, it compiles them in another process
(`compile_elsewhere`) while this one compiles or works on something else, then loads them from
the cache. This roughly halves the first run on two cores. Kernels both processes need (the
helpers of the other's kernel) are compiled here, before the other process reaches them, so
that it loads them instead of compiling them at the same time (`merge.compile_helpers`,
`encode.compile_shared_first`); should one still reach a kernel the other is compiling, it
waits for it and loads it (`_compile_lock`). A process with nothing left to compile but a wait
for the other compiles meanwhile what it needs next (`compile_elsewhere.running`), and a first
run on a small source compiles no kernel at all (`sources.SMALL_SOURCE`: it counts with `regex`,
learns its merges and encodes in Python). Nothing changes once the cache is warm, and if the
other process fails, the kernels are simply compiled here when first used.

A cached kernel is used only if no module of kernels has changed since it was compiled (see
`kernel_sources_digest`): Numba alone checks the kernel's own file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading

_announced = threading.Event()
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


# --- which cached kernels are current ----------------------------------------------------------
#
# Numba keys a cached kernel on its own source file only, but a kernel holds the code of what it
# calls and inlines from other modules (`encode_documents` inlines `encode_tables.copy_short_ids`
# and the scanners): after a change to one of those alone, the old kernel would be loaded, and
# could give wrong ids (a table layout it no longer matches). So every kernel of this package is
# keyed on the sources of all the modules that import Numba (`kernel_sources_digest`); each of
# them imports this module before it defines its kernels.


def kernel_sources_digest(package_dir: str = _PACKAGE) -> bytes:
    """SHA-256 of the source of every module under `package_dir` that imports Numba or llvmlite
    (the modules of kernels and of what they inline), with their paths."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                source = f.read()
            if any(line.startswith((b"from numba", b"import numba", b"from llvmlite"))
                   for line in source.splitlines()):
                digest.update(os.path.relpath(path, package_dir).encode() + b"\0" + source + b"\0")
    return digest.digest()


class _PackageKeyedLocator:
    """The cache locator Numba would use for a kernel of this package (where its cache lives),
    but stamped with `kernel_sources_digest` instead of the hash of the kernel's own file."""

    _digest: bytes | None = None

    def __init__(self, locator):
        self._locator = locator

    def __getattr__(self, name):
        return getattr(self._locator, name)

    def get_source_stamp(self):
        if _PackageKeyedLocator._digest is None:
            _PackageKeyedLocator._digest = kernel_sources_digest()
        return _PackageKeyedLocator._digest

    @classmethod
    def from_function(cls, py_func, py_file):
        if not os.path.abspath(py_file).startswith(_PACKAGE + os.sep):
            return None
        from numba.core.caching import CacheImpl

        for other in CacheImpl._locator_classes:
            if other is not cls:
                locator = other.from_function(py_func, py_file)
                if locator is not None:
                    return cls(locator)
        return None


def _key_kernels_on_package_sources() -> None:
    try:
        from numba.core.caching import CacheImpl

        if _PackageKeyedLocator not in CacheImpl._locator_classes:
            CacheImpl._locator_classes.insert(0, _PackageKeyedLocator)
    except (ImportError, AttributeError):  # another Numba's internals: its own keys, as before
        pass


_key_kernels_on_package_sources()


# --- one process compiles a kernel, the others load it ----------------------------------------
#
# Two processes of a first run (see `compile_elsewhere`), or pytest's and a worker's, often need
# the same kernel (the helpers both of their kernels call). Ordering their work avoids most
# double compiles, but not on a machine slower or faster than the order was tuned on: there,
# both compiled `find`, `store` and the merge loop of the encode kernel, 2.3 CPU-seconds. So a
# kernel of this package is compiled holding a lock file beside its cache entry: a process that
# needs it meanwhile waits, then loads it from the cache (Numba looks there before compiling).
# The call graph has no cycles, so two processes never wait on each other.

_LOCK_WAIT_S = 600.0  # past this, compile anyway: a stuck process must not hang this one
_held_locks: dict = {}  # path -> times taken in this process (a kernel's compile may nest)


def _lock_path(dispatcher) -> str | None:
    cache = getattr(dispatcher, "_cache", None)
    impl = getattr(cache, "_impl", None)
    if not isinstance(getattr(impl, "_locator", None), _PackageKeyedLocator):
        return None  # not a cached kernel of this package
    return os.path.join(cache.cache_path, impl.filename_base + ".nblock")


class _compile_lock:
    """Hold the lock file `path` (None: no lock) for this process, waiting for another
    process's compile to end; reentrant within the process."""

    def __init__(self, path: str | None):
        self._path = path
        self._fd = None

    def __enter__(self):
        if self._path is None:
            return self
        if self._path in _held_locks:
            _held_locks[self._path] += 1
            return self
        try:
            import fcntl
            import time

            os.makedirs(os.path.dirname(self._path), exist_ok=True)
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o666)
            give_up = time.monotonic() + _LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > give_up:
                        break
                    time.sleep(0.005)
        except (ImportError, OSError):  # no flock here, or a read-only cache: compile as before
            pass
        _held_locks[self._path] = 1
        return self

    def __exit__(self, *exc_info):
        if self._path is None:
            return
        _held_locks[self._path] -= 1
        if _held_locks[self._path] == 0:
            del _held_locks[self._path]
            if self._fd is not None:
                os.close(self._fd)  # releases the lock


class _rare_full_collections:
    """While this package compiles a kernel (the outermost compile, if they nest): Python's
    cyclic garbage collector looks at all objects (its oldest generation) far less often.
    Numba makes hundreds of thousands of objects while compiling, and those full collections
    went over them and over all of Numba's modules again and again: compiling `learn_merges`
    and the GPT-2 encode kernel in one process spent 1.1-1.3 s of 15-18 s in the collector,
    0.32-0.36 s with full collections this rare (peak RSS 310 MB against 276 MB). Young
    objects are collected as usual, and the thresholds are put back after."""

    _depth = 0  # compiles hold Numba's global lock: one thread at a time changes this
    _saved = None

    def __enter__(self):
        import gc

        cls = _rare_full_collections
        if cls._depth == 0:
            cls._saved = gc.get_threshold()
            young, middle, old = cls._saved
            gc.set_threshold(young, middle, max(old, _FULL_COLLECTION_EVERY))
        cls._depth += 1
        return self

    def __exit__(self, *exc_info):
        import gc

        cls = _rare_full_collections
        cls._depth -= 1
        if cls._depth == 0:
            gc.set_threshold(*cls._saved)


# Collections of the middle generation between two of the oldest while compiling (Python's
# default: 10). 1000 left none in the measurement above.
_FULL_COLLECTION_EVERY = 1000


def _compile_one_process_at_a_time() -> None:
    try:
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.dispatcher import Dispatcher
    except ImportError:
        return
    numba_compile = Dispatcher.compile
    if getattr(numba_compile, "nbbpe_locks", False):
        return

    def compile(self, sig):
        path = _lock_path(self)
        if path is None:
            return numba_compile(self, sig)
        # Numba's own lock first: this process's threads compile one at a time anyway, and so
        # `_held_locks` is only touched by one of them.
        with global_compiler_lock, _compile_lock(path), _extensions_wait(), \
                _rare_full_collections():
            return numba_compile(self, sig)

    compile.nbbpe_locks = True
    Dispatcher.compile = compile


# --- other packages' Numba extensions wait for other code ---------------------------------------
#
# Before its first compile, or first load from the cache, Numba imports every installed
# package that registers a Numba extension (entry point `numba_extensions`): beside gigatoken,
# awkward, which took 0.27-0.45 s and 43 MB of RSS on a tokenizer's first encode (RSS after it
# 240 MB, against 197 MB). This package's kernels use no extension's types, so while they load
# or compile, this thread leaves the extensions unloaded; the next compile of any other code
# loads them, as Numba would have (its typing and lowering registries take up what they add
# whenever that is).

_loading_kernels = threading.local()  # this thread's depth of this package's compiles


class _extensions_wait:
    def __enter__(self):
        _loading_kernels.depth = getattr(_loading_kernels, "depth", 0) + 1
        return self

    def __exit__(self, *exc_info):
        _loading_kernels.depth -= 1


def _extensions_for_other_code_only() -> None:
    try:
        from numba.core import entrypoints
        from numba.core.dispatcher import Dispatcher

        init_all = entrypoints.init_all
        # The hook Numba calls on a first call with new argument types, before `compile`
        numba_hook = Dispatcher._compilation_chain_init_hook
    except (ImportError, AttributeError):  # another Numba's internals: extensions as it loads them
        return
    if getattr(init_all, "nbbpe_waits", False):
        return

    def init_all_unless_loading_kernels():  # Numba calls it as `entrypoints.init_all()`
        if not getattr(_loading_kernels, "depth", 0):
            init_all()

    def compilation_chain_init_hook(self):
        if _lock_path(self) is None:
            numba_hook(self)

    init_all_unless_loading_kernels.nbbpe_waits = True
    entrypoints.init_all = init_all_unless_loading_kernels
    Dispatcher._compilation_chain_init_hook = compilation_chain_init_hook


_compile_one_process_at_a_time()
_extensions_for_other_code_only()


# --- inlining without copying ----------------------------------------------------------------
#
# Numba inlines an `inline="always"` function by making its IR afresh (`run_untyped_passes`),
# then `inline_ir` deep-copies that IR twice before splicing it in: once to have a copy it may
# change, once to return an unchanged one, which the only caller of `inline_function` (the
# InlineInlinables pass) drops. The IR is made for this one call site, so neither copy is
# needed, and they were most of the time spent inlining `encode_documents` into an encode
# kernel. For this package's functions, `inline_function` here passes the fresh IR through
# with `deepcopy` made the identity for that call alone; all else (other callers of
# `inline_ir`, whose IR may be shared; other packages' functions) is as Numba does it.


def _numba_before(major: int, minor: int) -> bool:
    import numba

    try:
        return tuple(int(part) for part in numba.__version__.split(".")[:2]) < (major, minor)
    except ValueError:  # a development version: unknown
        return False


class _NoDeepCopy:
    """Stands in for the `copy` module in `numba.core.inline_closurecall` during one
    `inline_ir` call on IR made for it alone."""

    @staticmethod
    def deepcopy(value, memo=None):
        return value


def _inline_without_copies() -> None:
    try:
        import copy

        from numba.core import inline_closurecall
        from numba.core.inline_closurecall import InlineWorker
    except ImportError:
        return
    numba_inline_function = InlineWorker.inline_function
    if getattr(numba_inline_function, "nbbpe_no_copies", False):
        return
    if getattr(inline_closurecall, "copy", None) is not copy or not _numba_before(0, 70):
        return  # a Numba this was not checked against (0.68): inline as it does

    def inline_function(self, caller_ir, block, i, function, arg_typs=None):
        if not getattr(function, "__module__", "").startswith(__package__ + "."):
            return numba_inline_function(self, caller_ir, block, i, function, arg_typs)
        callee_ir = self.run_untyped_passes(function)  # made for this call site alone
        inline_closurecall.copy = _NoDeepCopy
        try:
            return self.inline_ir(caller_ir, block, i, callee_ir, function.__code__.co_freevars,
                                  arg_typs=arg_typs)
        finally:
            inline_closurecall.copy = copy

    inline_function.nbbpe_no_copies = True
    InlineWorker.inline_function = inline_function


_inline_without_copies()


def cached(dispatcher) -> bool:
    """Whether Numba's cache holds a compiled version of `dispatcher` for the current source
    (any signature). Unsure (e.g. another Numba's internals) counts as cached."""
    try:
        return bool(dispatcher._cache._cache_file._load_index())
    except Exception:
        return True


def cached_cfunc(py_func, signature):
    """`numba.cfunc(signature, cache=True)(py_func)`: compiled now, or loaded from the cache, as
    this package's other kernels are (other packages' Numba extensions left unloaded, Python's
    full collections rare; no lock file: a cfunc is small, and compiled in one place)."""
    from numba import cfunc
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock, _extensions_wait(), _rare_full_collections():
        return cfunc(signature, cache=True)(py_func)


def cfunc_cached(py_func) -> bool:
    """Whether Numba's cache holds `py_func` compiled as a `numba.cfunc` with `cache=True`, for
    the current source (`cached` for what the cfunc would be, before it is made: making it
    compiles it). Unsure counts as cached."""
    try:
        from numba.core.caching import FunctionCache

        return bool(FunctionCache(py_func)._cache_file._load_index())
    except Exception:
        return True


def announce_compiling() -> None:
    """Say once per process, on stderr, that kernels are being compiled (it takes seconds)."""
    if not _announced.is_set() and not os.environ.get("NBBPE_QUIET"):
        _announced.set()
        print("nbbpe: compiling kernels, first run only (cached afterwards)", file=sys.stderr,
              flush=True)


class compile_elsewhere:
    """`python -c <code>` in a child process that compiles kernels into the cache; `wait()`
    before using them. A no-op object if `needed` is false.

    The child imports from this process's `sys.path`: `python -c` would put the working
    directory first, and from a directory holding another copy of nbbpe (a checkout, with nbbpe
    installed elsewhere) it would compile that copy's kernels, into another cache, while this
    process compiled its own again."""

    def __init__(self, code: str, needed: bool = True):
        self._process = None
        if needed:
            announce_compiling()
            env = dict(os.environ, NBBPE_QUIET="1")
            try:
                # gc.freeze: the process ends next, and collecting the objects Numba made
                # while compiling would take ~0.2 s more of the wait for it.
                self._process = subprocess.Popen([sys.executable, "-c",
                                                  f"import sys\nsys.path[:] = {sys.path!r}\n"
                                                  f"{code}\nimport gc\ngc.freeze()"], env=env,
                                                 stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.DEVNULL)
            except OSError:  # no second process: compile here later
                self._process = None

    def running(self) -> bool:
        """Whether the child is still compiling (so this process would wait for it)."""
        return self._process is not None and self._process.poll() is None

    def wait(self) -> None:
        if self._process is not None:
            self._process.wait()
            self._process = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        if self._process is not None and exc_info[0] is not None:
            self._process.kill()  # the run failed: its kernels are not needed now
        self.wait()


def entry_point(dispatcher, args):
    """The machine code `dispatcher` has compiled for the types of `args`, callable without
    Numba's type dispatch, or `dispatcher` itself if there is none. Dispatch costs several
    microseconds per call when arguments are NamedTuples (7 of the 8 µs of a call to an encode
    kernel), which dominates encoding short texts one at a time. The entry point does not check
    its arguments: call it only with arguments of exactly the types of `args`."""
    try:
        return _compiled(dispatcher, args).entry_point
    except Exception:  # another Numba's internals: dispatch as usual
        return dispatcher


def native_address(dispatcher, args, signature) -> int | None:
    """Where the machine code `dispatcher` has compiled for the types of `args` starts, in
    Numba's own calling convention (the one a compiled caller uses), if it was compiled with
    `signature` (a `numba.core.typing.Signature`); else, or if this Numba does not say, None.
    A compiled function may call it there (`kernel_args.call_at`) without linking it in."""
    try:
        compiled = _compiled(dispatcher, args)
        if compiled.signature != signature:
            return None
        return compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name) or None
    except Exception:  # another Numba's internals: no such call
        return None


def _compiled(dispatcher, args):
    """What `dispatcher` has compiled for the types of `args` (Numba's internals: may raise)."""
    return dispatcher.overloads[argument_types(args)]


def argument_types(args) -> tuple:
    """The Numba types of `args` as a compiled function receives them (`numba.typeof`), but
    `bytes` typed directly: typeof finds the type of a `bytes` by a generic dispatch whose
    first use in a process walks the subclasses of every abstract base class it knows, which
    took 40-90 ms (more with more packages loaded) on the second text a tokenizer encoded."""
    from numba.core import types
    from numba.core.typing.typeof import Purpose, typeof

    return tuple(types.Bytes(types.uint8, 1, "C", readonly=True) if type(arg) is bytes
                 else typeof(arg, Purpose.argument) for arg in args)
