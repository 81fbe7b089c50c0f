"""Which cached kernels are current: every kernel is keyed on the sources of all the modules that
import Numba, not only its own file (`kernel_cache.kernel_sources_digest`), so a change to a
helper it calls or inlines from another module is never loaded stale."""

import importlib
import shutil

from numba.core.dispatcher import Dispatcher

from nbbpe import kernel_cache
from nbbpe.kernel_cache import kernel_sources_digest

KERNEL_MODULES = ["nbbpe.encode", "nbbpe.encode_tables", "nbbpe.merge", "nbbpe.pretokenize_kernels",
                  "nbbpe.scanners.classes", "nbbpe.scanners.gpt2", "nbbpe.scanners.cl100k",
                  "nbbpe.scanners.o200k", "nbbpe.scanners.specials"]


def test_every_cached_kernel_is_keyed_on_all_kernel_sources():
    digest = kernel_sources_digest()
    checked = 0
    for name in KERNEL_MODULES:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if not isinstance(value, Dispatcher) or value.__module__ != name:
                continue
            impl = getattr(value._cache, "_impl", None)
            if impl is None:  # not cache=True (inline helpers)
                continue
            assert isinstance(impl.locator, kernel_cache._PackageKeyedLocator), value
            assert impl.locator.get_source_stamp() == digest
            checked += 1
    assert checked > 40  # the kernels of every stage


def test_the_digest_follows_every_module_importing_numba_and_nothing_else(tmp_path):
    package = tmp_path / "nbbpe"
    shutil.copytree(kernel_cache._PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    before = kernel_sources_digest(str(package))
    assert before == kernel_sources_digest()  # the same sources, wherever they are

    def changed(path, text):
        original = path.read_text()
        path.write_text(original + text)
        try:
            return kernel_sources_digest(str(package)) != before
        finally:
            path.write_text(original)

    assert changed(package / "encode_tables.py", "\n# a helper the encode kernels inline\n")
    assert changed(package / "scanners" / "classes.py", "\nX = 1\n")
    assert not changed(package / "cli.py", "\n# no kernel here\n")
    assert not changed(package / "tokenizer.py", "\n# nor here\n")
    assert changed(package / "tokenizer.py", "\nfrom numba import njit\n")  # now it would be one


def test_each_kernel_module_keys_its_kernels_when_imported_first():
    # the keying is installed by importing kernel_cache, which each kernel module does before it
    # defines its kernels: whichever of them a process imports first
    import subprocess
    import sys

    check = ("import importlib, sys; from numba.core.dispatcher import Dispatcher; "
             "m = importlib.import_module(sys.argv[1]); "
             "kernels = [v for v in vars(m).values() if isinstance(v, Dispatcher) "
             "and getattr(v._cache, '_impl', None) is not None]; "
             "assert kernels and all(type(v._cache._impl.locator).__name__ == "
             "'_PackageKeyedLocator' for v in kernels), sys.argv[1]")
    for name in KERNEL_MODULES:
        result = subprocess.run([sys.executable, "-c", check, name], capture_output=True, text=True)
        assert result.returncode == 0, (name, result.stderr[-500:])


HOLDER = """
import sys, time
import numpy as np
from nbbpe import kernel_cache, merge
with kernel_cache._compile_lock(kernel_cache._lock_path(merge.grow)):
    print("locked", flush=True)
    sys.stdin.readline()  # the other process is about to call grow
    time.sleep(0.5)  # and is waiting (or, without the lock, compiling)
    merge.grow(np.zeros(1, np.int16), 2)
print("compiled", flush=True)
"""
USER = """
import numpy as np
from nbbpe import merge
print("calling", flush=True)
merge.grow(np.zeros(1, np.int16), 2)
print(sum(merge.grow._cache_hits.values()), sum(merge.grow._cache_misses.values()), flush=True)
"""


def test_a_kernel_another_process_is_compiling_is_waited_for_and_loaded(tmp_path):
    # Two processes of a first run needing the same kernel: the second waits on the first's
    # compile and loads it from the cache, instead of compiling it again.
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))  # empty: no kernel compiled yet
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "locked"
    user = subprocess.Popen([sys.executable, "-c", USER], env=env, text=True,
                            stdout=subprocess.PIPE)
    assert user.stdout.readline().strip() == "calling"
    holder.stdin.write("go\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "compiled"
    hits, misses = map(int, user.stdout.readline().split())
    assert (hits, misses) == (1, 0)  # loaded, not compiled
    assert holder.wait(timeout=60) == 0 and user.wait(timeout=60) == 0


def test_the_compiling_child_imports_the_nbbpe_of_this_process(tmp_path, monkeypatch):
    # From a directory holding another copy of nbbpe, `python -c` alone would import that copy
    # and compile its kernels, which this process would then compile again.
    import nbbpe

    (tmp_path / "nbbpe").mkdir()
    (tmp_path / "nbbpe" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    imported = tmp_path / "imported.txt"
    kernel_cache.compile_elsewhere(
        f"import nbbpe\nopen({str(imported)!r}, 'w').write(nbbpe.__file__)").wait()
    assert imported.read_text() == nbbpe.__file__


def _inline_probe(module: str):
    """A kernel calling an `inline="always"` helper whose `__module__` is `module`, both new
    (so compiled, and the helper inlined, in this test)."""
    from numba import njit

    def double_plus(x):
        y = x
        for _ in range(2):
            y = y + x
        return y

    double_plus.__module__ = module
    helper = njit(inline="always")(double_plus)

    @njit
    def kernel(x):
        return helper(x) + helper(x + 1)

    return kernel


def test_this_packages_inline_functions_are_inlined_without_copying_their_ir(monkeypatch):
    from numba.core import inline_closurecall

    assert getattr(inline_closurecall.InlineWorker.inline_function, "nbbpe_no_copies", False)
    passed_through = []
    real = kernel_cache._NoDeepCopy.deepcopy
    monkeypatch.setattr(kernel_cache._NoDeepCopy, "deepcopy",
                        staticmethod(lambda value, memo=None: passed_through.append(1) or real(value)))
    assert _inline_probe("nbbpe.probe")(5) == 15 + 18  # inlined, right
    # each block of the helper's IR, twice, at each of the two call sites: not copied
    assert len(passed_through) >= 4 and len(passed_through) % 4 == 0
    assert inline_closurecall.copy is __import__("copy")  # Numba's module as it was


def test_other_packages_inline_functions_are_inlined_as_numba_does(monkeypatch):
    from numba.core import inline_closurecall

    passed_through = []
    monkeypatch.setattr(kernel_cache._NoDeepCopy, "deepcopy",
                        staticmethod(lambda value, memo=None: passed_through.append(1) or value))
    assert _inline_probe("userpackage.helpers")(5) == 33
    assert passed_through == []  # copied by Numba, as always
    assert inline_closurecall.copy is __import__("copy")


def test_full_collections_are_rare_while_compiling_and_as_before_after():
    import gc

    before = gc.get_threshold()
    with kernel_cache._rare_full_collections():
        young, middle, old = gc.get_threshold()
        assert (young, middle) == before[:2] and old >= kernel_cache._FULL_COLLECTION_EVERY
        with kernel_cache._rare_full_collections():  # a nested compile: no change
            assert gc.get_threshold() == (young, middle, old)
        assert gc.get_threshold() == (young, middle, old)
    assert gc.get_threshold() == before
    try:
        with kernel_cache._rare_full_collections():
            raise ValueError("a compile that failed")
    except ValueError:
        pass
    assert gc.get_threshold() == before


def test_argument_types_are_numbas_own_bytes_included():
    # bytes are typed without numba.typeof's generic dispatch (slow on its first use), to the
    # very type typeof gives: else the short path's entry point would not be found
    import numba
    import numpy as np

    from nbbpe.kernel_cache import argument_types

    args = (b"", b"some text", np.zeros(3, np.int64), np.zeros(2, np.uint8)[::2], -1, 7)
    assert argument_types(args) == tuple(numba.typeof(arg) for arg in args)
    assert argument_types(args)[0] == argument_types((bytes(10),))[0]


def test_the_short_path_is_ready_after_the_second_text():
    # its entry point is found for the types of (bytes, packed values, address) when the second
    # text is encoded; the third takes it, and gives the ids of the long way
    from pathlib import Path

    import nbbpe

    fixtures = Path(__file__).parent / "fixtures"
    tok = nbbpe.Tokenizer.from_files(fixtures / "gpt2_vocab.json", fixtures / "gpt2_merges.txt")
    assert tok.encode("hello world") == tok.encode("hello world") == [31373, 995]
    assert tok._thread_state().text_call is not None
    assert tok.encode("hello world") == [31373, 995]


def test_running_says_whether_the_other_process_still_compiles():
    elsewhere = kernel_cache.compile_elsewhere("import time; time.sleep(0.5)")
    assert elsewhere.running()
    elsewhere.wait()
    assert not elsewhere.running()
    assert not kernel_cache.compile_elsewhere("pass", needed=False).running()


def test_the_utf8_check_compiled_ahead_is_the_one_text_files_are_checked_with(tmp_path):
    # `nbbpe encode`'s first run compiles it while waiting for the other process: for the very
    # argument types a file's batches have, or they would compile it again afterwards
    from nbbpe.corpus import check_utf8, compile_utf8_check
    from nbbpe.scanners.classes import first_invalid_utf8
    from nbbpe.sources import plan_units, read_unit, resolve_source

    compile_utf8_check()
    compiled = set(first_invalid_utf8.signatures)
    path = tmp_path / "text.txt"
    path.write_bytes("some text, café\n".encode() * 100)
    batches = [batch for unit in plan_units(resolve_source(str(path)), chunk_bytes=256)
               for batch in read_unit(unit, chunk_bytes=256)]
    assert len(batches) > 1
    for batch in batches:
        check_utf8(batch.data, "strict", batch.place, batch.doc_ends)
    assert set(first_invalid_utf8.signatures) == compiled


def test_the_table_entry_compiled_ahead_is_the_one_encoding_calls(gpt2_files):
    # `nbbpe encode`'s first run compiles `enter_table_of` and `leave_table_of` while waiting
    # for the other process: for the very argument types a tokenizer's kernel calls have, or
    # they would compile again afterwards
    from nbbpe import Tokenizer
    from nbbpe.encode import compile_table_entry, enter_table_of, leave_table_of

    tokenizer = Tokenizer(*gpt2_files, ["<|endoftext|>"])
    compile_table_entry(tokenizer._get_engine().cache.table)
    compiled = (set(enter_table_of.signatures), set(leave_table_of.signatures))
    assert all(compiled)
    text = "Hello world, once more. " * 50
    ids = tokenizer.encode_batch_to_numpy([text] * 8, num_threads=2)[0]
    assert len(ids) == 8 * len(tokenizer.encode(text))
    tokenizer.encode_to_numpy(text + "<|endoftext|>")
    assert (set(enter_table_of.signatures), set(leave_table_of.signatures)) == compiled


def test_other_packages_numba_extensions_wait_for_other_code(tmp_path):
    # An installed package registering a Numba extension (awkward does: 43 MB and ~0.3 s) is
    # not imported while this package's kernels load; the next compile of other code loads it.
    import os
    import subprocess
    import sys

    (tmp_path / "probe_extension.py").write_text(
        "import os\n"
        "def init():\n"
        "    open(os.environ['PROBE_LOG'], 'a').write('init\\n')\n")
    info = tmp_path / "probe_extension-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: probe-extension\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[numba_extensions]\ninit = probe_extension:init\n")
    log = tmp_path / "log.txt"
    code = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from nbbpe import Tokenizer\n"
        "vocab = {i: bytes([i]) for i in range(256)} | {256: b'ab', 257: b'abc'}\n"
        "tok = Tokenizer(vocab, [(b'a', b'b'), (b'ab', b'c')])\n"
        "log = lambda what: open(os.environ['PROBE_LOG'], 'a').write(what + '\\n')\n"
        "for text in ['abc abd', 'x abc', 'ab ab']:\n"
        "    tok.encode(text)\n"
        "tok.encode_batch(['abc', 'ab c'] * 4, num_threads=2)\n"
        "log('encoded ' + str('probe_extension' in sys.modules))\n"
        "import numba\n"
        "numba.njit(lambda x: x + 1)(1)\n"
        "log('compiled ' + str('probe_extension' in sys.modules))\n")
    env = dict(os.environ, PROBE_LOG=str(log))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    assert log.read_text().splitlines() == ["encoded False", "init", "compiled True"]
