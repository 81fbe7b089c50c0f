"""A tokenizer's own calls: once the short path is ready, `tok.encode` and `tok.encode_to_numpy`
are compiled calls of it for the thread that readied it (`Tokenizer._make_own_calls`,
`encode._short_path`), which hand every other call to the methods. Each is checked against
tiktoken and against the methods themselves (the class's functions, called explicitly)."""

import copy
import gc
import inspect
import pickle
import sys
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from tiktoken.load import load_tiktoken_bpe

from nbbpe import CL100K_PATTERN, GPT2_PATTERN, Tokenizer
from nbbpe import encode
from nbbpe.id_lists import int_objects
from reference_encode import read_gpt2_vocab

FIXTURES = Path(__file__).parent / "fixtures"
EOT = "<|endoftext|>"


def read(name):
    return (FIXTURES / name).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def tiktoken_gpt2():
    """tiktoken's gpt2 encoding built from the fixture vocab file, not downloaded."""
    ranks = read_gpt2_vocab(FIXTURES / "gpt2_vocab.json")
    ranks.pop(EOT.encode())
    return tiktoken.Encoding(name="gpt2-offline", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: 50256})


def ready(tokenizer):
    """`tokenizer` after three texts: the first or second readies the short path (the second
    if `_short_path` is not in Numba's cache yet), the next one takes it and makes the own
    calls."""
    for text in ("a first text", "a second", "a third: the short path is ready"):
        tokenizer.encode(text)
    return tokenizer


@pytest.fixture
def tok(gpt2_files):
    return ready(Tokenizer(*gpt2_files, [EOT]))


def is_own_call(method) -> bool:
    return type(method).__name__ == "builtin_function_or_method"


TEXTS = ["Hi!", "", " ", "Hello you", "héllo wörld 😀", "日本語のテキストです。", "a\ud800b",
         f"a{EOT}b", "x" * 3000 + " end", "y" * (encode.RELEASE_GIL_FROM + 1),
         read("web_sample.txt")[:5000], read("multi_sample.txt")[:4000]]


def expected(tiktoken_gpt2, text):
    text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")  # a lone surrogate
    text = text.replace("\ufffd\ufffd\ufffd", "\ufffd")  # is one U+FFFD, as nbbpe makes it
    return tiktoken_gpt2.encode(text, allowed_special="all")


def test_own_calls_are_made_by_the_short_paths_first_text_and_give_the_methods_ids(
        gpt2_files, tiktoken_gpt2):
    tokenizer = Tokenizer(*gpt2_files, [EOT])
    assert not is_own_call(tokenizer.encode)
    ready(tokenizer)
    assert is_own_call(tokenizer.encode) and is_own_call(tokenizer.encode_to_numpy)
    texts = TEXTS + [read("web_sample.txt") * 20]  # longer than the short path takes
    assert len(texts[-1].encode()) > tokenizer._thread_state().text_room
    for text in texts:
        ids = expected(tiktoken_gpt2, text)
        assert tokenizer.encode(text) == Tokenizer.encode(tokenizer, text) == ids
        array = tokenizer.encode_to_numpy(text)
        assert array.dtype == np.uint16 and array.tolist() == ids and array.base is None
        for dtype in (np.uint32, np.int64, "int32"):  # handed to the method
            assert tokenizer.encode_to_numpy(text, dtype).dtype == np.dtype(dtype)
            assert tokenizer.encode_to_numpy(text, dtype=dtype).tolist() == ids
    assert tokenizer.encode_to_numpy("Hi", None).dtype == np.uint16


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_own_calls_on_any_text(gpt2, tiktoken_gpt2, text):
    ready(gpt2)
    assert is_own_call(gpt2.encode)
    assert gpt2.encode(text) == Tokenizer.encode(gpt2, text) == expected(tiktoken_gpt2, text)
    assert gpt2.encode_to_numpy(text).tolist() == gpt2.encode(text)


def test_own_calls_refuse_what_the_methods_refuse(tok):
    assert is_own_call(tok.encode)
    for bad in (b"bytes", 3, None, bytearray(b"ab")):
        for method in (tok.encode, tok.encode_to_numpy):
            with pytest.raises(TypeError, match="expects a str"):
                method(bad)
    with pytest.raises(TypeError):
        tok.encode("a", "b")
    assert tok.encode(text="Hi") == tok.encode_to_numpy(text="Hi").tolist() == tok.encode("Hi")
    with pytest.raises(TypeError, match="dtype"):
        tok.encode_to_numpy("a", np.float32)
    assert tok.encode(np.str_("Hi")) == tok.encode("Hi")  # a str subclass: the method's


def test_a_list_of_ids_holds_the_processs_ints_one_more_reference_each(tok, tiktoken_gpt2):
    # the short path makes a list of the ints of `id_lists.int_objects` (ids above 256 would be
    # new objects each time): each one reference more while the list lives, none after
    ints = int_objects(tok.n_vocab)
    text = "Hi! SolidGoldMagikarp " * 20 + EOT
    expected = tiktoken_gpt2.encode(text, allowed_special="all")
    assert max(expected) == 50256
    # (ints up to 256 are CPython's own, immortal from Python 3.12 on: their count stays put)
    before = {i: sys.getrefcount(ints[i]) for i in set(expected) if i > 256}
    for encode_list in (tok.encode, tok._thread_state().text_call):  # own call, thread's call
        own = encode_list is tok.encode
        ids = encode_list(text) if own else encode_list(text, encode.TEXT_LIST)
        assert ids == expected and all(a is ints[a] for a in ids)
        assert {i: sys.getrefcount(ints[i]) - ids.count(i) for i in before} == before
        del ids
        assert {i: sys.getrefcount(ints[i]) for i in before} == before


def test_own_calls_read_as_the_methods(tok):
    assert str(inspect.signature(tok.encode)) == "(text)"
    assert str(inspect.signature(tok.encode_to_numpy)) == "(text, dtype=None)"
    assert tok.encode.__name__ == "encode" and tok.encode.__doc__ == Tokenizer.encode.__doc__
    assert tok.encode_to_numpy.__doc__ == Tokenizer.encode_to_numpy.__doc__


def test_an_own_call_from_another_thread_is_the_methods(tok, tiktoken_gpt2):
    # it is bound to its thread's state: another thread's text goes through the method, which
    # uses that thread's own state (made there, so the test can tell)
    own = tok.encode, tok.encode_to_numpy
    seen = []

    def other_thread():
        seen.append(hasattr(tok._threads, "state"))
        seen.append((own[0]("Hello there"), own[1]("Hello there").tolist()))
        seen.append(hasattr(tok._threads, "state"))

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    ids = tiktoken_gpt2.encode("Hello there")
    assert seen == [False, (ids, ids), True]


def test_own_calls_follow_their_threads_short_path_as_it_changes(gpt2_files, tiktoken_gpt2):
    # the cache starts again, the short path is packed again: an own call kept from before
    # reads what the thread's state holds now, or hands the text to the method while it has
    # nothing ready
    tok = ready(Tokenizer(*gpt2_files, [EOT], cache_size=40))
    encode_list, encode_array = tok.encode, tok.encode_to_numpy
    state = tok._thread_state()
    state.set_text_call(None)
    assert state.own_entries and all(entry[encode.OWN_VALUES] == 0 for entry in state.own_entries)
    assert encode_list("while nothing is ready") == tiktoken_gpt2.encode("while nothing is ready")
    assert state.text_call is not None  # the method's long way readied it again
    values = state.text_args.values
    assert all(entry[encode.OWN_VALUES] == values.ctypes.data for entry in state.own_entries)
    web = read("web_sample.txt")
    for k in range(40):  # new pre-tokens until the cache fills and starts again
        text = web[k * 997 : k * 997 + 2000] + f" {k}x{k * 7919}"
        assert encode_array(text).tolist() == tiktoken_gpt2.encode(text, allowed_special="all")
    assert state.cache.table.fill[2] > 0  # it started again
    assert state.text_args.values is not values  # and the short path was packed again
    assert encode_list("Hello again") == tiktoken_gpt2.encode("Hello again")


def test_own_calls_are_not_made_for_methods_overridden_or_replaced(gpt2_files, monkeypatch):
    class Lower(Tokenizer):
        def encode(self, text):
            return super().encode(text.lower())

    lower = ready(Lower(*gpt2_files, [EOT]))
    assert not is_own_call(lower.encode) and not is_own_call(lower.encode_to_numpy)
    assert lower.encode("HI") == lower.encode_to_numpy("hi").tolist()
    calls = []
    original = Tokenizer.encode_to_numpy
    monkeypatch.setattr(Tokenizer, "encode_to_numpy", lambda self, text, dtype=None: (
        calls.append(text) or original(self, text, dtype)))
    patched = ready(Tokenizer(*gpt2_files, [EOT]))
    patched.encode_to_numpy("Hi")
    assert calls == ["Hi"] and not is_own_call(patched.encode)


def test_a_tokenizer_with_own_calls_pickles_copies_and_is_collected(gpt2_files, tiktoken_gpt2):
    tok = ready(Tokenizer(*gpt2_files, [EOT]))
    for other in (pickle.loads(pickle.dumps(tok)), copy.copy(tok), copy.deepcopy(tok)):
        assert not is_own_call(other.encode)  # until its own second text
        assert ready(other).encode("Hi you") == tiktoken_gpt2.encode("Hi you")
        assert is_own_call(other.encode)
    # each own call holds its tokenizer (a bound method does), in a cycle the collector frees
    kept = tok.encode_to_numpy
    held = weakref.ref(tok)
    del tok
    gc.collect()
    assert held() is not None
    assert kept("Hi").tolist() == tiktoken_gpt2.encode("Hi")
    del kept
    gc.collect()
    assert held() is None


def test_own_calls_give_uint32_arrays_past_65536_ids():
    path = FIXTURES / "cl100k_base.tiktoken"
    specials = {"<|endoftext|>": 100257}
    ours = ready(Tokenizer.from_tiktoken_file(path, CL100K_PATTERN, specials))
    theirs = tiktoken.Encoding("cl100k", pat_str=CL100K_PATTERN,
                               mergeable_ranks=load_tiktoken_bpe(str(path)),
                               special_tokens=specials)
    assert is_own_call(ours.encode_to_numpy)
    for text in TEXTS[:8]:
        ids = ours.encode_to_numpy(text)
        assert ids.dtype == np.uint32
        assert ids.tolist() == ours.encode(text) == Tokenizer.encode(ours, text)
    assert ours.encode("Hello wörld") == theirs.encode_ordinary("Hello wörld")
