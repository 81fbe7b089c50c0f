"""Lists of ids made by compiled code from the process's ints (`nbbpe.id_lists`), against their
slow twin: `ids.tolist()` sliced at the offsets."""

import gc
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbbpe import kernel_args
from nbbpe import id_lists as lists_module
from nbbpe.id_lists import id_lists, int_objects

N_IDS = 1000


@pytest.fixture(autouse=True)
def compiled_from_one_id(monkeypatch):
    """The compiled call takes lists of any number of ids here (`COMPILED_FROM`: 1,024 and more
    otherwise; its own test sets it back)."""
    monkeypatch.setattr(lists_module, "COMPILED_FROM", 1)


def sliced(ids, offsets):
    flat = np.asarray(ids).tolist()
    return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, N_IDS - 1), max_size=40), max_size=30),
       st.sampled_from([np.int32, np.int64, np.uint16]))
def test_id_lists_are_the_ids_sliced_at_the_offsets(texts, dtype):
    ids = np.array([i for text in texts for i in text], dtype=dtype)
    offsets = np.cumsum([0] + [len(text) for text in texts])
    made = id_lists(ids, offsets, N_IDS)
    assert made == sliced(ids, offsets) == texts
    assert all(type(i) is int for text in made for i in text)


def test_id_lists_hold_the_processs_ints_one_more_reference_each():
    ints = int_objects(N_IDS)
    assert ints == list(range(N_IDS)) and int_objects(N_IDS) is ints
    ids = np.array([5, 300, 300, 999, 300, 5, 998], dtype=np.int32)
    # (ints up to 256 are CPython's own, immortal from Python 3.12 on: their count stays put)
    before = [sys.getrefcount(ints[i]) for i in (300, 998, 999)]
    made = id_lists(ids, [0, 2, 2, 7], N_IDS)
    assert made == [[5, 300], [], [300, 999, 300, 5, 998]]
    assert all(i is ints[i] for text in made for i in text)
    assert [sys.getrefcount(ints[i]) for i in (300, 998, 999)] == [before[0] + 3, before[1] + 1,
                                                                   before[2] + 1]
    assert all(gc.is_tracked(text) for text in made) and gc.is_tracked(made)
    del made
    assert [sys.getrefcount(ints[i]) for i in (300, 998, 999)] == before


@pytest.mark.parametrize("ids, offsets", [
    ([1, 2, N_IDS], [0, 3]),  # an id past the tokenizer's
    ([1, -2, 3], [0, 3]),
    ([1, (1 << 32) + 2, 3], [0, 3]),  # an id that int32 would wrap into the tokenizer's
    ([1, 2, 3], [0, 2, 1, 3]),  # offsets going back
    ([1, 2, 3], [0, 2]),  # not ending at the last id
    ([1, 2, 3], [1, 3]),
])
def test_ids_or_offsets_the_compiled_call_cannot_take_are_sliced_as_they_are(ids, offsets):
    ids = np.array(ids, dtype=np.int64)
    assert id_lists(ids, offsets, N_IDS) == sliced(ids, offsets)


def test_without_the_compiled_call_the_ids_are_sliced(monkeypatch):
    monkeypatch.setattr(kernel_args, "object_layout_known", lambda: False)
    lists_module._lists_call.cache_clear()
    try:
        assert lists_module._lists_call(N_IDS) is None
        assert id_lists(np.array([3, 4, 5]), [0, 1, 3], N_IDS) == [[3], [4, 5]]
    finally:
        monkeypatch.undo()
        lists_module._lists_call.cache_clear()
    assert lists_module._lists_call(N_IDS) is not None


def test_fewer_ids_than_compiled_from_do_not_load_the_compiled_call(monkeypatch):
    monkeypatch.setattr(lists_module, "COMPILED_FROM", 1 << 10)
    monkeypatch.setattr(lists_module, "_lists_call", lambda n_ids: pytest.fail("loaded"))
    ids = np.arange(1023) % N_IDS
    assert id_lists(ids, [0, 1000, 1023], N_IDS) == sliced(ids, [0, 1000, 1023])
    with pytest.raises(pytest.fail.Exception, match="loaded"):
        id_lists(np.arange(1024) % N_IDS, [0, 1024], N_IDS)


def test_encode_batch_and_a_long_encode_give_lists_of_the_processs_ints(gpt2):
    texts = ["Hello world " * 50, "", "SolidGoldMagikarp <|endoftext|> again"]
    batch = gpt2.encode_batch(texts)
    assert batch == [gpt2.encode_to_numpy(text).tolist() for text in texts]
    ints = int_objects(gpt2.n_vocab)
    assert all(i is ints[i] for ids in batch for i in ids)
    long_text = "Hello world, " * 200_000  # more than encode takes in one group
    ids = gpt2.encode(long_text)
    assert ids == gpt2.encode_to_numpy(long_text).tolist() and ids[-1] is ints[ids[-1]]
