"""Encoding: ids against tiktoken (GPT-2 files, built offline) and the slow reference twin,
streaming against whole-text encoding, special tokens, decoding, and bad input."""

import gc
import io
import itertools
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import regex
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from nbbpe import CL100K_PATTERN, GPT2_PATTERN, O200K_PATTERN, Tokenizer, train_bpe
from nbbpe import encode
from nbbpe.encode import CACHE_AT, OUT_AT
from nbbpe.encode_tables import entries_in
from nbbpe.kernel_args import address
from reference_encode import ReferenceEncoder, read_gpt2_vocab

FIXTURES = Path(__file__).parent / "fixtures"
EOT = "<|endoftext|>"
FIXTURE_TEXTS = ["address.txt", "german.txt", "tinystories_sample.txt", "corpus.en",
                 "multi_sample.txt", "web_sample.txt"]


def read(name):
    return (FIXTURES / name).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def gpt2_small_blocks(gpt2_files):
    """Cuts text every few characters, so block and stream cutting is exercised everywhere."""
    return Tokenizer(*gpt2_files, [EOT], block_chars=8, cache_size=64)


def offline_tiktoken(pattern=GPT2_PATTERN, name="gpt2-offline"):
    """tiktoken's gpt2 encoding built from the fixture vocab file, not downloaded."""
    ranks = read_gpt2_vocab(FIXTURES / "gpt2_vocab.json")
    ranks.pop(EOT.encode())
    return tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens={EOT: 50256})


@pytest.fixture(scope="module")
def tiktoken_gpt2():
    return offline_tiktoken()


@pytest.fixture(scope="module")
def reference_gpt2(gpt2_files):
    return ReferenceEncoder(*gpt2_files, [EOT])


# --- text strategies ----------------------------------------------------------------------

WHITESPACE = ("\t\n\x0b\x0c\r \x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
              "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\u200b\u180e\ufeff")
COMBINING = "\u0301\u0308\u0323\u0338\u20dd\u0e31\u093f\u05b7\u3099"
EMOJI = ["😀", "👍🏽", "👩‍👩‍👧", "🇺🇸", "❤️", "🏳️‍🌈", "🧑‍💻", "🤵🏾‍♂️", "\U0001FAE8", "#️⃣"]
CJK = "中文字漢字日本語のひらがなカタカナ한국어조선말，。「」"
pieces = st.one_of(
    st.text(max_size=6),
    st.text(alphabet=WHITESPACE, min_size=1, max_size=6),
    st.sampled_from(EMOJI),
    st.text(alphabet="aeioun" + COMBINING, min_size=1, max_size=5),
    st.text(alphabet=CJK, min_size=1, max_size=8),
    st.sampled_from(["'s", "'ll", "'ve", "'re", "'t", "'d", "'m", "'S", " '", "''", "'", "’s"]),
    st.text(alphabet=st.characters(categories=["Cc", "Cf", "Co", "Zl", "Zp"]), min_size=1, max_size=3),
    st.from_regex(r" ?[A-Za-z]{1,8}| ?[0-9]{1,5}|[ \n]{1,4}|[!-/:-@]{1,3}", fullmatch=True),
    st.sampled_from([EOT, "<|endoftext", "|>", "<|", EOT + EOT]),
    st.text(alphabet="٠١٢٣௧௨Ⅻ½²𝟘𝟙", min_size=1, max_size=4),
    st.text(alphabet="مرحبا بالعالم अनुच्छेद", min_size=1, max_size=8),
)
texts = st.lists(pieces, max_size=25).map("".join)


# --- ids ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURE_TEXTS)
def test_fixture_texts_match_tiktoken_and_reference(gpt2, tiktoken_gpt2, reference_gpt2, name):
    text = read(name)
    ids = gpt2.encode(text)
    assert ids == tiktoken_gpt2.encode(text, allowed_special="all")
    assert ids == reference_gpt2.encode(text)
    assert gpt2.decode(ids) == text


@given(texts)
@settings(max_examples=300)
def test_generated_text_matches_tiktoken_and_reference(gpt2, tiktoken_gpt2, reference_gpt2, text):
    ids = gpt2.encode(text)
    assert ids == tiktoken_gpt2.encode(text, allowed_special="all")
    assert ids == reference_gpt2.encode(text)
    assert gpt2.decode(ids) == text


@given(st.text(max_size=40))
@settings(max_examples=200)
def test_arbitrary_unicode_without_special_tokens_matches_tiktoken(gpt2_files, tiktoken_gpt2, text):
    tokenizer = _plain_gpt2(gpt2_files)
    ids = tokenizer.encode(text)
    assert ids == tiktoken_gpt2.encode(text, disallowed_special=())
    assert tokenizer.decode(ids) == text


_PLAIN = {}


def _plain_gpt2(files):
    if "gpt2" not in _PLAIN:
        _PLAIN["gpt2"] = Tokenizer(*files)
    return _PLAIN["gpt2"]


def test_without_special_tokens_their_text_is_ordinary(gpt2_files, tiktoken_gpt2):
    tokenizer = _plain_gpt2(gpt2_files)
    text = f"a{EOT}b"
    ids = tokenizer.encode(text)
    assert ids == tiktoken_gpt2.encode(text, disallowed_special=())
    assert 50256 not in ids


@pytest.mark.parametrize("text", [
    " " * 5000 + "x",
    "a" * 3000,
    "\n" * 2000 + " a",
    "中" * 3000,
    "😀" * 700,
    "'" + "s" * 500,
    "\t \n\x0b\u3000" * 300 + "end",
])
def test_long_pretokens_match_tiktoken(gpt2, tiktoken_gpt2, gpt2_small_blocks, text):
    ids = gpt2.encode(text)
    assert ids == tiktoken_gpt2.encode(text, allowed_special="all")
    assert gpt2_small_blocks.encode(text) == ids
    assert list(gpt2_small_blocks.encode_iterable(iter(text))) == ids


def test_lone_surrogates_become_replacement_characters_as_in_tiktoken(gpt2, tiktoken_gpt2):
    for text in ["\ud800", "a\udfffb", "x \ud83d\ude00 y", "\ud83d"]:
        assert gpt2.encode(text) == tiktoken_gpt2.encode(text, allowed_special="all")


def test_merges_apply_all_occurrences_of_the_lowest_rank_first():
    # (a, b) is the only merge present at first, so GPT-2 merges both occurrences before the
    # lower-ranked (ab, a) could apply: [ab, ab], not [aba, b] as merging one pair at a time gives.
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[256] = b"ab"
    vocab[257] = b"aba"
    merges = [(b"ab", b"a"), (b"a", b"b")]
    tokenizer = Tokenizer(vocab, merges)
    assert tokenizer.encode("abab") == [256, 256]
    assert tokenizer.encode("aaa") == [97, 97, 97]
    assert tokenizer.encode("aba") == [257]
    reference = ReferenceEncoder(vocab, merges)
    # also in long pre-tokens: merged in rounds in the pass, on a heap past `_HEAP_ABOVE` bytes
    for text in ["abab", "ababa", "aabab", "abaab", "ab" * 20, "aab" * 15 + "a", "ab" * 200]:
        assert tokenizer.encode(text) == reference.encode(text)


def test_overlapping_runs_merge_left_to_right():
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[256] = b"aa"
    tokenizer = Tokenizer(vocab, [(b"a", b"a")])
    assert tokenizer.encode("aaa") == [256, 97]
    assert tokenizer.encode("aaaa") == [256, 256]


@pytest.fixture(scope="module")
def trained():
    """A CS336-layout tokenizer trained here (ids 0-255 bytes, then the specials, then merges)."""
    return train_bpe(FIXTURES / "corpus.en", 600, [EOT, "<|pad|>"], num_workers=1)


@given(texts)
@settings(max_examples=100)
def test_trained_tokenizer_matches_reference(trained, text):
    vocab, merges = trained
    tokenizer = _trained_tokenizer(trained)
    assert tokenizer.encode(text) == ReferenceEncoder(vocab, merges, [EOT, "<|pad|>"]).encode(text)
    assert tokenizer.decode(tokenizer.encode(text)) == text


_TRAINED = {}


def _trained_tokenizer(trained):
    if "t" not in _TRAINED:
        _TRAINED["t"] = Tokenizer(*trained, [EOT, "<|pad|>"])
    return _TRAINED["t"]


def test_trained_tokenizer_matches_tiktoken_built_from_its_ranks(trained):
    tokenizer = _trained_tokenizer(trained)
    encoding = tokenizer.to_tiktoken()
    text = read("tinystories_sample.txt") + read("german.txt") + EOT + "<|pad|>"
    assert tokenizer.encode(text) == encoding.encode(text, allowed_special="all")


def test_cl100k_pattern_matches_tiktoken_with_the_same_ranks(gpt2_files):
    tokenizer = Tokenizer(*gpt2_files, [EOT], pattern=CL100K_PATTERN, block_chars=16)
    encoding = offline_tiktoken(CL100K_PATTERN, "gpt2-ranks-cl100k-pattern")
    text = read("multi_sample.txt")[:20000] + read("address.txt") + "x.\n\n  \n\r\n 1234567 's'LL"
    ids = tokenizer.encode(text)
    assert ids == encoding.encode(text, allowed_special="all")
    chunks = [text[i : i + 7] for i in range(0, len(text), 7)]
    assert list(tokenizer.encode_iterable(chunks)) == ids


# --- blocks, streaming ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["multi_sample.txt", "web_sample.txt", "address.txt"])
def test_small_blocks_give_the_same_ids(gpt2, gpt2_small_blocks, name):
    text = read(name)
    assert gpt2_small_blocks.encode(text) == gpt2.encode(text)


@given(texts, st.lists(st.integers(0, 400), max_size=12))
@settings(max_examples=200)
def test_streaming_equals_whole_text_under_random_chunkings(gpt2, gpt2_small_blocks, text, cuts):
    cuts = sorted(min(c, len(text)) for c in cuts)
    chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    expected = gpt2.encode(text)
    assert list(gpt2_small_blocks.encode_iterable(chunks)) == expected
    assert list(gpt2.encode_iterable(chunks)) == expected


def test_streaming_a_file_handle(gpt2, gpt2_small_blocks, tmp_path):
    text = read("multi_sample.txt") + read("tinystories_sample.txt")
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    expected = gpt2.encode(text)
    with open(path, encoding="utf-8") as f:
        assert list(gpt2_small_blocks.encode_iterable(f)) == expected
    with open(path, encoding="utf-8") as f:
        assert list(gpt2.encode_iterable(f)) == expected
    # chunks of fixed size from read(), splitting lines, characters' neighbours and special tokens
    for size in (1, 5, 13):
        stream = io.StringIO(text[:3000])
        chunks = iter(lambda: stream.read(size), "")
        assert list(gpt2_small_blocks.encode_iterable(chunks)) == gpt2.encode(text[:3000])


def test_a_text_file_is_read_a_block_at_a_time_not_a_line(gpt2_files, tmp_path):
    # A text file (io.TextIOBase) is read with read(block_chars), lazily, not iterated line by
    # line (a Python loop per line cost 3x the encoding); other iterables are taken as they are,
    # and a binary file is refused as before, naming the item.
    tokenizer = Tokenizer(*gpt2_files, [EOT], block_chars=1000)
    text = read("multi_sample.txt") + EOT + read("web_sample.txt")
    expected = tokenizer.encode(text)

    class Reads(io.StringIO):
        def __init__(self, value):
            super().__init__(value)
            self.sizes = []

        def read(self, size=-1):
            self.sizes.append(size)
            return super().read(size)

        def __iter__(self):
            raise AssertionError("iterated line by line")

    stream = Reads(text)
    ids = tokenizer.encode_iterable(stream)
    first = list(itertools.islice(ids, 10))
    assert stream.sizes and set(stream.sizes) == {1000} and len(stream.sizes) < 5  # lazily
    assert first + list(ids) == expected
    assert len(stream.sizes) == -(-len(text) // 1000) + 1  # to the end (the last read is "")
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    with open(path, encoding="utf-8") as f:
        arrays = list(tokenizer.encode_iterable_to_numpy(f, np.int64))
    assert len(arrays) > 1 and np.concatenate(arrays).tolist() == expected
    with open(path, "rb") as f, pytest.raises(TypeError, match="item 0 is a bytes"):
        list(tokenizer.encode_iterable(f))


def test_streaming_reads_lazily(gpt2_files):
    """Ids come out after reading about one block, not the whole input: memory stays bounded."""
    tokenizer = Tokenizer(*gpt2_files, [EOT], block_chars=1000)
    consumed = 0

    def lines():
        nonlocal consumed
        for _ in range(100_000):
            consumed += 1
            yield "the quick brown fox jumps over the lazy dog\n"

    ids = tokenizer.encode_iterable(lines())
    first = list(itertools.islice(ids, 10))
    assert len(first) == 10
    assert consumed < 100  # a block of 1000 characters is about 23 lines
    total = 10 + sum(1 for _ in ids)
    assert consumed == 100_000
    assert total == 100_000 * len(tokenizer.encode("the quick brown fox jumps over the lazy dog\n"))


def test_special_token_split_across_chunks(gpt2, gpt2_small_blocks):
    text = f"Hello{EOT}world {EOT}{EOT}\n end"
    expected = gpt2.encode(text)
    assert expected.count(50256) == 3
    for cut in range(len(text) + 1):
        for tokenizer in (gpt2, gpt2_small_blocks):
            assert list(tokenizer.encode_iterable([text[:cut], text[cut:]])) == expected


SPACED_SPECIALS = ["<| |>", "\n\n<|doc|>", "\n\n<|doc|> x"]


@pytest.fixture(scope="module")
def spaced_specials(gpt2_files):
    """Special tokens holding whitespace, some prefixes of others: a cut must not split them."""
    return (Tokenizer(*gpt2_files, SPACED_SPECIALS, block_chars=4),
            ReferenceEncoder(*gpt2_files, SPACED_SPECIALS))


@given(st.lists(st.sampled_from(SPACED_SPECIALS + ["<|", " |>", "\n", " ", "\n\n", "a", "doc", "x",
                                                   " x", "<|doc|>"]), max_size=30).map("".join),
       st.lists(st.integers(0, 200), max_size=8))
@settings(max_examples=200)
def test_streaming_with_special_tokens_holding_spaces(spaced_specials, text, cuts):
    tokenizer, reference = spaced_specials
    cuts = sorted(min(c, len(text)) for c in cuts)
    chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    expected = reference.encode(text)
    assert tokenizer.encode(text) == expected
    assert list(tokenizer.encode_iterable(chunks)) == expected


# --- special tokens -------------------------------------------------------------------------


def test_overlapping_special_tokens_longest_wins(gpt2_files):
    double = EOT + EOT
    tokenizer = Tokenizer(*gpt2_files, [EOT, double])
    assert tokenizer.special_tokens == [EOT, double]
    double_id = tokenizer.n_vocab - 1
    assert tokenizer.vocab[double_id] == double.encode()
    text = f"Hello, how {EOT}{EOT} are you?{EOT}{EOT}{EOT}x{EOT}"
    ids = tokenizer.encode(text)
    assert [i for i in ids if i >= 50256] == [double_id, double_id, 50256, 50256]
    assert ids == ReferenceEncoder(*gpt2_files, [EOT, double]).encode(text)
    assert tokenizer.decode(ids) == text
    small = Tokenizer(*gpt2_files, [double, EOT], block_chars=5)
    assert small.encode(text) == ids
    for cut in range(len(text) + 1):
        assert list(small.encode_iterable([text[:cut], text[cut:]])) == ids


def test_special_tokens_appended_when_missing_and_reused_when_present(gpt2_files):
    tokenizer = Tokenizer(*gpt2_files, ["<|new|>", EOT, "<|other|>"])
    assert tokenizer.encode("<|new|>") == [50257]
    assert tokenizer.encode(EOT) == [50256]
    assert tokenizer.encode("<|other|>") == [50258]
    assert tokenizer.n_vocab == 50259
    assert tokenizer.vocab[50257] == b"<|new|>"
    # a special token that is an ordinary token's bytes keeps that token's id
    assert Tokenizer(*gpt2_files, [" the"]).encode("a the") == [64, 262]


# --- numpy output, cache --------------------------------------------------------------------


def test_encode_to_numpy(gpt2):
    text = read("german.txt")
    ids = gpt2.encode(text)
    array = gpt2.encode_to_numpy(text)
    assert array.dtype == np.uint16
    assert array.tolist() == ids
    assert gpt2.encode_to_numpy(text, dtype=np.int64).tolist() == ids
    assert gpt2.encode_to_numpy("").shape == (0,)
    arrays = list(gpt2.encode_iterable_to_numpy([text[:100], text[100:]], dtype=np.uint32))
    assert all(a.dtype == np.uint32 for a in arrays)
    assert np.concatenate(arrays).tolist() == ids


def test_encode_utf8_takes_bytes_and_arrays_of_any_writability_and_index_type(gpt2):
    # The kernel is called through entry points keyed by the argument types: each kind of
    # buffer and document-end array must still reach a matching one.
    texts = [read("german.txt"), read("address.txt"), "", "Hello<|endoftext|>world"]
    data = "".join(texts).encode("utf-8")
    ends = np.cumsum([len(t.encode("utf-8")) for t in texts])
    expected = [gpt2.encode(t) for t in texts]
    writable = np.frombuffer(data, np.uint8).copy()
    unaligned = np.frombuffer(b"\0" + ends.astype(np.int64).tobytes(), np.int64, offset=1)
    for buf in (data, np.frombuffer(data, np.uint8), writable, writable[::-1].copy()[::-1]):
        for doc_ends in (ends, ends.astype(np.int32), ends.astype(np.uint64), unaligned):
            ids, doc_out_ends = gpt2.encode_utf8(buf, doc_ends)
            bounds = [0, *doc_out_ends.tolist()]
            assert [ids[a:b].tolist() for a, b in zip(bounds, bounds[1:])] == expected


def test_a_tiny_cache_is_emptied_and_gives_the_same_ids(gpt2, gpt2_files):
    tokenizer = Tokenizer(*gpt2_files, [EOT], cache_size=3)
    uncached = Tokenizer(*gpt2_files, [EOT], cache_size=0)
    text = read("corpus.en")[:20000] + read("multi_sample.txt")[:20000]
    expected = gpt2.encode(text)
    assert tokenizer.encode(text) == expected
    assert tokenizer._thread_state().cache.table.fill[2] > 0  # started again many times
    assert uncached.encode(text) == expected


def test_a_cache_has_room_for_its_whole_limit_from_the_start(gpt2_files):
    # Growing costs new memory mid-run (9-150 ms for 32 MB here): the cache's first table,
    # made when the tokenizer first encodes, holds as many pre-tokens as it may learn.
    for size in (1 << 16, 1 << 19):
        tokenizer = Tokenizer(*gpt2_files, [EOT], cache_size=size)
        tokenizer.encode("a first text")
        cache = tokenizer._thread_state().cache
        assert cache.limit == size
        assert cache.table.max_entries - int(cache.vocab.fill[1]) >= size
        assert cache.table.max_entries <= 3 * len(cache.table.slots) // 16  # probes stay short


@pytest.mark.parametrize("other_thread", [None, "idle", "in a kernel", "leaving a kernel"])
def test_a_cache_starts_again_in_its_own_memory_unless_another_thread_reads_it(
        gpt2, gpt2_files, other_thread, monkeypatch):
    # New memory costs page faults (and on this project's VM, memory not given to a process
    # for a while is slow to touch): a cache starts again in the table it had, emptied, with
    # the vocab table put back, unless another thread's kernel may be reading that table after
    # a short wait: then in new memory. Before a kernel runs, its thread publishes the serial of
    # the table it reads in its own items (`enter_table`); here the other thread's is written
    # so before each text, and left there ("in a kernel") or taken back 1 ms later (waited for
    # up to 1 s here, so that a busy machine does not fail the test).
    from nbbpe import encode_tables
    from nbbpe.encode import OWN_AT
    from nbbpe.encode_tables import OWN_HAZARD, SERIAL

    if other_thread == "leaving a kernel":
        monkeypatch.setattr(encode_tables, "_READERS_WAIT", 1.0)

    words = read("multi_sample.txt")[:30000].split()
    texts = [" ".join(words[k:k + 9]) for k in range(0, len(words), 9)]
    expected = [gpt2.encode(text) for text in texts]
    tokenizer = Tokenizer(*gpt2_files, [EOT], cache_size=40)
    encoded, release = threading.Event(), threading.Event()
    states = []
    helper = threading.Thread(target=lambda: (tokenizer.encode("a word"),
                                              states.append(tokenizer._thread_state()),
                                              encoded.set(), release.wait(20)))
    if other_thread:  # its state lives as long as the thread
        helper.start()
        assert encoded.wait(20)
    assert [tokenizer.encode(text) for text in texts[:20]] == expected[:20]
    cache = tokenizer._thread_state().cache
    slots = cache.table.slots  # (held: new slots cannot be this array)
    starts, new_slots = int(cache.table.fill[2]), 0
    first_starts = starts
    hazard = states[0].scratch[OWN_AT + OWN_HAZARD:][:1] if other_thread else None
    done = threading.Event()

    def take_back():  # as a kernel that returns ~1 ms after it began
        while not done.is_set():
            if hazard[0]:
                time.sleep(0.001)
                hazard[0] = 0
            time.sleep(0.0001)

    leaver = threading.Thread(target=take_back)
    if other_thread == "leaving a kernel":
        leaver.start()
    try:  # (the threads end even if an assertion fails: the test run must not hang on them)
        for k in range(20, len(texts)):
            if other_thread in ("in a kernel", "leaving a kernel"):
                hazard[0] = cache.table.fill[SERIAL]
            assert tokenizer.encode(texts[k]) == expected[k]
            if cache.table.fill[2] > starts:
                starts = int(cache.table.fill[2])
                new_slots += cache.table.slots is not slots
                slots = cache.table.slots
        assert starts - first_starts > 3  # it started again, many times
        assert entries_in(cache.table) >= int(cache.vocab.fill[1])  # the vocab table is in it
    finally:
        done.set()
        if other_thread == "leaving a kernel":
            leaver.join()
        release.set()
    if other_thread:
        assert states[0].hazard_address == address(states[0].scratch) + 8 * (OWN_AT + OWN_HAZARD)
        helper.join()
    if other_thread == "in a kernel":  # (a text learns fewer than 40: one start at most)
        assert new_slots == starts - first_starts
    else:
        assert new_slots == 0


def test_the_short_path_given_a_table_another_thread_replaced_takes_up_the_new_one(gpt2_files):
    # A thread's short path keeps its cache table packed. When another thread replaces the
    # table (marking it `STALE`, as `SharedCache.make_room` does before it may empty it in
    # place), the short path does not run the kernel on it, even for a text it holds every
    # pre-token of (whose kernel would never reach `is_full`): the text goes the long way, with
    # the new table, which the short path then holds.
    from nbbpe.encode_tables import STALE

    tokenizer, state = tokenizer_with_short_path(gpt2_files)
    text = "the same words again and again, the same words"
    expected = tokenizer.encode(text)
    assert tokenizer.encode(text) == expected  # (all of them in the cache now)
    old = state.text_holds[1]
    assert old is state.cache.table
    state.cache.table = state.cache._fresh()  # as another thread's `make_room` leaves it
    old.fill[STALE] = 1
    assert tokenizer.encode(text) == expected
    assert state.text_holds[1] is state.cache.table
    assert int(state.scratch[encode.OWN_AT + encode.OWN_HAZARD]) == 0  # (out of the kernel)


def test_a_small_cache_size_still_holds_enough_not_to_copy_the_vocab_table_over_and_over(
        gpt2, gpt2_files, monkeypatch):
    # Each time a cache starts again it copies the vocab table (16 MB with GPT-2's vocab). With
    # room for 1 pre-token, that happened after nearly every new one: 200 kB of text took 16 s.
    # A positive cache_size is taken as at least MIN_CACHE_SIZE (the tests lower it: conftest).
    from nbbpe import encode_tables

    monkeypatch.setattr(encode_tables, "MIN_CACHE_SIZE", 1 << 16)
    text = read("multi_sample.txt")[:20000]
    expected = gpt2.encode(text)
    for size in (1, 100):
        tokenizer = Tokenizer(*gpt2_files, [EOT], cache_size=size)
        assert tokenizer.encode(text) == expected
        cache = tokenizer._thread_state().cache
        assert cache.limit == 1 << 16
        assert cache.table.fill[2] == 0  # never started again
        learned = int(cache.table.fill[1] - cache.vocab.fill[1])
        assert size < learned < 1 << 16  # it kept more than `size` pre-tokens
    uncached = Tokenizer(*gpt2_files, [EOT], cache_size=0)
    assert uncached.encode(text) == expected
    assert uncached._thread_state().cache.table is uncached._thread_state().cache.vocab


def test_a_second_pass_looks_up_every_pre_token_the_first_one_learned(gpt2_files):
    # The pass keys each pre-token as the scanner finds it (`_key_and_prefetch`) and stores a
    # new one under the key it was looked up by: keys that differ from one pass to the next
    # would still give the right ids, but every pass would merge and store its pre-tokens
    # again. Web and multilingual text: blocks of ASCII and one pre-token at a time alike.
    for name in ("web_sample.txt", "multi_sample.txt"):
        tokenizer = Tokenizer(*gpt2_files, [EOT])
        text = read(name)
        first = tokenizer.encode_to_numpy(text)
        cache = tokenizer._thread_state().cache
        table = cache.table
        learned = entries_in(table)  # not the count, which takes a thread's entries in batches
        assert learned > int(cache.vocab.fill[1]) + 100, name
        assert np.array_equal(tokenizer.encode_to_numpy(text), first)
        assert cache.table is table and entries_in(table) == learned, name


@pytest.mark.parametrize("threads", [1, 2])
def test_a_cache_counts_the_entries_its_threads_stored_but_a_batch_each(gpt2_files, threads):
    from nbbpe.encode_tables import ENTRY_BATCH

    tokenizer = Tokenizer(*gpt2_files, [EOT])
    texts = read("web_sample.txt").split("\n\n")
    tokenizer.encode_batch(texts, num_threads=threads)
    engine = tokenizer._get_engine()
    table, vocab = engine.cache.table, engine.vocab_table
    assert table.fill[2] == 0  # never started again
    assert int(vocab.fill[1]) == entries_in(vocab)  # built by one thread, counted whole
    assert entries_in(table) > entries_in(vocab) + 100  # the pass learned new pre-tokens
    assert 0 <= entries_in(table) - int(table.fill[1]) < threads * ENTRY_BATCH


def test_the_short_path_follows_its_cache_and_buffer_when_they_change(gpt2_files):
    # encode_to_numpy keeps its kernel call's arguments ready between calls; a cache that grows
    # or starts again, a text longer than the output buffer, and batches on the same thread
    # (one of them larger than the buffer, which it replaces) change what they hold: every text
    # still gets the ids of a tokenizer that caches nothing.
    tokenizer = Tokenizer(*gpt2_files, [EOT], cache_size=40)
    uncached = Tokenizer(*gpt2_files, [EOT], cache_size=0)
    words = read("multi_sample.txt")[:30000].split()
    texts = [" ".join(words[k:k + 9]) for k in range(0, len(words), 9)]
    texts[5] = texts[5] * 9000  # about 500 KB: more ids than the buffer held
    buffers = set()
    for k, text in enumerate(texts[:300]):
        ids = tokenizer.encode_to_numpy(text)
        assert ids.tolist() == uncached.encode(text), k
        if k % 50 == 7:
            batch = texts[k:k + 3] + ([texts[5]] if k == 107 else [])
            assert tokenizer.encode_batch(batch, num_threads=1) == [uncached.encode(t) for t in batch]
        state = tokenizer._thread_state()
        if state.text_call is not None:  # what it holds is the thread's own
            packed = state.text_args.values
            assert packed[CACHE_AT] == address(state.cache.table.slots)  # the current table
            assert packed[OUT_AT] == address(state.out)
        buffers.add(address(state.out))
    assert state.cache.table.fill[2] > 0  # the cache started again
    assert len(buffers) > 1  # and the buffer was replaced


def tokenizer_with_short_path(gpt2_files):
    """A GPT-2 tokenizer, and its thread's state, after two texts: the second readies the short
    path (`DocumentEncoder._ready_text_call`), which later texts of this thread take."""
    tokenizer = Tokenizer(*gpt2_files, [EOT])
    for text in ("a first text", "a second: it readies the short path"):
        tokenizer.encode(text)
    return tokenizer, tokenizer._thread_state()


def test_the_short_path_is_packed_again_only_when_its_cache_or_buffer_changed(gpt2_files,
                                                                             monkeypatch):
    # A text too long for the short path goes the long way, then readies the short path again:
    # its arguments are packed anew only if the cache's table or the output buffer is not the
    # one they hold (packing took 65-85 us a call).
    tokenizer, state = tokenizer_with_short_path(gpt2_files)
    packs = []
    real = encode.pack_encode_args
    monkeypatch.setattr(encode, "pack_encode_args",
                        lambda *args, **kwargs: packs.append(len(args)) or real(*args, **kwargs))
    sample = read("web_sample.txt")
    long_text = sample * (encode._TEXT_ROOM_GROWS_TO // len(sample) + 1)  # (makes no room)
    assert len(long_text) > state.text_room
    expected = tokenizer.encode(long_text)
    for _ in range(3):
        assert tokenizer.encode(long_text) == expected and tokenizer.encode("short") == [19509]
    assert 11 not in packs  # the short path's own packing (with its text buffer) was not redone
    state.cache.table = state.cache._fresh()  # as another thread's `make_room` would leave it
    assert tokenizer.encode(long_text) == expected and tokenizer.encode("short") == [19509]
    assert packs.count(11) == 1
    assert state.text_args.values[CACHE_AT] == address(state.cache.table.slots)


def test_a_text_the_short_path_has_no_room_for_makes_room_for_the_next(gpt2_files,
                                                                       tiktoken_gpt2):
    # A text of fewer than `_TEXT_ROOM_GROWS_TO` bytes, too long for the short path, goes the
    # long way and makes that much room: the next one as long takes the short path (one call,
    # no long way), with the same ids.
    tokenizer, state = tokenizer_with_short_path(gpt2_files)
    size = state.text_room
    sample = read("web_sample.txt")
    text = sample * (size // len(sample) + 1)
    assert size < len(text) < encode._TEXT_ROOM_GROWS_TO
    long_ways = []
    documents = tokenizer._get_engine().documents
    real = documents.encode_text_long
    documents.encode_text_long = lambda *args: long_ways.append(1) or real(*args)
    expected = tiktoken_gpt2.encode(text, allowed_special="all")
    assert tokenizer.encode(text) == expected and long_ways == [1]
    assert state.text_room >= encode._TEXT_ROOM_GROWS_TO
    for _ in range(2):
        assert tokenizer.encode(text) == expected
        assert tokenizer.encode_to_numpy(text).tolist() == expected
    assert long_ways == [1]
    assert tokenizer.encode("Hello again") == tiktoken_gpt2.encode_ordinary("Hello again")


def test_calls_of_a_batch_follow_their_cache_and_buffer_and_let_go_of_the_text(gpt2_files):
    # A thread keeps its kernel arguments packed from call to call and only puts in the next
    # documents; a cache that grows or starts again and a larger output buffer are packed anew:
    # every batch still gets the ids of a tokenizer that caches nothing. The text is not kept.
    tokenizer = Tokenizer(*gpt2_files, [EOT], cache_size=40)
    uncached = Tokenizer(*gpt2_files, [EOT], cache_size=0)
    words = read("multi_sample.txt")[:30000].split()
    texts = [" ".join(words[k:k + 9]) for k in range(0, len(words), 9)]
    state = None
    for k in range(0, 240, 8):
        batch = texts[k:k + 8]
        if k == 80:
            batch = [text * 2000 for text in batch]  # about 1 MB: a larger output buffer
        ids, offsets = tokenizer.encode_batch_to_numpy(batch, num_threads=1)
        assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == [
            uncached.encode(text) for text in batch], k
        state = tokenizer._thread_state()
        packed = state.run_args.values
        assert packed[CACHE_AT] == address(state.cache.table.slots)  # the current table
        assert packed[OUT_AT] == address(state.out)
    assert state.cache.table.fill[2] > 0  # the cache started again
    text = np.frombuffer(bytearray(" ".join(words[:2000]).encode()), dtype=np.uint8)
    held = weakref.ref(text)
    assert tokenizer.encode_utf8(text)[0].tolist() == uncached.encode(" ".join(words[:2000]))
    del text
    gc.collect()
    assert held() is None


def test_a_thread_goes_on_while_another_grows_the_cache_then_takes_up_the_new_table(gpt2_files):
    # While one thread grows the shared cache (or starts it again), the others go on with the
    # full table, learning nothing, instead of waiting for it; once the new table is in, each
    # takes it up at its next new pre-token, whichever way it encodes (short path or batch).
    tokenizer = Tokenizer(*gpt2_files, [EOT], cache_size=40)
    uncached = Tokenizer(*gpt2_files, [EOT], cache_size=0)
    words = read("multi_sample.txt")[:40000].split()
    texts = [" ".join(words[k:k + 9]) for k in range(0, len(words), 9)]
    cache = tokenizer._get_engine().cache
    growing, went_on, grown = threading.Event(), threading.Event(), threading.Event()
    # The cache starts again in new memory (`_fresh`), or in its own while the grower is its
    # only thread (`_start_again_in`): the first time, it waits until the other thread is done.
    made = {name: getattr(cache, name) for name in ("_fresh", "_start_again_in")}

    def slow(name):
        def make(*args):
            for other in made:
                setattr(cache, other, made[other])
            growing.set()
            grown.wait(20)
            return made[name](*args)
        return make

    for name in made:
        setattr(cache, name, slow(name))
    grower = threading.Thread(target=lambda: tokenizer.encode(" ".join(texts[:100])))
    grower.start()
    assert growing.wait(20)
    results = {}

    def other_thread():
        results["during"] = [tokenizer.encode(text) for text in texts[100:200]]
        results["batch during"] = tokenizer.encode_batch(texts[200:260], num_threads=1)
        results["learned during"] = cache.table.learns
        went_on.set()
        assert grown.wait(20)
        grower.join(20)
        starts = int(cache.table.fill[2])
        results["after"] = [tokenizer.encode(text) for text in texts[260:400]]
        state = tokenizer._thread_state()
        results["short path took up"] = (state.text_call is not None and cache.table.learns
                                         and int(cache.table.fill[2]) > starts
                                         and state.text_holds[1] is cache.table)
        results["batch after"] = tokenizer.encode_batch(texts[400:460], num_threads=1)
        results["batch took up"] = state.run_holds[1] is cache.table and cache.table.learns

    other = threading.Thread(target=other_thread)
    other.start()
    assert went_on.wait(10)  # (waiting for the growth, it would not have)
    grown.set()
    other.join(20)
    grower.join(20)
    assert results["learned during"] is False
    assert results["during"] == [uncached.encode(text) for text in texts[100:200]]
    assert results["batch during"] == [uncached.encode(text) for text in texts[200:260]]
    assert results["after"] == [uncached.encode(text) for text in texts[260:400]]
    assert results["batch after"] == [uncached.encode(text) for text in texts[400:460]]
    assert results["short path took up"]  # it filled new tables: it left the read-only one
    assert results["batch took up"]


def test_cached_ids_of_any_count_stay_within_a_small_output_buffer(gpt2_files, tiktoken_gpt2,
                                                                   monkeypatch):
    # The encode loop copies a cached pre-token's ids with three writes whatever their number
    # (`copy_short_ids`), into an output buffer that keeps `SPARE_IDS` items for it. With a
    # buffer of a few thousand ids (a call needs room for a window of pre-tokens), the kernel
    # is called again and again and stops each call near the end of its buffer: nothing past
    # the buffer may change, and the ids are tiktoken's.
    from nbbpe import encode

    tokenizer = Tokenizer(*gpt2_files, [EOT])
    words = [" the", " quickly", " Xinjiang", " qwrtplkjh", " zzyzx", "!", "a", " 12345678",
             " Zwölf", " ω", "\n\n", " pneumonoultra"]
    counts = {len(tiktoken_gpt2.encode_ordinary(word)) for word in words}
    assert {1, 2, 3}.issubset(counts) and max(counts) > 3  # a slot's 1 to 3 ids, and a record
    rng = np.random.default_rng(0)
    text = "".join(rng.choice(words, 6000))  # repeated: most are copied from the cache
    expected = tiktoken_gpt2.encode_ordinary(text)
    assert tokenizer.encode_to_numpy(text).tolist() == expected  # learns them
    state = tokenizer._thread_state()
    for text in (text, "a!" * 6000):  # and one id per byte: a call can fill its buffer exactly
        expected = tiktoken_gpt2.encode_ordinary(text)
        for items in range(3840, 3840 + 257):  # one of them is filled to its last item
            monkeypatch.setattr(encode, "_OUT_ITEMS", items)
            guarded = np.full(items + encode.SPARE_IDS + 16, -7, dtype=np.int32)
            state.out = guarded[: items + encode.SPARE_IDS]  # what `output` hands the kernel
            ids, _ = tokenizer.encode_utf8(text.encode())
            assert ids.tolist() == expected, items
            assert state.out.base is guarded  # the kernel had that buffer, called many times
            assert (guarded[items + encode.SPARE_IDS :] == -7).all(), items


def test_a_pre_token_longer_than_the_output_buffer_is_encoded(gpt2_files, tiktoken_gpt2,
                                                               monkeypatch):
    # A kernel call writes at most `_OUT_ITEMS` ids (4 Mi), and stopped whenever a window's
    # bytes outnumbered the room left. A pre-token of more bytes than that (a 5 MB line of one
    # letter) then never fit, and each call returned having done nothing: encoding looped
    # forever. Now a call takes the pre-tokens that fit and hands a long one that does not to
    # the merge outside the pass. Here with a buffer of 1,000 ids.
    from nbbpe import encode

    monkeypatch.setattr(encode, "_OUT_ITEMS", 1000)
    tokenizer = Tokenizer(*gpt2_files, [EOT])
    texts = ["x" * 2500, "ab " + "q" * 1500, "word " * 150 + "z" * 3000 + " end",
             "a" * 900 + " " + "b" * 900]  # the last: two that fit alone, not together
    for text in texts:
        expected = tiktoken_gpt2.encode_ordinary(text)
        assert tokenizer.encode_utf8(text.encode())[0].tolist() == expected
        assert tokenizer.encode_to_numpy(text).tolist() == expected
    ids, offsets = tokenizer.encode_batch_to_numpy(texts, num_threads=2)
    assert ids.tolist() == [i for text in texts for i in tiktoken_gpt2.encode_ordinary(text)]


def test_a_threads_cache_learns_without_touching_the_shared_vocab_table(gpt2_files):
    tokenizer = Tokenizer(*gpt2_files, [EOT])
    tokenizer.encode("warm up")
    vocab = tokenizer._get_engine().vocab_table
    before = [a.copy() for a in (vocab.slots, vocab.records, vocab.fill)]
    text = read("multi_sample.txt")[:20000]  # many pre-tokens the vocab does not hold
    expected = Tokenizer(*gpt2_files, [EOT], cache_size=0).encode(text)
    results = {}

    def encode_in_thread(k):
        results[k] = tokenizer.encode(text)

    threads = [threading.Thread(target=encode_in_thread, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {0: expected, 1: expected}
    assert tokenizer.encode(text) == expected
    cache = tokenizer._thread_state().cache.table
    assert cache.fill[1] > vocab.fill[1] and cache.slots is not vocab.slots
    for a, b in zip(before, (vocab.slots, vocab.records, vocab.fill)):
        assert np.array_equal(a, b)


# --- decoding -------------------------------------------------------------------------------


def test_decode_replaces_malformed_utf8(gpt2):
    ids = gpt2.encode("鑫")
    assert len(ids) == 3  # one token per byte of the character
    assert gpt2.decode(ids) == "鑫"
    assert gpt2.decode(ids[:2]) == "\ufffd"
    assert gpt2.decode(ids[:1] + gpt2.encode("a")) == "\ufffda"
    assert gpt2.decode_bytes(ids[:2]) == "鑫".encode()[:2]
    assert gpt2.decode([]) == ""
    assert gpt2.decode(np.array(gpt2.encode("ok"), dtype=np.uint16)) == "ok"
    assert gpt2.decode(iter(gpt2.encode("gen"))) == "gen"


def test_decode_unknown_ids_raise(gpt2, gpt2_files):
    with pytest.raises(ValueError, match=r"id 50257 at position 1 is not in the vocab"):
        gpt2.decode([0, 50257])
    with pytest.raises(ValueError, match=r"id -1 at position 0"):
        gpt2.decode([-1])
    with pytest.raises(ValueError, match=r"id 99999999999"):
        gpt2.decode(np.array([99999999999], dtype=np.uint64))
    vocab, merges = gpt2_files
    gappy = dict(vocab)
    gappy[50300] = b"<gap>"
    with pytest.raises(ValueError, match=r"id 50280 at position 0 is not in the vocab"):
        Tokenizer(gappy, merges).decode([50280])
    with pytest.raises(TypeError, match="integer ids"):
        gpt2.decode([1.5])
    with pytest.raises(TypeError, match="integer ids"):
        gpt2.decode(["a"])


@settings(max_examples=100)
@given(st.lists(st.integers(0, 50256), max_size=300))
def test_short_and_long_decodes_agree(gpt2, ids):
    # a list or tuple of up to `_DECODE_BY_LOOKUP_UP_TO` ids is decoded by vocab lookups, a
    # longer one or an array by NumPy: the same bytes either way
    expected = gpt2.decode_bytes(np.array(ids, dtype=np.int64))
    assert gpt2.decode_bytes(ids) == gpt2.decode_bytes(tuple(ids)) == expected
    assert gpt2.decode(ids) == expected.decode("utf-8", errors="replace")


def test_a_short_decode_refuses_what_a_long_one_does(gpt2):
    for bad, error in (([True, False], TypeError), ([1.0], TypeError), ([np.int64(5), -3], ValueError),
                       ([5, 50257], ValueError), ((1, "a"), TypeError)):
        for ids in (bad, list(bad) * 100):  # by lookup, then by NumPy
            with pytest.raises(error):
                gpt2.decode(ids)
    assert gpt2.decode([np.int64(17250), 0]) == gpt2.decode([17250, 0]) == "Hi!"


# --- bad input ------------------------------------------------------------------------------


def test_a_str_subclass_is_encoded_as_its_value(gpt2_files, tiktoken_gpt2):
    # NumPy's `str_` holds its characters as UCS-4 and lends them through the buffer protocol:
    # one text at a time, its buffer was read as UTF-8 ("Hi" gave the ids of "H\0\0\0i\0\0\0")
    class Text(str):
        pass

    tokenizer = Tokenizer(*gpt2_files, [EOT])
    for text in ("Hi", "héllo wörld", "Hi" * 40000, " 日本", "Hi"):  # the long way and the short
        expected = tiktoken_gpt2.encode_ordinary(text)
        for given in (np.str_(text), Text(text)):
            assert tokenizer.encode(given) == expected
            assert tokenizer.encode_to_numpy(given).tolist() == expected
            assert tokenizer.encode_batch([given, given]) == [expected, expected]


def test_encode_rejects_non_strings(gpt2):
    with pytest.raises(TypeError, match=r"encode expects a str, got bytes \(decode bytes"):
        gpt2.encode(b"abc")
    with pytest.raises(TypeError, match="got NoneType"):
        gpt2.encode(None)
    with pytest.raises(TypeError, match="got list"):
        gpt2.encode_to_numpy(["a"])
    with pytest.raises(TypeError, match="item 1 is a bytes, not a str"):
        list(gpt2.encode_iterable(["a", b"b"]))
    with pytest.raises(ValueError, match=r"uint8 cannot hold the ids of this tokenizer: it has 50,257 ids \(largest 50,256\)"):
        gpt2.encode_to_numpy("a", dtype=np.uint8)
    with pytest.raises(TypeError, match="integer type"):
        gpt2.encode_to_numpy("a", dtype=np.float32)


def test_bad_vocab_and_merges_raise_naming_the_problem():
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[256] = b"ab"
    with pytest.raises(ValueError, match=r"merge 0 \(b'ab', b'c'\): the merged token b'abc' is not"):
        Tokenizer(vocab, [(b"ab", b"c")])
    with pytest.raises(ValueError, match=r"merge 1 \(b'xy', b'a'\): b'xy' is not in the vocab"):
        Tokenizer(vocab, [(b"a", b"b"), (b"xy", b"a")])
    with pytest.raises(ValueError, match=r"listed twice \(ranks 0 and 1\)"):
        Tokenizer(vocab, [(b"a", b"b"), (b"a", b"b")])
    with pytest.raises(ValueError, match=r"lacks 1 of the 256 single bytes \(first: b'\\x07'\)"):
        Tokenizer({i: bytes([i]) for i in range(256) if i != 7}, [])
    with pytest.raises(TypeError, match=r"key '1' is a str"):
        Tokenizer({"1": b"a"}, [])
    with pytest.raises(TypeError, match=r"vocab\[3\]: expected bytes, got str"):
        Tokenizer({**vocab, 3: "x"}, [])
    with pytest.raises(TypeError, match=r"merges\[0\]: expected a \(bytes, bytes\) pair"):
        Tokenizer(vocab, [b"ab"])
    with pytest.raises(TypeError, match="single str"):
        Tokenizer(vocab, [], EOT)
    with pytest.raises(ValueError, match="more than once"):
        Tokenizer(vocab, [], [EOT, EOT])
    with pytest.raises(ValueError, match="cannot be encoded as UTF-8"):
        Tokenizer(vocab, [], ["\ud800"])
    with pytest.raises(ValueError, match="cache_size"):
        Tokenizer(vocab, [], cache_size=-1)
    with pytest.raises(ValueError, match="has capturing groups"):
        Tokenizer(vocab, [], pattern=r"(\w+)|\s+")


def test_from_files_missing_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="vocab file not found"):
        Tokenizer.from_files(tmp_path / "nope.json", FIXTURES / "gpt2_merges.txt")
    with pytest.raises(FileNotFoundError, match="merges file not found"):
        Tokenizer.from_files(FIXTURES / "gpt2_vocab.json", tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match="not a saved Tokenizer"):
        Tokenizer.load(tmp_path)


# --- the compiled pre-tokenizer against the regex path -----------------------------------


@pytest.fixture(scope="module")
def gpt2_regex(gpt2_files):
    return Tokenizer(*gpt2_files, [EOT], pretokenizer="regex")


def test_the_default_for_gpt2_is_the_compiled_scanner(gpt2, gpt2_regex):
    assert gpt2._family == "gpt2" and gpt2_regex._family is None


@pytest.mark.parametrize("name", FIXTURE_TEXTS)
def test_compiled_and_regex_pretokenizers_give_the_same_ids_on_fixtures(gpt2, gpt2_regex, name):
    text = read(name)
    assert gpt2.encode(text) == gpt2_regex.encode(text)


@given(texts)
@settings(max_examples=200)
def test_compiled_and_regex_pretokenizers_give_the_same_ids(gpt2, gpt2_regex, text):
    assert gpt2.encode(text) == gpt2_regex.encode(text)


@pytest.mark.parametrize("pretokenizer", ["auto", "regex"])
def test_nested_special_tokens_on_both_paths(gpt2_files, pretokenizer):
    double = EOT + EOT
    tok = Tokenizer(*gpt2_files, [EOT, double], pretokenizer=pretokenizer)
    ids = tok.encode(f"a{EOT}{EOT}{EOT}b {EOT}")
    assert ids.count(tok.encode(double)[0]) == 1 and ids.count(50256) == 2
    assert tok.decode(ids) == f"a{EOT}{EOT}{EOT}b {EOT}"


def test_compiled_pretokenizer_only_for_the_built_in_patterns(gpt2_files):
    with pytest.raises(ValueError, match="no compiled pre-tokenizer implements this pattern"):
        Tokenizer(*gpt2_files, pattern=r"\w+|\s+", pretokenizer="compiled")
    with pytest.raises(ValueError, match="pretokenizer must be"):
        Tokenizer(*gpt2_files, pretokenizer="fastest")


# --- batches and threads ------------------------------------------------------------------


@settings(max_examples=40)
@given(st.lists(texts, max_size=12), st.integers(1, 4))
def test_encode_batch_equals_encode_of_each_text(gpt2, batch, threads):
    want = [gpt2.encode(text) for text in batch]
    assert gpt2.encode_batch(batch, num_threads=threads) == want
    ids, offsets = gpt2.encode_batch_to_numpy(batch, num_threads=threads)
    assert ids.dtype == np.uint16 and offsets.dtype == np.int64 and len(offsets) == len(batch) + 1
    assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want
    assert gpt2.decode_batch(want) == [gpt2.decode(ids) for ids in want]


def test_small_batches_take_one_thread_and_few_groups(gpt2, monkeypatch):
    # Each group of a 2-thread batch costs ~0.1 ms of hand-offs: a batch takes a second thread
    # from 384K characters on, and is cut into groups of about equal size, of at least 128K
    # characters (8 per thread at most, each of at most `_GROUP_CHARS`). The real thresholds
    # here, not conftest's.
    monkeypatch.undo()
    from nbbpe import tokenizer as tk

    assert (tk._SMALL_BATCH_CHARS, tk._MIN_GROUP_CHARS, tk._GROUPS_PER_THREAD) == (3 << 17, 1 << 17, 8)
    assert tk._thread_count(2, 1000, (3 << 17) - 1, False) == 1
    assert tk._thread_count(2, 1000, 3 << 17, False) == 2
    assert tk._thread_count(4, 1000, 5 << 17, False) == 2
    assert tk._thread_count(2, 1, 1 << 22, False) == 1 and tk._thread_count(2, 1, 1 << 22, True) == 2
    sizes = [np.diff(tk._group_bounds(n, 2), prepend=0)
             for n in (3 << 17, 1 << 19, 1 << 20, 2 << 20, 5 << 20)]
    assert [len(s) for s in sizes] == [3, 4, 8, 16, 16]
    assert all(s.max() - s.min() <= 1 for s in sizes) and sizes[-1][0] == (5 << 20) // 16
    one_thread = [len(tk._group_bounds(n, 1)) for n in (1000, 1 << 20, (1 << 20) + 1, 5 << 20)]
    assert one_thread == [1, 1, 2, 5]
    assert tk._group_bounds(0, 2).tolist() == [0]
    assert tk._group_bounds(100 << 20, 2)[-1] == 100 << 20
    runs = []
    real = tk._run_groups
    monkeypatch.setattr(tk, "_run_groups", lambda threads, encode, groups, *args:
                        runs.append((threads, len(groups))) or real(threads, encode, groups, *args))
    text = read("web_sample.txt").replace(EOT, "")
    for chars, expected in ((200_000, []), (600_000, [(2, 4)])):  # (one thread: one group, here)
        batch = [text] * (chars // len(text))
        ids, offsets = gpt2.encode_batch_to_numpy(batch, num_threads=2)
        assert ids[offsets[-2]:offsets[-1]].tolist() == gpt2.encode(text)
        assert runs == expected
        runs.clear()


def test_large_batches_on_threads_equal_encode(gpt2):
    documents = read("web_sample.txt").split(EOT) * 6 + read("multi_sample.txt").split("\n")
    want = [gpt2.encode(d) for d in documents]
    for threads in (1, 2, 3):
        assert gpt2.encode_batch(documents, num_threads=threads) == want
    assert gpt2.decode_batch(want) == documents  # byte-level BPE is lossless on valid text
    ascii_only = [d.encode("ascii", "ignore").decode() for d in documents]  # groups of ASCII
    want = [gpt2.encode(d) for d in ascii_only]
    for threads in (1, 2):  # one thread: the group's ids are made in the dtype asked for
        ids, offsets = gpt2.encode_batch_to_numpy(ascii_only, num_threads=threads, dtype=np.int32)
        assert ids.dtype == np.int32 and len(ids) > 1 << 16 and offsets[0] == 0
        assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want


def test_a_long_text_in_a_batch_is_cut_for_the_threads(gpt2_files):
    # One text is most of the batch: it is cut (where its ids cannot change) so that every
    # thread gets work; a special token with a space in it must never be cut through.
    spaced = "<|end of part|>"
    tok = Tokenizer(*gpt2_files, [EOT, spaced])
    long_text = (read("web_sample.txt") + spaced + read("multi_sample.txt") + " " + spaced) * 12
    batch = ["a short one", long_text, "", read("german.txt")]
    want = [tok.encode(text) for text in batch]
    assert len(long_text.encode()) > 1 << 18 and long_text.count(spaced) == 24
    for threads in (2, 3):
        ids, offsets = tok.encode_batch_to_numpy(batch, num_threads=threads)
        assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want
    assert tok.encode_batch([long_text], num_threads=2) == [want[1]]


def spy_on_groups(monkeypatch) -> list:
    """The bytes of each call of the encode kernels made the long way from now on (a group of
    a batch, its documents in one buffer or each where it lies), appended to the list returned."""
    calls = []
    real = encode.DocumentEncoder.encode

    def spied(self, buf, doc_ends, *args, **kwargs):
        calls.append(int(doc_ends[-1]) if len(doc_ends) else 0)
        return real(self, buf, doc_ends, *args, **kwargs)

    monkeypatch.setattr(encode.DocumentEncoder, "encode", spied)
    return calls


def test_a_long_text_is_encoded_in_groups(gpt2_files, monkeypatch):
    # encode and encode_to_numpy cut a text longer than `_LONG_TEXT_CHARS` as a batch is cut,
    # never holding all its UTF-8: the ids are those of encoding its UTF-8 in one call.
    import nbbpe.tokenizer
    from nbbpe.tokenizer import _utf8

    monkeypatch.setattr(nbbpe.tokenizer, "_GROUP_CHARS", 2000)
    monkeypatch.setattr(nbbpe.tokenizer, "_LONG_TEXT_CHARS", 4000)
    monkeypatch.setattr(nbbpe.tokenizer, "_READ_IN_PLACE_FROM", 2000)  # (never above that)
    tok = Tokenizer(*gpt2_files, [EOT])
    text = (read("web_sample.txt")[:9000] + EOT + read("multi_sample.txt")[:9000]
            + "\ud800 lone" + EOT) * 2
    want = tok.encode_utf8(_utf8(text))[0].tolist()
    assert len(text) > 8 * 4000 and want == tok.encode_utf8(_utf8(text)[:-len(EOT)])[0].tolist() + [
        tok.encode(EOT)[0]]
    calls = spy_on_groups(monkeypatch)
    assert tok.encode(text) == want
    assert tok.encode_to_numpy(text).tolist() == want
    assert tok.encode_to_numpy(text, np.int32).dtype == np.int32
    assert len(calls) >= 3 * 8 and max(calls) < 4 * 4000
    calls.clear()
    short = tok.encode(text[:3000])  # not longer than `_LONG_TEXT_CHARS`: in one call
    assert calls == [] and short == tok.encode_batch([text[:3000]])[0]


def test_a_large_batch_on_one_thread_is_encoded_in_groups(gpt2_files, monkeypatch):
    # More characters than a group holds: one thread encodes it a group at a time (so the whole
    # batch is never one str and one bytes), long texts cut as for the threads.
    import nbbpe.tokenizer

    monkeypatch.setattr(nbbpe.tokenizer, "_GROUP_CHARS", 5000)
    tok = Tokenizer(*gpt2_files, [EOT])
    batch = [read("web_sample.txt"), "", "short", read("multi_sample.txt")[:20000] + EOT + "x"]
    batch += [d for d in read("web_sample.txt").split(EOT)]
    want = [tok.encode(text) for text in batch]
    assert sum(map(len, batch)) > 10 * 5000 and max(map(len, batch)) > 2 * 5000
    groups = spy_on_groups(monkeypatch)
    ids, offsets = tok.encode_batch_to_numpy(batch, num_threads=1)
    assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want
    assert len(groups) >= 10 and max(groups) < 4 * 5000


def test_groups_ids_are_copied_into_the_result_in_order_as_they_come(gpt2_files, monkeypatch):
    # On threads the groups end in any order: each group's ids go into the result as soon as
    # every group before it is in, and the result is a view of the ids written, on memory
    # lent to it (`_ResultLease`). With no room for its upper bound (MemoryError), the parts
    # are joined at the end as before.
    import nbbpe.tokenizer
    from nbbpe.tokenizer import _JoinedIds, _ResultLease

    joined = _JoinedIds(3, 100, np.uint16)
    parts = [(np.array([1, 2], np.uint16), np.array([1, 2])), (np.zeros(0, np.uint16), np.array([0])),
             (np.array([7, 8, 9], np.uint16), np.array([3]))]
    for k in (2, 0, 1):
        joined.add(k, parts[k])
    ids, offsets = joined.result(4)
    assert ids.tolist() == [1, 2, 7, 8, 9] and offsets.tolist() == [0, 1, 2, 2, 5]
    assert isinstance(lease_of(ids), _ResultLease) and ids.dtype == np.uint16
    missing = _JoinedIds(2, 10, np.uint16)
    missing.add(1, parts[0])
    with pytest.raises(RuntimeError, match="group 0 of the batch's 2 is missing"):
        missing.result(2)

    monkeypatch.setattr(nbbpe.tokenizer, "_GROUP_CHARS", 3000)
    tok = Tokenizer(*gpt2_files, [EOT])
    batch = read("web_sample.txt").split(EOT) + [read("multi_sample.txt")[:30000], "", "x"]
    want = [tok.encode(text) for text in batch]
    made = []
    monkeypatch.setattr(nbbpe.tokenizer, "_JoinedIds",
                        lambda *args: made.append(_JoinedIds(*args)) or made[-1])
    for threads in (1, 2, 3):
        ids, offsets = tok.encode_batch_to_numpy(batch, num_threads=threads)
        assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want
        assert isinstance(lease_of(ids), _ResultLease) and len(ids) == offsets[-1]
    assert len(made) == 3

    def no_room(*args):
        raise MemoryError
    monkeypatch.setattr(nbbpe.tokenizer, "_JoinedIds", no_room)
    ids, offsets = tok.encode_batch_to_numpy(batch, num_threads=2)
    assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want


def lease_of(ids: np.ndarray):
    """What a NumPy array's memory belongs to: the end of its chain of bases."""
    while isinstance(ids, np.ndarray) and ids.base is not None:
        ids = ids.base
    return ids


def test_a_batchs_result_memory_goes_to_the_next_batch_once_let_go_of(gpt2, monkeypatch):
    # A result is a view of memory lent to it (`_ResultLease`); once the result and every view
    # of it are gone, the next batch's result takes that memory, its pages already in, rather
    # than memory mapped afresh. A result still held keeps its memory and its ids.
    from nbbpe import tokenizer as tk

    monkeypatch.setattr(tk, "_spare_results", [])
    first = read("web_sample.txt").split(EOT) * 3
    second = read("multi_sample.txt").split("\n") * 2
    want_first = gpt2.encode_batch(first, num_threads=1)
    want_second = gpt2.encode_batch(second, num_threads=1)

    def texts_of(ids, offsets):
        return [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]

    ids, offsets = gpt2.encode_batch_to_numpy(first, num_threads=2)
    held = ids.ctypes.data
    view = ids[5:]  # a view keeps the memory as the result does
    del ids
    again, again_offsets = gpt2.encode_batch_to_numpy(second, num_threads=2)
    assert again.ctypes.data != held and texts_of(again, again_offsets) == want_second
    assert view.tolist() == np.concatenate([np.array(t, np.uint16) for t in want_first])[5:].tolist()
    del view
    assert len(tk._spare_results) == 1
    ids, offsets = gpt2.encode_batch_to_numpy(first, num_threads=2)
    assert ids.ctypes.data == held and texts_of(ids, offsets) == want_first
    assert texts_of(again, again_offsets) == want_second  # untouched by the batch after it
    del ids, offsets, again
    assert len(tk._spare_results) == 1  # one block kept at most: the other let go of
    # A block whose written bytes are more than `_KEPT_WRITTEN` is let go of, not kept.
    monkeypatch.setattr(tk, "_KEPT_WRITTEN", 1000)
    tk._spare_results.clear()
    ids, _ = gpt2.encode_batch_to_numpy(first, num_threads=2)
    assert ids.nbytes > 1000
    del ids
    assert tk._spare_results == []
    # A block without room for a batch's bound is let go of, and the batch takes a larger one.
    monkeypatch.setattr(tk, "_KEPT_WRITTEN", 32 << 20)
    small, _ = gpt2.encode_batch_to_numpy(first, num_threads=2)
    small_block = lease_of(small)._block
    del small
    assert tk._spare_results[0][0] is small_block
    big, big_offsets = gpt2.encode_batch_to_numpy(first * 2, num_threads=2)
    assert lease_of(big)._block is not small_block and texts_of(big, big_offsets) == want_first * 2
    assert tk._spare_results == []  # (the small block let go of)


def test_a_batch_that_fails_lets_its_result_memory_go_as_written(gpt2_files, monkeypatch):
    # The ids placed so far count as written when a batch fails midway: its block is kept for
    # the next batch only if no more than `_KEPT_WRITTEN` bytes were written into it.
    from nbbpe import tokenizer as tk

    monkeypatch.setattr(tk, "_GROUP_CHARS", 3000)  # one thread, groups one after another
    monkeypatch.setattr(tk, "_spare_results", [])
    monkeypatch.setattr(tk, "_KEPT_WRITTEN", 1000)
    tok = Tokenizer(*gpt2_files, [EOT])
    batch = read("web_sample.txt").split(EOT) + ["the last text"]
    real = tok._encode_pieces

    def fails_at_the_last(pieces, dtype):
        if pieces[-1] == "the last text":
            raise RuntimeError("a group failed")
        return real(pieces, dtype)

    monkeypatch.setattr(tok, "_encode_pieces", fails_at_the_last)
    with pytest.raises(RuntimeError, match="a group failed"):
        tok.encode_batch_to_numpy(batch, num_threads=1)
    assert tk._spare_results == []  # more than 1000 bytes of ids were written
    monkeypatch.setattr(tk, "_KEPT_WRITTEN", 32 << 20)
    with pytest.raises(RuntimeError, match="a group failed"):
        tok.encode_batch_to_numpy(batch, num_threads=1)
    assert len(tk._spare_results) == 1 and tk._spare_results[0][1] > 1000


def test_a_group_that_waits_keeps_its_ids_though_its_threads_buffer_is_reused():
    # On threads, a group's ids come as a view of its thread's output buffer (int32), which
    # that thread's next group overwrites: a group placed at once is copied before `add`
    # returns; one that waits for an earlier group must keep a copy of its own.
    from nbbpe.tokenizer import _JoinedIds

    joined = _JoinedIds(3, 100, np.uint16)
    buffer = np.array([5, 6, 7, 8], np.int32)  # one thread's buffer, reused for each group
    joined.add(1, (buffer[:2], np.array([2])))  # waits for group 0
    buffer[:] = [9, 9, 9, 9]
    joined.add(0, (buffer[:1], np.array([1])))  # placed at once, with group 1 after it
    buffer[:] = [3, 4, 0, 0]
    joined.add(2, (buffer[:2], np.array([1, 2])))
    buffer[:] = 0
    ids, offsets = joined.result(4)
    assert ids.tolist() == [9, 5, 6, 3, 4] and offsets.tolist() == [0, 1, 3, 4, 5]
    assert ids.dtype == np.uint16


def _vm_flags(address: int) -> list[str]:
    """The flags (/proc/self/smaps' VmFlags) of the memory mapping that holds `address`."""
    holds = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's first line: its range
                low, high = (int(x, 16) for x in fields[0].split("-"))
                holds = low <= address < high
            elif holds and fields[0] == "VmFlags:":
                return fields[1:]
    raise LookupError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not (sys.platform.startswith("linux") and Path("/proc/self/smaps").exists()),
                    reason="reads Linux's /proc/self/smaps")
def test_a_batchs_result_is_on_small_pages(gpt2):
    # NumPy asks for huge pages for arrays of 4 MB and more, and where free memory is
    # fragmented the first write into each 2 MB waited for the kernel to compact memory. The
    # result a batch's groups are copied into is a mapping of its own that asks for small
    # pages (VmFlags "nh"), all of it; a small NumPy array asks for nothing.
    import mmap

    from nbbpe.tokenizer import _JoinedIds, _small_page_block

    if not hasattr(mmap, "MADV_NOHUGEPAGE"):
        pytest.skip("this Python's mmap has no MADV_NOHUGEPAGE")
    big = np.empty(8 << 20, dtype=np.uint8)
    assert "nh" not in _vm_flags(big.ctypes.data + (4 << 20))
    joined = _JoinedIds(4, 5 << 20, np.uint16)  # 10 MB
    ids = joined._ids
    for at in (0, ids.nbytes // 2, ids.nbytes - 1):
        assert "nh" in _vm_flags(ids.ctypes.data + at), at
    small = _small_page_block(100)  # less than a page: a page of its own, writable
    assert len(small) == 100 and "nh" in _vm_flags(small.ctypes.data)
    small[:] = 3
    ids[:] = 7  # the memory is the array's, as before
    assert int(ids[-1]) == 7 and int(small.sum()) == 300


# Lengths read by a compiled loop, which knows how CPython holds each str; and in Python, which
# counts 4 bytes a character for a text that is not ASCII.
@pytest.mark.parametrize("texts, width", [(300, 3), (100, 4)])
def test_a_batchs_result_has_room_for_an_id_per_utf8_byte_and_no_more(gpt2, monkeypatch, texts,
                                                                       width):
    # Allocated for the most UTF-8 bytes the texts can take (not 4 bytes a character): a result
    # of a few MB is then below the size malloc maps afresh for, so a batch after a batch
    # reuses the memory the last one let go of. Here every byte is an id of its own (control
    # characters GPT-2 never merges), so the ids fill exactly that room.
    from nbbpe import tokenizer as tk

    capacities = []

    class Recorded(tk._JoinedIds):
        def __init__(self, groups, capacity, dtype):
            capacities.append(capacity)
            super().__init__(groups, capacity, dtype)

    monkeypatch.setattr(tk, "_JoinedIds", Recorded)
    unmerged = "\x00\x01\x02\x03 \x04\x05\x06\x07\x08\x0e\x0f"
    batch = [unmerged * (k % 7 + 60) for k in range(texts)]  # past conftest's 64K for 2 threads
    batch[texts // 2] += "\xe9\u4e2d"  # one text not ASCII: 2 + 3 bytes at most a character
    want = [gpt2.encode(text) for text in batch]
    ids, offsets = gpt2.encode_batch_to_numpy(batch, num_threads=2)
    assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want
    utf8 = sum(len(text.encode()) for text in batch)
    assert len(ids) == utf8 - 5 + len(gpt2.encode("\xe9\u4e2d"))  # the ASCII: an id a byte
    other = batch[texts // 2]  # held in 2 bytes a character: 3 at most in UTF-8
    assert capacities == [utf8 - len(other.encode()) + width * len(other)]


def test_a_batch_asking_for_threads_starts_them_even_if_too_small_to_use_them(gpt2):
    # A first small batch (the warm-up of a program that will send big ones) starts the pool
    # of the threads asked for, so that the first big batch does not wait for them to start.
    import nbbpe.tokenizer

    old = nbbpe.tokenizer._pools.pop(6, None)
    if old is not None:
        old.shutdown()
    assert gpt2.encode_batch(["tiny", "batch"], num_threads=7) == [gpt2.encode("tiny"),
                                                                   gpt2.encode("batch")]
    pool = nbbpe.tokenizer._pools[6]
    assert len(pool._threads) == 6
    assert gpt2.encode_batch(["again"], num_threads=7) == [gpt2.encode("again")]
    assert nbbpe.tokenizer._pools[6] is pool  # started once
    with pytest.raises(ValueError, match="num_threads must be a positive integer"):
        gpt2.encode_batch(["x"], num_threads=0)


def test_a_batch_asking_for_threads_has_them_make_the_tokenizers_state(gpt2_files):
    # ... and each pool thread makes the tokenizer's state (scratch space, buffers) then, in
    # the background, not in the first batch that uses the thread; once per tokenizer.
    import nbbpe.tokenizer

    tok = Tokenizer(*gpt2_files, [EOT])
    pool = nbbpe.tokenizer._thread_pool(1)  # the one other thread of 2-thread batches

    def has_state():
        return getattr(tok._threads, "state", None) is not None

    assert not pool.submit(has_state).result()
    assert tok.encode_batch(["tiny"], num_threads=2) == [tok.encode("tiny")]
    assert pool.submit(has_state).result()  # (the pool's one thread takes tasks in turn)
    state = pool.submit(tok._thread_state).result()
    tok.encode_batch(["tiny"], num_threads=2)
    assert pool.submit(tok._thread_state).result() is state  # made once
    # ... with buffers as large as a batch's groups need: a batch that uses the thread keeps them
    out, utf8 = state.out, state.utf8
    assert len(out) >= encode.GROUP_OUT_ITEMS and len(utf8) >= encode.GROUP_UTF8_BYTES
    texts = [read("multi_sample.txt")[:150_000], read("web_sample.txt") * 40]
    assert tok.encode_batch(texts, num_threads=2) == [tok.encode(text) for text in texts]
    assert state.out is out and state.utf8 is utf8


# Surrogates a str may hold: a pair (one character in UTF-8) and lone ones (U+FFFD each).
SURROGATES = ["\ud83d\ude00", "\ud800", "\udfff", "\udc00 ", "a\ud83d"]
surrogate_texts = st.lists(st.one_of(pieces, st.sampled_from(SURROGATES)), max_size=25).map("".join)


@settings(max_examples=60)
@given(st.lists(st.one_of(texts, surrogate_texts), min_size=1, max_size=5), st.integers(1, 12))
def test_batches_are_cut_into_groups_where_ids_cannot_change(gpt2, batch, groups):
    from nbbpe.tokenizer import (_piece_span, _piece_text, _safe_cuts_maker, _split_into_groups,
                                 _utf8)

    lengths = np.array([len(text) for text in batch], dtype=np.int64)
    total = int(lengths.sum())
    bounds = np.unique((total * np.arange(1, groups + 1)) // groups)
    cut = _safe_cuts_maker(gpt2.special_tokens, gpt2.pattern)
    pieces, last, made = _split_into_groups(batch, lengths, bounds, cut)
    assert [p for group in made for p in group] == pieces and len(made) <= len(bounds)
    assert all(made) or pieces == [] and made == [[]]
    if pieces is not batch:
        assert any(type(p) is tuple for p in pieces)
    first = [0, *(last[:-1] + 1).tolist()]
    assert last[-1] == len(pieces) - 1
    for k, text in enumerate(batch):
        own = pieces[first[k] : last[k] + 1]
        assert all(_piece_span(p)[0] is text for p in own)
        if len(own) == 1:  # not cut
            assert own[0] is text
            continue
        parts = [_piece_text(p) for p in own]
        assert all(parts) and "".join(parts) == text
        # each piece's UTF-8 (lone surrogates as U+FFFD, as encode reads them) is its part
        assert b"".join(map(_utf8, parts)) == _utf8(text)
        assert [i for part in parts for i in gpt2.encode(part)] == gpt2.encode(text)


def test_groups_end_near_their_bounds_inside_a_long_text_or_between_short_ones():
    # multi_1M's groups had been cut apart from its longest text's pieces: of 22K and 324K
    # characters for a target of 170K. A group ends after the text holding its bound, at its
    # start if the bound is within a quarter of a group of that, and inside it, at its first
    # safe place, if the bound is farther than that from both of its ends.
    from nbbpe.tokenizer import _safe_cuts_maker, _split_into_groups

    words = "lorem ipsum dolor sit amet " * 4000  # 108,000 characters, cut after any word
    batch = ["a" * 900, words, "b" * 1000, "c" * 50_000, "d" * 12_000, "e" * 4_000]
    lengths = np.array([len(t) for t in batch], dtype=np.int64)
    bounds = (int(lengths.sum()) * np.arange(1, 9)) // 8  # 22,000 each
    pieces, last, groups = _split_into_groups(batch, lengths, bounds,
                                              _safe_cuts_maker(["<|endoftext|>"], GPT2_PATTERN))
    sizes = [sum(len(p) if type(p) is str else p[2] - p[1] for p in group) for group in groups]
    assert sum(sizes) == sum(lengths) and last.tolist() == [0, 5, 6, 7, 8, 9]
    assert [type(p) for p in pieces[1:6]] == [tuple] * 5 and pieces[6] is batch[2]
    # four groups end inside `words`, a word past their bounds (of 21,987 characters each); the
    # fifth at the start of "c" * 50,000, 37 characters past its bound; that text has no safe
    # place (no space): the two bounds deeper inside it both end a group after it
    assert all(abs(size - 21_987) < 60 for size in sizes[:5]) and groups[4][-1] is batch[2]
    assert len(groups) == 7 and groups[5] == [batch[3]] and groups[6] == [batch[4], batch[5]]
    none = _split_into_groups(["x" * 100] * 3, np.array([100] * 3), np.array([150, 300]),
                              lambda text, at, before: None)
    assert none[0] == ["x" * 100] * 3 and len(none[2]) == 2  # snapped to a text's end
    # short texts: a group ends after the one holding its bound, or before it if the bound is
    # where it starts (25 and 75 fall inside texts 2 and 7, 50 where text 5 starts)
    short = _split_into_groups(["x" * 10] * 10, np.array([10] * 10), np.array([25, 50, 75, 100]),
                               lambda text, at, before: None)
    assert [len(group) for group in short[2]] == [3, 2, 3, 2]


def test_text_cuts_avoid_special_tokens_and_surrogate_pairs():
    from nbbpe.corpus import safe_text_cut

    text = "word \ud83d\ude00 x<|a b|>y\n" * 50
    starts = [k for k in range(len(text)) if text.startswith("<|a b|>", k)]
    # searched from every place, inside the token too
    cuts = {safe_text_cut(text, at, ["<|a b|>"]) for at in range(len(text))} - {None}
    assert len(cuts) > 100 and 0 < min(cuts) and max(cuts) < len(text)
    for cut in cuts:  # next to ASCII on both sides, or where the special token starts
        assert cut in starts or (text[cut - 1].isascii() and text[cut] in " \n")
        assert not any(0 < cut - k < 7 for k in starts)
    assert all(safe_text_cut(text, at, ["<|a b|>"]) >= at for at in range(1, len(text) - 30))
    only_specials = {safe_text_cut(text, at, ["<|a b|>"], whitespace_cuts=False)
                     for at in range(len(text))} - {None}
    assert only_specials == set(starts)
    # A special token holding U+FFFD may match where the str has a lone surrogate: no cut.
    assert {safe_text_cut("ab \ud800 cd " * 30, at, ["\ufffd"]) for at in range(1, 300)} == {None}


def test_text_cuts_follow_the_pattern_and_stop_where_asked():
    # By default a cut follows an ASCII letter or digit; the built-in patterns allow more (GPT-2's
    # any non-space character, cl100k's and o200k's any letter or digit), so that text without
    # ASCII can be cut for the threads too. `before` ends the search.
    from nbbpe import O200K_PATTERN
    from nbbpe.corpus import safe_text_cut

    assert [safe_text_cut("ab cd ef", at) for at in (1, 3, 6)] == [2, 5, None]
    assert safe_text_cut("ab cd ef", 3, before=5) is None
    assert safe_text_cut("ab cd ef", 3, before=6) == 5
    russian = "Привет, мир\nи всё"
    assert safe_text_cut(russian, 1) is None
    for pattern in (GPT2_PATTERN, CL100K_PATTERN, O200K_PATTERN):
        assert safe_text_cut(russian, 1, pattern=pattern) == (7 if pattern == GPT2_PATTERN else 11)
        assert safe_text_cut(russian, 1, pattern=pattern, whitespace_cuts=False) is None
    # punctuation before a newline: cl100k's and o200k's take both, so they cut after it
    chinese = "你好。\n世界。"
    assert safe_text_cut(chinese, 1, pattern=GPT2_PATTERN) == 3
    assert safe_text_cut(chinese, 1, pattern=CL100K_PATTERN) == 4
    assert safe_text_cut(chinese, 1, pattern=O200K_PATTERN) == 4
    assert safe_text_cut("你好。\n。世界", 1, pattern=O200K_PATTERN) is None


def test_one_tokenizer_shared_by_many_threads(gpt2_files):
    from concurrent.futures import ThreadPoolExecutor

    shared = Tokenizer(*gpt2_files, [EOT], cache_size=50)  # small caches: restarted often
    texts = [read(name) for name in FIXTURE_TEXTS] * 3
    want = [Tokenizer(*gpt2_files, [EOT]).encode(t) for t in texts]
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(shared.encode, texts))
    assert got == want


def test_many_threads_on_the_short_path_while_the_shared_cache_restarts(gpt2_files):
    # Thousands of short texts, each one call of the short path (its arguments packed per
    # thread), while a small shared cache fills and starts again under the other threads.
    from concurrent.futures import ThreadPoolExecutor

    lines = [line for name in FIXTURE_TEXTS for line in read(name).splitlines() if line][:4000]
    shared = Tokenizer(*gpt2_files, [EOT], cache_size=300)
    uncached = Tokenizer(*gpt2_files, [EOT], cache_size=0)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(shared.encode, lines))
        arrays = list(pool.map(shared.encode_to_numpy, lines))
    assert shared._get_engine().cache.table.fill[2] > 0  # it started again
    assert len(lines) > 1000
    for line, ids, array in zip(lines, got, arrays):
        assert ids == uncached.encode(line) == array.tolist()


def test_a_large_batch_checks_and_measures_its_texts_compiled(gpt2):
    # From `_COUNTED_FROM` texts a compiled loop reads their lengths; anything but a str sends
    # the batch the Python way, which names a text that is not one, and encodes subclasses.
    import nbbpe.tokenizer

    class Text(str):
        pass

    texts = ["caf\xe9 and more ", "plain words", "\U0001f642!", ""] * 80
    assert len(texts) >= nbbpe.tokenizer._COUNTED_FROM
    want = [gpt2.encode(text) for text in texts]
    assert gpt2.encode_batch(texts) == want
    assert gpt2.encode_batch(texts[:100] + [Text(texts[100])] + texts[101:]) == want
    with pytest.raises(TypeError, match="text 257 expects a str, got bytes"):
        gpt2.encode_batch(texts[:257] + [b"x"] + texts[258:])


def test_batches_from_many_threads_at_once(gpt2_files, monkeypatch):
    # Each calling thread, and each pool thread, gathers its groups' UTF-8 into its own buffer
    # (`text_bytes.gather`), without the GIL: batches of texts of every str kind sent by four
    # threads at once, each batch cut into groups, give each text's own ids.
    from concurrent.futures import ThreadPoolExecutor

    import nbbpe.tokenizer

    monkeypatch.setattr(nbbpe.tokenizer, "_GROUP_CHARS", 3000)
    monkeypatch.setattr(nbbpe.tokenizer, "_MIN_GROUP_CHARS", 500)
    shared = Tokenizer(*gpt2_files, [EOT])
    docs = read("web_sample.txt").split(EOT) + read("multi_sample.txt").split("\n")
    docs += ["caf\xe9 " * 40, "\u0416\u0416 " * 50, "\U0001f642 ok " * 30, "", "x"]
    batches = [docs[k::3] + docs[: 20 * k] for k in range(1, 5)]
    want = [[shared.encode(text) for text in batch] for batch in batches]

    def encode(batch):
        ids, offsets = shared.encode_batch_to_numpy(batch, num_threads=2)
        return [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]

    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            assert list(pool.map(encode, batches)) == want


def test_threads_growing_the_shared_cache_at_once(gpt2_files):
    # Four threads meet 20,000 new words of 60 to 99 letters in different orders: each takes a
    # record of ~47 items (its ids and bytes), so the cache they share, which has room for its
    # whole limit of pre-tokens but 8 record items each, runs out of records first and grows
    # (four times the records, room for the whole limit still) while the others go on storing.
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(7)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = [" " + "".join(rng.choice(letters, int(rng.integers(60, 100))))
             for _ in range(20_000)]
    texts = ["".join(words), "".join(reversed(words)), "".join(words[::2] + words[1::2]),
             "".join(words[1::2] + words[::2])]
    shared = Tokenizer(*gpt2_files, [EOT], cache_size=1 << 16)
    uncached = Tokenizer(*gpt2_files, [EOT], cache_size=0)
    cache = shared._get_engine().cache
    first_records = len(cache.table.records)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(shared.encode_to_numpy, texts))
    assert len(cache.table.records) >= 4 * first_records  # it grew
    assert int(cache.table.fill[2]) == 0  # and never started again
    assert cache.table.max_entries - int(cache.vocab.fill[1]) >= cache.limit  # no smaller
    for text, ids in zip(texts, got):
        assert ids.tolist() == uncached.encode(text)


def test_a_batch_on_threads_with_a_custom_pattern(gpt2_files):
    # The regex path: groups of texts on threads, no cutting of long texts.
    tok = Tokenizer(*gpt2_files, [EOT], pattern=r"\w+|\s+|[^\w\s]+")
    documents = read("web_sample.txt").split(EOT) * 4 + read("multi_sample.txt").split("\n")
    want = [tok.encode(d) for d in documents]
    assert sum(len(d) for d in documents) > 1 << 17  # enough for two threads
    for threads in (2, 3):
        assert tok.encode_batch(documents, num_threads=threads) == want


@pytest.mark.parametrize("threads", [1, 2])
def test_a_batch_of_ascii_other_text_lone_surrogates_and_str_subclasses(gpt2, threads):
    # A group of ASCII texts is joined and copied; other groups are encoded text by text, and one
    # holding a lone surrogate has it replaced as encode does (U+FFFD, pairs joined). NumPy's
    # str_ (what iterating an array of str gives) is a str.
    batch = ["plain ASCII text", "caf\u00e9 \u4e2d\u6587", "lone \ud800 high", "pair \ud83d\ude00 ok",
             np.str_("a subclass of str"), ""]
    want = [gpt2.encode(str(text)) for text in batch]
    assert gpt2.encode_batch(batch, num_threads=threads) == want
    assert gpt2.encode_batch(batch[:1] + batch[4:], num_threads=threads) == want[:1] + want[4:]
    assert gpt2.decode(want[2]) == "lone \ufffd high"


@pytest.mark.parametrize("threads", [1, 2])
def test_str_subclasses_beside_a_long_text_that_is_cut(gpt2_files, monkeypatch, threads):
    # A batch with a text long enough to be cut: the texts not cut, str subclasses among them
    # (NumPy's str_, of 3 characters too: it would unpack as (text, start, end)), are pieces
    # of their own, whatever their type.
    import nbbpe.tokenizer

    monkeypatch.setattr(nbbpe.tokenizer, "_GROUP_CHARS", 3000)
    tok = Tokenizer(*gpt2_files, [EOT])

    class Text(str):
        pass

    batch = [np.str_("abc"), read("web_sample.txt"), Text("a subclass, long enough " * 10),
             np.str_("caf\u00e9 " * 800)]
    want = [tok.encode(str(text)) for text in batch]
    assert len(batch[1]) > 2 * 3000
    assert tok.encode_batch(batch, num_threads=threads) == want


@pytest.mark.parametrize("threads", [1, 2])
def test_a_batchs_ascii_texts_are_read_where_they_are(gpt2_files, tiktoken_gpt2, monkeypatch,
                                                      threads):
    # The kernel reads a batch's ASCII texts in their str, each document at its own address
    # (`encode_documents`' doc_addresses), the others transcoded into the thread's buffer; with
    # every way a call stops and is called again: pre-tokens too long for the pass (at a text's
    # start, middle and end), a full output buffer, a cache that grows, special tokens.
    from nbbpe import encode

    monkeypatch.setattr(encode, "_OUT_ITEMS", 700)
    tok = Tokenizer(*gpt2_files, [EOT], cache_size=256)
    seen = []
    real = encode.DocumentEncoder.encode

    def encode_spied(self, buf, doc_ends, separator, state, doc_out_ends, dtype,
                     doc_addresses=None):
        if doc_addresses is not None:  # ASCII ones outside the thread's buffer: in their str
            inside = (doc_addresses >= address(state.utf8)) & (
                doc_addresses < address(state.utf8) + len(state.utf8))
            seen.append(int((~inside).sum()))
        return real(self, buf, doc_ends, separator, state, doc_out_ends, dtype, doc_addresses)

    monkeypatch.setattr(encode.DocumentEncoder, "encode", encode_spied)
    rng = np.random.default_rng(3)
    words = read("web_sample.txt").split(" ")[:3000]
    texts = []
    for k in range(400):
        text = " ".join(rng.choice(words, rng.integers(0, 60)))
        if k % 7 == 0:
            text = "x" * 300 + text  # a long pre-token first
        if k % 11 == 0:
            text += " " + "y" * 400  # ... last
        if k % 13 == 0:
            text = text[: len(text) // 2] + " z" + "7" * 500 + " " + text[len(text) // 2 :]
        if k % 5 == 0:
            text += EOT
        if k % 3 == 0:
            text += " caf\u00e9 \u4e2d\u6587"  # not ASCII: transcoded
        texts.append(text)
    want = [tiktoken_gpt2.encode(text, allowed_special="all") for text in texts]
    assert tok.encode_batch(texts, num_threads=threads) == want
    assert sum(seen) >= 200  # most texts were read in place
    assert entries_in(tok._get_engine().cache.table) > 256  # the cache grew


def test_a_document_read_in_place_is_not_read_past_its_page(gpt2_files, tiktoken_gpt2):
    # A document read where it lies may be read up to 64 bytes past its end (its last bytes are
    # then cut a block at a time), but never past the end of its page of memory: here the next
    # page cannot be read at all, and documents end at and just before its start.
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    memory = mmap.mmap(-1, 2 * page)
    first = ctypes.c_char.from_buffer(memory)
    start = ctypes.addressof(first)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    tok = Tokenizer(*gpt2_files, [EOT])
    text = (" The quick brown fox jumps over the lazy dog, 1234567 times." * 40).encode()
    try:
        for gap in (0, 1, 5, 63, 64, 200):  # bytes between the document's end and the page's
            for length in (1, 2, 17, 63, 64, 65, 130, 1000):
                doc = text[-length:]
                at = page - gap - length
                memory[at : at + length] = doc
                assert libc.mprotect(start + page, page, 0) == 0  # PROT_NONE
                ends = np.array([length], dtype=np.int64)
                ids, out_ends = tok._encode_located(np.zeros(1, np.uint8), ends,
                                                    np.array([start + at], np.int64), np.int32)
                assert libc.mprotect(start + page, page, mmap.PROT_READ | mmap.PROT_WRITE) == 0
                assert ids.tolist() == tiktoken_gpt2.encode_ordinary(doc.decode())
                assert out_ends.tolist() == [len(ids)]
    finally:
        libc.mprotect(start + page, page, mmap.PROT_READ | mmap.PROT_WRITE)
        del first  # (the buffer is exported while it lives)
        memory.close()


def test_encode_batch_rejects_a_single_string(gpt2):
    with pytest.raises(TypeError, match="not a single str"):
        gpt2.encode_batch("text")
    with pytest.raises(TypeError, match="text 1"):
        gpt2.encode_batch(["ok", b"bytes"])
    with pytest.raises(ValueError, match="num_threads"):
        gpt2.encode_batch(["ok"], num_threads=0)


def test_merged_ids_are_computed_only_where_they_follow_the_ranks(gpt2, gpt2_files):
    # GPT-2's merge k makes id 256 + k: the merge loop computes the id instead of loading it
    assert gpt2._get_engine().ranks.merged_offset == 256
    vocab, merges = gpt2_files
    moved = {(i if i <= 300 else i + 1000): token for i, token in vocab.items()}
    assert Tokenizer(moved, merges, [EOT])._get_engine().ranks.merged_offset == -1
    swapped = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b"aba"}
    merges = [(b"ab", b"a"), (b"a", b"b")]  # merge 0 makes 257, merge 1 makes 256
    assert Tokenizer(swapped, merges)._get_engine().ranks.merged_offset == -1


@pytest.mark.parametrize("seed", range(4))
def test_the_rank_table_finds_every_pair_and_no_other(seed):
    # the table is laid out in NumPy (`_fill_ranks`); a lookup probes from the pair's home slot
    # to the first empty one (`_pair_rank`, the kernels' own). Half the pairs here have their
    # home in the last 4 of 128 slots, so their runs pass the table's end and wrap around.
    from nbbpe import encode

    rng = np.random.default_rng(seed)
    bits, id_bits = 7, 11  # what build_ranks picks for 40 pairs of ids below 2048
    near_end, anywhere = set(), set()
    while len(near_end) < 20 or len(anywhere) < 20:
        a, b = (int(x) for x in rng.integers(1024, 2048, 2))  # above the dense table's ids
        home = ((a << id_bits | b) * int(encode._GOLDEN) % 2**64) >> (64 - bits)
        (near_end if home >= 124 else anywhere).add((a, b))
    pairs = sorted(near_end)[:20] + sorted(anywhere - near_end)[:20]
    left, right = (np.array(side, dtype=np.int64) for side in zip(*pairs))
    rank = rng.permutation(len(pairs)).astype(np.int64)
    ranks = encode.build_ranks(left, right, rank, rank + 2048, np.arange(256), encode.MERGES)
    assert (len(ranks.slots), ranks.id_bits, ranks.dense_bits) == (1 << bits, id_bits,
                                                              encode.DENSE_BITS)
    assert (ranks.slots != -1).sum() == len(pairs)
    where = {entry >> ranks.rank_bits: k for k, entry in enumerate(ranks.slots.tolist())}
    assert any(where[a << id_bits | b] < 64 for a, b in pairs[:20])  # wrapped around
    for (a, b), r in zip(pairs, rank.tolist()):
        assert encode._pair_rank(ranks, a, b) == r  # so each one's bit in `listed` is set
    # `listed`: a bit per 1/8 slot, set where a pair hashes (at most one each), read first
    assert len(ranks.listed) * 64 == len(ranks.slots) << encode.LISTED_BITS
    assert 0 < np.unpackbits(ranks.listed.view(np.uint8)).sum() <= len(pairs)
    for a, b in rng.integers(1024, 2048, (200, 2)).tolist():
        if (a, b) not in pairs:
            assert encode._pair_rank(ranks, a, b) == encode.NO_MERGE


def test_pairs_of_small_ids_find_the_merges_ranks_on_both_sides_of_the_dense_table(gpt2,
                                                                                     gpt2_files):
    # Pairs of ids below 2**DENSE_BITS are read from the dense table, the others from the hash
    # table: around the edge between the two, with GPT-2's merges, each pair gets its merge's
    # rank or none.
    from nbbpe import encode

    vocab, merges = gpt2_files
    id_of = {token: i for i, token in vocab.items()}
    rank_of = {(id_of[a], id_of[b]): r for r, (a, b) in enumerate(merges)}
    ranks = gpt2._get_engine().ranks
    edge = 1 << ranks.dense_bits
    assert ranks.dense_bits == encode.DENSE_BITS
    near = [pair for pair in rank_of if max(pair) < 2 * edge]
    dense = sum(max(pair) < edge for pair in near)
    assert dense > 200 and len(near) - dense > 200  # merges on either side of the edge
    rng = np.random.default_rng(0)
    others = [tuple(pair) for pair in rng.integers(0, 2 * edge, (3000, 2)).tolist()]
    others += [(a, b) for a in (edge - 1, edge) for b in range(0, 2 * edge, 7)]
    for a, b in near + others:
        assert encode._pair_rank(ranks, a, b) == rank_of.get((a, b), encode.NO_MERGE), (a, b)


def test_a_vocab_with_gaps_in_its_ids(gpt2_files):
    vocab, merges = gpt2_files
    # the same tokens, with every id above 300 moved up by 1000
    moved = {(i if i <= 300 else i + 1000): token for i, token in vocab.items()}
    tok = Tokenizer(moved, merges, [EOT])
    text = read("web_sample.txt")
    ids = Tokenizer(vocab, merges, [EOT]).encode(text)
    assert tok.encode(text) == [i if i <= 300 else i + 1000 for i in ids]
    assert tok.decode(tok.encode(text)) == text


def test_the_short_path_calls_the_kernel_at_its_address_and_falls_back_the_long_way(
        gpt2_files, tiktoken_gpt2, monkeypatch):
    # From a second text on, each goes through one compiled call (`_short_path`) that runs
    # the kernel where it reads the text; a text the kernel stops in (a pre-token too long for
    # the pass, more ids than the buffer holds) goes the long way. Without the kernel's address,
    # a call that compiles (another Numba) or objects laid out as it reads them, every text goes
    # the long way. The ids are tiktoken's either way.
    texts = ["Hello you", "", "x" * 5000 + " end", "Héllo wörld 😀 " * 3, read("corpus.en") * 4,
             "Hello again", " " * 300 + "tail", read("web_sample.txt").replace(EOT, "")[:3000],
             "Hello  "]
    assert len(texts[-2].encode()) > encode.COPY_UP_TO  # read where it is, not copied
    tokenizer = Tokenizer(*gpt2_files, [EOT])
    assert tokenizer.encode("one text") == tiktoken_gpt2.encode_ordinary("one text")
    for text in texts:
        expected = tiktoken_gpt2.encode_ordinary(text)
        assert tokenizer.encode(text) == expected
        assert tokenizer.encode_to_numpy(text).tolist() == expected
        state = tokenizer._thread_state()
        assert state.text_call is not None and state.text_args.values[encode.KERNEL_AT] != 0

    def uncompilable():
        raise TypeError("this Numba's calling convention has changed")

    for name, value in (("short_path_address", uncompilable),
                        ("native_address", lambda *args: None),
                        ("object_layout_known", lambda: False),
                        ("_c_api_addresses", lambda: (None,))):  # no PyArray_New found
        monkeypatch.setattr(encode, name, value)
        without = Tokenizer(*gpt2_files, [EOT])
        for text in texts:
            assert without.encode(text) == tiktoken_gpt2.encode_ordinary(text)
            assert without._thread_state().text_call is None


def test_the_short_path_is_loaded_by_a_first_text_if_cached_else_by_the_second(
        gpt2_files, tiktoken_gpt2, monkeypatch):
    # In Numba's cache, `_short_path` is loaded by the first text (loaded by the second, it
    # took 3-8 ms of the first document after a warm-up); not cached, the first text does not
    # compile it (0.2-0.4 s, for a CLI's one text), the second does.
    for cached, ready_from in ((True, 1), (False, 2)):
        monkeypatch.setattr(encode, "short_path_cached", lambda: cached)
        tokenizer = Tokenizer(*gpt2_files, [EOT])
        ready = []
        for k, text in enumerate(("one text", "a second", "a third"), 1):
            assert tokenizer.encode(text) == tiktoken_gpt2.encode_ordinary(text)
            ready.append(tokenizer._thread_state().text_call is not None)
        assert ready == [k >= ready_from for k in (1, 2, 3)]


def test_uint16_ids_are_narrowed_by_the_short_paths_compiled_call(gpt2_files, tiktoken_gpt2,
                                                                   monkeypatch):
    # encode_to_numpy's default uint16 ids are rewritten as uint16 in place by `_short_path`
    # (no astype): from the third text on, each is one compiled call, never the long way, and its
    # ids (high ones too: 43,453 and the special 50,256) are tiktoken's, in any dtype asked for.
    tokenizer, _ = tokenizer_with_short_path(gpt2_files)  # from the third text on
    long_way = []
    original = encode.DocumentEncoder.encode_text_long
    monkeypatch.setattr(encode.DocumentEncoder, "encode_text_long",
                        lambda self, *args: long_way.append(1) or original(self, *args))
    texts = ["Hi", " SolidGoldMagikarp" * 3, f"a{EOT}b", read("web_sample.txt")[:1500], ""]
    for text in texts:
        expected = tiktoken_gpt2.encode(text, allowed_special="all")
        ids = tokenizer.encode_to_numpy(text)
        assert ids.dtype == np.uint16 and ids.tolist() == expected
        assert ids.base is None  # a copy: the next call reuses the buffer
        for dtype in (np.uint32, np.int64):
            assert tokenizer.encode_to_numpy(text, dtype).tolist() == expected
    assert max(tokenizer.encode_to_numpy(texts[1] + texts[2])) >= 43453
    assert not long_way


def test_the_short_paths_builtin_reads_ascii_str_and_bytes_and_refuses_the_rest(
        gpt2_files, tiktoken_gpt2):
    # `_short_path` is a C function called as a builtin (`kernel_args.fastcall_builtin`): it
    # reads an ASCII str where it lies and a bytes object's UTF-8, with the GIL held or let go
    # (from `RELEASE_GIL_FROM` bytes on; both ways here), and gives the number of ids it left in
    # the thread's buffer, or the ids as a new uint16 or uint32 array or a list, by the kind
    # asked for; any other object or kind, or a str CPython cannot give as UTF-8, gives -1 (for
    # a count) or None (the caller goes the long way) and leaves no exception set.
    tokenizer, state = tokenizer_with_short_path(gpt2_files)
    call, values = state.text_call, state.text_args.values
    web = read("web_sample.txt").replace(EOT, "")
    texts = ["Hi", "x" * (encode.RELEASE_GIL_FROM - 1), "y" * encode.RELEASE_GIL_FROM,
             web.encode("ascii", "ignore").decode()[:3000], "Héllo wörld 😀 " * 30]
    for release_from in (encode.RELEASE_GIL_FROM, 0, 1 << 40):
        values[encode.RELEASE_GIL_FROM_AT] = release_from
        for text in texts:
            expected = tiktoken_gpt2.encode_ordinary(text)
            for given in ((text, text.encode()) if text.isascii() else (text.encode(),)):
                w = call(given, encode.TEXT_COUNT)
                assert w == len(expected) and state.text_ids[w].tolist() == expected
                for kind, dtype in ((encode.TEXT_UINT16, np.uint16),
                                    (encode.TEXT_UINT32, np.uint32)):
                    ids = call(given, kind)
                    assert type(ids) is np.ndarray and ids.dtype == dtype
                    assert ids.tolist() == expected and ids.flags.owndata and ids.flags.writeable
                assert call(given, encode.TEXT_LIST) == expected
            assert tokenizer.encode(text) == expected
    for args in ((bytearray(b"ab"),), (np.str_("ab"),), (3,), ("\ud800",), ("ab", 1)):
        for kind in (encode.TEXT_COUNT, encode.TEXT_UINT16, encode.TEXT_UINT32,
                     encode.TEXT_LIST, -1, 4, 1 << 70, "1", None):
            result = call(*args, kind)
            if len(args) == 1 and kind == encode.TEXT_COUNT:
                assert result == -1
            else:
                assert result is None
    text = "".join(["a", "b"])  # a str of its own
    refcounts = sys.getrefcount(None), sys.getrefcount(text)
    for _ in range(100):  # None given back as a reference of its own; the text left as it was
        call(text, 4)
    assert (sys.getrefcount(None), sys.getrefcount(text)) == refcounts
    assert call("ab", True).tolist() == tiktoken_gpt2.encode_ordinary("ab")  # TEXT_UINT16
    assert sys.exc_info() == (None, None, None)
    # what Tokenizer asks for, written out there (importing `encode` loads Numba)
    from nbbpe import tokenizer as tokenizer_module
    assert (tokenizer_module._AS_UINT16, tokenizer_module._AS_UINT32, tokenizer_module._AS_LIST) == (
        encode.TEXT_UINT16, encode.TEXT_UINT32, encode.TEXT_LIST)
    assert tokenizer.encode("a\ud800b") == tiktoken_gpt2.encode_ordinary("a\ufffdb")


def test_the_short_path_lets_go_of_the_gil_around_the_kernel_from_its_threshold(
        gpt2_files, tiktoken_gpt2):
    # The C functions `_short_path` calls to let go of the GIL and take it again are found in
    # its packed values: here, functions that count their calls instead (the GIL then stays
    # held, as these need it). A text of `RELEASE_GIL_FROM` bytes or more calls the first
    # before the kernel and the second after it, with what the first returned; a shorter one
    # calls neither. (The previous test runs the real ones.)
    import ctypes

    tokenizer, state = tokenizer_with_short_path(gpt2_files)
    values = state.text_args.values
    calls = []
    let_go = ctypes.CFUNCTYPE(ctypes.c_int64)(lambda: calls.append("let go") or 12345)
    take = ctypes.CFUNCTYPE(None, ctypes.c_int64)(lambda state: calls.append(("take", state)))
    values[encode.SAVE_THREAD_AT] = ctypes.cast(let_go, ctypes.c_void_p).value
    values[encode.RESTORE_THREAD_AT] = ctypes.cast(take, ctypes.c_void_p).value
    for n, expected in ((encode.RELEASE_GIL_FROM - 1, []),
                        (encode.RELEASE_GIL_FROM, ["let go", ("take", 12345)]),
                        (5000, ["let go", ("take", 12345)]), (3, [])):
        calls.clear()
        text = ("ab " * n)[:n]
        assert tokenizer.encode(text) == tiktoken_gpt2.encode_ordinary(text)
        assert calls == expected


def test_the_short_paths_results_are_its_own_and_views_are_kept_by_length(gpt2_files,
                                                                           tiktoken_gpt2):
    # The short path's result is made by its call (uint16, uint32, a list) or copied from a view
    # of the thread's buffer made once per w (`encode.IdViews`, other dtypes): each result is
    # its own, which later calls do not change; views of more than `_KEPT_VIEWS` ids are not
    # kept.
    tokenizer, state = tokenizer_with_short_path(gpt2_files)
    first, second = " one two three", " four five six"
    assert len(tiktoken_gpt2.encode(first)) == len(tiktoken_gpt2.encode(second)) == 3
    results = [(tokenizer.encode_to_numpy(t), tokenizer.encode_to_numpy(t, np.uint32),
                tokenizer.encode(t), tokenizer.encode_to_numpy(t, np.int64))
               for t in (first, second)]
    for (u16, u32, ids, i64), text in zip(results, (first, second)):
        expected = tiktoken_gpt2.encode(text)
        assert u16.tolist() == u32.tolist() == ids == i64.tolist() == expected
        assert u16.base is None and u32.base is None and i64.base is None
    assert 3 in state.text_ids and np.shares_memory(state.text_ids[3], state.out)
    long_text = "x " * (encode._KEPT_VIEWS + 10)
    ids = tokenizer.encode_to_numpy(long_text, np.int64)
    assert ids.tolist() == tiktoken_gpt2.encode(long_text)
    assert len(ids) > encode._KEPT_VIEWS and len(ids) not in state.text_ids


@settings(max_examples=100)
@given(texts, st.sampled_from(["x", "s", "ll", " x", "1", "\u0301", "\n", " ", "'s", EOT]))
def test_a_text_after_a_longer_one_on_the_short_path(gpt2, tiktoken_gpt2, text, after):
    # The short path copies each text into the thread's buffer, over what a longer text left
    # there, and lets the kernel read past the text's end (the block scanners, two-word keys):
    # the ids are the text's alone.
    gpt2.encode("warm-up: the second text on takes the short path")
    gpt2.encode(text + after * 40)
    assert gpt2._thread_state().text_call is not None
    assert gpt2.encode(text) == gpt2.encode_to_numpy(text).tolist() == tiktoken_gpt2.encode(
        text, allowed_special="all")


def test_a_text_longer_than_the_threads_buffer_takes_more_calls_not_a_bigger_buffer(gpt2_files,
                                                                                     tiktoken_gpt2):
    # One text at a time, a text with more ids than the thread's output buffer holds is
    # encoded in several calls of the kernel (a pre-token too long for the pass among them),
    # its ids gathered in the result: the buffer kept for the thread does not grow to the
    # longest text's size.
    tokenizer, state = tokenizer_with_short_path(gpt2_files)
    size = len(state.out)
    long_text = (read("multi_sample.txt") + " " + "x" * 3000 + EOT + read("web_sample.txt")) * 4
    assert len(long_text.encode()) > 4 * size
    expected = tiktoken_gpt2.encode(long_text, allowed_special="all")
    for dtype in (None, np.uint16, np.int64):
        ids = tokenizer.encode_to_numpy(long_text, dtype)
        assert ids.tolist() == expected and ids.base is None and len(ids) == len(expected)
    assert tokenizer.encode(long_text) == expected
    assert len(state.out) == size and state.text_room == size - encode.SPARE_IDS
    assert tokenizer.encode("Hello again") == tiktoken_gpt2.encode_ordinary("Hello again")


def test_encode_gives_a_list_of_python_ints_on_the_short_path_and_the_long(gpt2_files,
                                                                           tiktoken_gpt2):
    # `encode` turns the kernel's ids into a list itself (no array of the tokenizer's dtype in
    # between): a short text, a text longer than the short path's buffer, and a text with a
    # pre-token too long for the one pass.
    tokenizer = Tokenizer(*gpt2_files, [EOT])
    long_text = read("corpus.en") * 4  # more ids than the short path's first buffer holds
    for text in ("Hello you", long_text, "x" * 5000 + " end", "Hello again"):
        ids = tokenizer.encode(text)
        assert type(ids) is list and all(type(i) is int for i in ids[:50])
        assert ids == tiktoken_gpt2.encode_ordinary(text)


def test_bytes_under_two_ids_encode_to_the_lower_whatever_the_vocab_order():
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b"ab"}
    for order in (vocab, dict(reversed(list(vocab.items())))):
        tokenizer = Tokenizer(order, [(b"a", b"b")])
        assert tokenizer.encode("ab") == [256] and tokenizer.encode("xab ab") == [120, 256, 32, 256]
        assert tokenizer.decode([257, 256]) == "abab"


# --- new pre-tokens merged in parts ----------------------------------------------------------


def test_the_byte_pairs_of_tokens_are_those_side_by_side_inside_one():
    tokens = [b"a", b"ab", b"bcd", b"", b"xyz"]
    data = np.frombuffer(b"".join(tokens), dtype=np.uint8)
    offsets = np.cumsum([0] + [len(t) for t in tokens])
    joins = encode.byte_pairs_in_tokens(data, offsets, np.array([0, 1, 2, 3]))  # not xyz
    marked = {(int(k) >> 8, int(k) & 255) for k in np.flatnonzero(joins)}
    # not (a, a) nor (b, b), side by side only across two tokens
    assert marked == {(ord("a"), ord("b")), (ord("b"), ord("c")), (ord("c"), ord("d"))}


def test_the_filters_bit_words_hold_flag_64w_plus_k_at_bit_k_of_word_w():
    # `Ranks.listed` and `Ranks.windows` are read by the kernels as bit k of word w (`_pair_rank`,
    # `_window_bit`): the packing both are built with, against the plain definition.
    flags = np.random.default_rng(7).random(64 * 5) < 0.3
    words = encode._bit_words(flags)
    assert words.dtype == np.uint64 and len(words) == 5
    assert [[(int(words[w]) >> k) & 1 for k in range(64)] for w in range(5)] == (
        flags.reshape(5, 64).astype(int).tolist())


_RANKS_IN_ORDER = {}


def _ranks_in_order(t, order):
    """`t`'s `Ranks` in merge order `order` (GPT-2's merges, or its tokens as a rank file)."""
    if (id(t), order) not in _RANKS_IN_ORDER:
        ids = np.flatnonzero(t._known).astype(np.int32)
        if order == encode.MERGES:
            left, right, merged = t._merge_ids
            ranks = encode.build_ranks(left, right, np.arange(len(left)), merged, t._byte_ids,
                                       order, *encode.cut_tables(t._token_bytes,
                                                                 t._token_offsets, ids))
        else:
            ranks = encode.build_split_ranks(t._token_bytes, t._token_offsets, ids, t._byte_ids,
                                             t.n_vocab)
        _RANKS_IN_ORDER[id(t), order] = (t, ranks)  # t kept: its id stays its own
    return _RANKS_IN_ORDER[id(t), order][1]


def _merged_whole_and_in_parts(tokenizer, order, data: bytes, part_cache=None):
    """(ids of `data` merged whole, merged in parts cut where `joins` says no token holds the two
    bytes on either side, by the pass's loop (`merge_in_parts`, with `part_cache`, default a
    new one), how many parts), with `tokenizer`'s merges in `order`."""
    ranks = _ranks_in_order(tokenizer, order)
    if part_cache is None:
        part_cache = np.zeros(encode.PART_CACHE_ITEMS, np.int64)
    merge = encode._merge_rounds if order == encode.MERGES else encode._merge_leftmost
    scratch = np.empty(encode._heap_space.py_func(len(data)), dtype=np.int64)

    def merged(piece: bytes) -> list[int]:
        out = ranks.byte_ids[np.frombuffer(piece, dtype=np.uint8)].astype(np.int32)
        return out[: merge(out, 0, len(out), scratch, ranks)].tolist()

    pair = (np.frombuffer(data, np.uint8)[:-1].astype(np.int64) << 8) | np.frombuffer(
        data, np.uint8)[1:]
    cuts = [0, *(np.flatnonzero(ranks.joins[pair] == 0) + 1).tolist(), len(data)]
    parts = [data[a:b] for a, b in zip(cuts, cuts[1:])]
    buf = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(len(data) + encode.SPARE_IDS, dtype=np.int32)
    n = encode.merge_in_parts(merge, buf, 0, len(data), out, 0, ranks, scratch, part_cache)
    return (merged(data), [i for part in parts for i in merged(part)], out[:n].tolist(),
            len(parts))


@pytest.mark.parametrize("order", [encode.MERGES, encode.RANKS])
def test_a_pre_token_merged_in_parts_gets_the_ids_of_merging_it_whole(gpt2, order):
    # Japanese: most pairs of GPT-2's tokens stop inside a character, so few merges cross one
    whole, in_parts, by_the_pass, parts = _merged_whole_and_in_parts(gpt2, order,
                                                                      "語のテキスト日本".encode())
    assert parts > 4 and in_parts == whole and by_the_pass == whole


def _places_tokens_hold(data: bytes, tokens: set, longest: int) -> set:
    """The slow twin of `Ranks.joins` and `Ranks.windows`: each i such that some token occurs
    in `data` over bytes i - 1 and i."""
    held = set()
    for start in range(len(data)):
        for end in range(start + 2, min(len(data), start + longest) + 1):
            if data[start:end] in tokens:
                held.update(range(start + 1, end))
    return held


def _cut_places(ranks, data: bytes, windows: bool) -> set:
    """Where `merge_in_parts` cuts pre-token `data` (`cut_before`), or, without `windows`,
    where `joins` alone would: where it says no token holds the bytes on either side."""
    buf = np.frombuffer(data, np.uint8)
    if not windows:
        return {i for i in range(1, len(data))
                if not ranks.joins[(int(buf[i - 1]) << 8) | int(buf[i])]}
    return {i for i in range(1, len(data)) if encode.cut_before(ranks, buf, 0, len(data), i)}


# GPT-2's few Chinese, Japanese and Korean tokens leave `joins` cutting most of their characters:
# there the windows are checked only for the cuts they make (none in this sample)
@pytest.mark.parametrize("files, more_cuts", [("gpt2", None), ("o200k_base", 1.5)])
def test_a_pre_token_is_cut_only_where_no_token_occurs_over_the_cut(gpt2, files, more_cuts):
    if files == "gpt2":
        t, ranks = gpt2, _ranks_in_order(gpt2, encode.MERGES)
    else:
        t = Tokenizer.from_tiktoken_file(FIXTURES / f"{files}.tiktoken", O200K_PATTERN)
        ranks = t._get_engine().ranks
    ids = np.flatnonzero(t._known)
    tokens = {t._token_bytes[t._token_offsets[i]:t._token_offsets[i + 1]].tobytes() for i in ids}
    longest = max(map(len, tokens))
    lines = (FIXTURES / "multi_sample.txt").read_text(encoding="utf-8").splitlines()
    # lines with Chinese, Japanese or Korean, where the windows are looked for, and others
    text = "\n".join([line for line in lines if regex.search(r"[\u3040-\u9fff\uac00-\ud7af]", line)]
                     + lines[:200])
    pre_tokens = {m.group().encode() for m in regex.finditer(O200K_PATTERN, text)}
    by_joins = by_windows = 0
    for data in sorted(p for p in pre_tokens if not p.isascii()):
        held = _places_tokens_hold(data, tokens, longest)
        cuts = _cut_places(ranks, data, windows=True)
        assert not cuts & held, (data, sorted(cuts & held))
        by_joins += len(_cut_places(ranks, data, windows=False))
        by_windows += len(cuts)
    if more_cuts:  # the windows cut between characters that `joins` leaves whole
        assert by_windows > more_cuts * by_joins > 0


_SHARED_PARTS = {}  # merge order -> a part cache that the examples below fill and read


@settings(max_examples=150, deadline=None)
@given(text=st.text(min_size=2, max_size=60), noise=st.binary(max_size=40))
def test_merging_in_parts_equals_merging_whole_on_any_bytes(gpt2, text, noise):
    data = text.encode("utf-8", "surrogatepass") + noise
    for order in (encode.MERGES, encode.RANKS):
        parts = _SHARED_PARTS.setdefault(order, np.zeros(encode.PART_CACHE_ITEMS, np.int64))
        whole, in_parts, by_the_pass, _ = _merged_whole_and_in_parts(gpt2, order, data, parts)
        assert in_parts == whole and by_the_pass == whole


def _part_cache_keys(parts: np.ndarray) -> np.ndarray:
    """The slots of a part cache that hold a part."""
    return np.flatnonzero(parts[0::2])


@pytest.mark.parametrize("order", [encode.MERGES, encode.RANKS])
def test_the_part_cache_remembers_the_parts_of_a_cut_pre_token_and_is_read(gpt2, order):
    data = "語のテキスト日本語のテキスト".encode()
    parts = np.zeros(encode.PART_CACHE_ITEMS, np.int64)
    whole, _, first, _ = _merged_whole_and_in_parts(gpt2, order, data, parts)
    filled = _part_cache_keys(parts)
    assert first == whole and len(filled) > 4  # the characters of 2 or 3 ids, remembered
    again = parts.copy()
    _, _, second, _ = _merged_whole_and_in_parts(gpt2, order, data, parts)
    assert second == whole and np.array_equal(parts, again)  # all found: nothing new stored
    # what the pass writes comes from the cache: an entry changed, the ids change
    slot = 2 * filled[0]
    value = int(parts[slot + 1])
    parts[slot + 1] = (value & ~((1 << 22) - 4)) | (12345 << 2)  # its first id made 12345
    _, _, poisoned, _ = _merged_whole_and_in_parts(gpt2, order, data, parts)
    assert poisoned != whole and 12345 in poisoned


def test_each_tokenizer_has_its_own_part_cache(gpt2_files, gpt2):
    # the same merges with other ids: a part remembered by one tokenizer, found by the other,
    # would give the other's ids
    vocab, merges = gpt2_files
    shift = 7
    shifted = Tokenizer({(i + shift) % len(vocab): b for i, b in vocab.items()}, merges)
    text = CJK * 2 + " 語のテキスト日本語のテキスト"
    expected = gpt2.encode(text)
    for _ in range(2):
        assert shifted.encode(text) == [(i + shift) % len(vocab) for i in expected]
        assert gpt2.encode(text) == expected


@pytest.mark.parametrize("first_id, data", [(1 << 20, b"ab.xy.ab.xy"), (0, b"ab.wxyz.ab.wxyz")])
def test_the_part_cache_does_not_remember_ids_it_cannot_hold(first_id, data):
    # One merge, "ab" -> 5; the other parts of letters never merge. With byte ids from 2**20,
    # the two ids of "xy" do not fit in a slot; with byte ids from 0, the four of "wxyz" do not.
    byte_ids = np.arange(first_id, first_id + 256, dtype=np.int32)
    joins = np.zeros(1 << 16, np.uint8)
    for a, b in ("ab", "wx", "xy", "yz"):
        joins[ord(a) << 8 | ord(b)] = 1
    ranks = encode.build_ranks(byte_ids[[ord("a")]], byte_ids[[ord("b")]], np.array([0]),
                               np.array([5], np.int32), byte_ids, encode.MERGES, joins)
    buf = np.frombuffer(data, np.uint8)  # one pre-token, cut at each "."
    expected = []
    for piece in data.split(b"."):
        if expected:
            expected.append(int(byte_ids[ord(".")]))
        expected += [5] if piece == b"ab" else byte_ids[list(piece)].tolist()
    scratch = np.empty(encode._heap_space.py_func(len(data)), np.int64)
    parts = np.zeros(encode.PART_CACHE_ITEMS, np.int64)
    for _ in range(2):
        out = np.empty(len(data) + encode.SPARE_IDS, np.int32)
        n = encode.merge_in_parts(encode._merge_rounds, buf, 0, len(data), out, 0, ranks,
                                  scratch, parts)
        assert out[:n].tolist() == expected
    assert len(_part_cache_keys(parts)) == 1  # "ab" -> 5 only


def test_a_kernel_is_called_on_a_table_only_while_it_is_published_and_not_replaced(gpt2_files):
    # Before a kernel runs, its caller publishes the serial of the cache table it reads in the
    # thread's own items (`enter_table_of`), 0 after (`leave_table_of`); a table marked `STALE`
    # (replaced, maybe about to be emptied in place) is refused, nothing published. The `regex`
    # path calls its kernels so too: while a kernel of this thread reads the table, another
    # thread's `make_room` sees its serial published.
    from nbbpe.encode_tables import OWN_HAZARD, SERIAL, STALE

    tokenizer = Tokenizer(*gpt2_files, [EOT], pretokenizer="regex")
    text = "the words of a text, the words"
    expected = tokenizer.encode(text)
    state = tokenizer._thread_state()
    hazard = encode.OWN_AT + OWN_HAZARD
    table = state.cache.table
    assert encode.enter_table_of(table, state.scratch)
    assert state.scratch[hazard] == table.fill[SERIAL] != 0
    encode.leave_table_of(state.scratch)
    assert state.scratch[hazard] == 0
    seen = []
    real = encode.PIECE_ENCODERS
    spy = lambda kernel: lambda *args: seen.append(int(state.scratch[hazard])) or kernel(*args)
    encode.PIECE_ENCODERS = tuple(spy(kernel) for kernel in real)
    try:
        state.cache.table = state.cache._fresh()  # as another thread's `make_room` leaves it
        table.fill[STALE] = 1
        assert not encode.enter_table_of(table, state.scratch)
        assert state.scratch[hazard] == 0
        assert tokenizer.encode(text) == expected
    finally:
        encode.PIECE_ENCODERS = real
    assert seen and set(seen) == {int(state.cache.table.fill[SERIAL])}
    assert state.scratch[hazard] == 0
    # the compiled scanners' kernels, called from Python (a text longer than the short path's)
    tokenizer = Tokenizer(*gpt2_files, [EOT])
    sample = read("web_sample.txt")
    long_text = sample * (encode._TEXT_ROOM_GROWS_TO // len(sample) + 1)  # (makes no room)
    expected = tokenizer.encode(long_text)
    state = tokenizer._thread_state()
    documents = tokenizer._get_engine().documents
    assert len(long_text) > state.text_room and documents._entry is not None
    seen = []
    documents._entry = spy(documents._entry)
    assert tokenizer.encode(long_text) == expected
    assert seen and set(seen) == {int(state.cache.table.fill[SERIAL])}
    assert state.scratch[hazard] == 0
