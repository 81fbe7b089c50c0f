"""Decoding long lists and arrays by the compiled call (`nbbpe/decoding.py`), against its slow
twin: each id's bytes from the vocab, joined."""

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbbpe import kernel_args
from nbbpe import tokenizer as tokenizer_module


@pytest.fixture(autouse=True)
def compiled_from_one_id(monkeypatch):
    """The compiled call takes any number of ids here (4,096 and more otherwise)."""
    monkeypatch.setattr(tokenizer_module, "_DECODE_COMPILED_FROM", 1)
    monkeypatch.setattr(tokenizer_module, "_DECODE_BY_LOOKUP_UP_TO", 0)


def joined(tok, ids):
    return b"".join(tok.vocab[int(i)] for i in ids)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 50256), max_size=400),
       st.sampled_from([None, np.uint16, np.int32, np.uint32, np.int64]))
def test_compiled_decode_is_the_vocabs_bytes_joined(gpt2, ids, dtype):
    given_ids = ids if dtype is None else np.array(ids, dtype=dtype)
    assert gpt2.decode_bytes(given_ids) == joined(gpt2, ids)
    assert not ids or gpt2._decode_call not in (None, False)  # it was the compiled call's


def test_compiled_decode_of_real_text_and_of_views(gpt2):
    text = (open(__file__, encoding="utf-8").read() + " 日本語 😀 ") * 5
    ids = gpt2.encode(text)
    assert gpt2.decode(ids) == text
    array = np.repeat(np.array(ids, dtype=np.int64), 2)
    assert gpt2.decode(array[::2]) == text  # not contiguous: copied first
    refcounts = [sys.getrefcount(i) for i in ids[:50] if i > 256]
    for _ in range(20):
        gpt2.decode_bytes(ids)
    assert [sys.getrefcount(i) for i in ids[:50] if i > 256] == refcounts


def test_compiled_decode_leaves_what_it_cannot_take_to_the_gather(gpt2):
    # (which names the problem as before, or decodes what it took before)
    good = gpt2.encode("Hello world, " * 20)
    for bad, error, where in ((good + [50257], ValueError, f"id 50257 at position {len(good)}"),
                              ([5, -1] + good, ValueError, "id -1 at position 1"),
                              (good + [1.5], TypeError, "integer ids"),
                              (good + ["a"], TypeError, "integer ids"),
                              (np.array(good + [2 ** 63 + 5], dtype=np.uint64), ValueError,
                               "is not in the vocab")):
        with pytest.raises(error, match=where):
            gpt2.decode(bad)
    with pytest.raises(TypeError, match="integer ids"):
        gpt2.decode([True, False] * 50)  # bools only: NumPy's bool array
    assert gpt2.decode([True] + good) == gpt2.decode([1] + good)  # NumPy's: an int array
    assert gpt2.decode(np.array(good, dtype=np.uint64)) == gpt2.decode(good)


def test_compiled_decode_refuses_the_ids_a_vocab_leaves_out(gpt2_files):
    from nbbpe import Tokenizer

    vocab, merges = gpt2_files
    gappy = Tokenizer({**vocab, 50300: b"<gap>"}, merges)
    ids = gappy.encode("Hello world " * 30)
    assert gappy.decode(ids + [50300]) == "Hello world " * 30 + "<gap>"
    with pytest.raises(ValueError, match=f"id 50280 at position {len(ids)} is not in the vocab"):
        gappy.decode(ids + [50280])


def test_without_the_compiled_call_decode_takes_the_gather(gpt2_files, monkeypatch):
    from nbbpe import Tokenizer

    monkeypatch.setattr(kernel_args, "object_layout_known", lambda: False)
    tok = Tokenizer(*gpt2_files)
    ids = tok.encode("Hello world " * 30)
    assert tok.decode(ids) == "Hello world " * 30 and tok._decode_call is False


def test_once_loaded_the_compiled_call_decodes_every_list_past_the_lookups(gpt2_files,
                                                                          monkeypatch):
    # `decode_batch` loads it for a batch of 4,096 ids or more in all (not for one sequence of
    # a few hundred, which is not worth loading it), and then each sequence of more than 128
    # ids takes it
    from nbbpe import Tokenizer

    monkeypatch.setattr(tokenizer_module, "_DECODE_COMPILED_FROM", 4096)
    monkeypatch.setattr(tokenizer_module, "_DECODE_BY_LOOKUP_UP_TO", 128)
    tok = Tokenizer(*gpt2_files)
    texts = [f"Once upon a time, {k} small dogs ran to the park." * 10 for k in range(40)]
    batch = tok.encode_batch(texts)
    assert all(128 < len(ids) < 4096 for ids in batch)
    assert tok.decode(batch[0]) == texts[0] and tok._decode_call is None
    calls = []
    assert tok.decode_batch(iter(batch[:2])) == texts[:2] and tok._decode_call is None
    assert sum(map(len, batch)) >= 4096
    real = tok._decode_compiled
    monkeypatch.setattr(tok, "_decode_compiled", lambda ids: calls.append(len(ids)) or real(ids))
    assert tok.decode_batch(iter(batch)) == texts
    assert calls == [0] + [len(ids) for ids in batch]


def test_decode_batch_takes_any_iterables_and_a_scalar_array_is_refused_as_before(gpt2_files):
    from nbbpe import Tokenizer

    tok = Tokenizer(*gpt2_files)  # its compiled decode not loaded yet
    ids = tok.encode("Hello world " * 30)
    batch = [iter(ids), ids, tuple(ids), (i for i in ids)]
    assert tok.decode_batch(batch) == ["Hello world " * 30] * 4
    for scalar in (np.array(5),):
        with pytest.raises(TypeError, match="flat sequence of integer ids"):
            tok.decode(scalar)
