"""Training: exactness against the CS336 fixtures and the slow reference twin, and bad input."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbbpe
from nbbpe import InvalidUTF8Error, train_bpe
from nbbpe.vocab_files import unspell
from reference_bpe import reference_train_bpe

FIXTURES = Path(__file__).parent / "fixtures"
EOT = "<|endoftext|>"


def write(tmp_path, text, name="corpus.txt"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


@pytest.fixture(params=["kernel", "python"])
def merge_loop(request, monkeypatch):
    """Run a test with the compiled merge loop and with `merge_python`'s, which a first run on a
    small local source uses (as the tests' sources are), and check which one ran."""
    from nbbpe import merge_python

    calls = []
    learn = merge_python.learn_merges_in_python

    def spy(*args):
        calls.append(args)
        return learn(*args)

    monkeypatch.setattr(merge_python, "learn_merges_in_python", spy)
    if request.param == "python":
        monkeypatch.setattr(merge_python, "merge_kernel_compiled", lambda: False)
    yield request.param
    assert bool(calls) == (request.param == "python")


def test_cs336_fixture_matches_reference_merges_and_vocab(merge_loop):
    vocab, merges = train_bpe(FIXTURES / "corpus.en", 500, [EOT])
    with open(FIXTURES / "train-bpe-reference-merges.txt", encoding="utf-8") as f:
        expected_merges = [tuple(unspell(part) for part in line.rstrip("\n").split(" ")) for line in f]
    assert merges == expected_merges
    with open(FIXTURES / "train-bpe-reference-vocab.json", encoding="utf-8") as f:
        expected_vocab = json.load(f)
    expected_tokens = {EOT.encode() if k == EOT else unspell(k) for k in expected_vocab}
    assert set(vocab.keys()) == set(expected_vocab.values())
    assert set(vocab.values()) == expected_tokens


def test_vocab_layout_bytes_then_specials_then_merges():
    vocab, merges = train_bpe(FIXTURES / "corpus.en", 300, ["<|b|>", EOT])
    assert [vocab[i] for i in range(256)] == [bytes([i]) for i in range(256)]
    assert vocab[256] == b"<|b|>" and vocab[257] == EOT.encode()
    assert len(vocab) == 300 and len(merges) == 300 - 258
    assert [vocab[258 + k] for k in range(len(merges))] == [a + b for a, b in merges]


def test_sennrich_low_lower_widest_newest(tmp_path, merge_loop):
    # The CS336 handout's example, pre-tokenized on whitespace.
    text = "low low low low low lower lower widest widest widest newest newest newest newest newest newest"
    vocab, merges = train_bpe(write(tmp_path, text), 256 + 1 + 6, [EOT], pattern=r"\S+")
    assert merges == [(b"s", b"t"), (b"e", b"st"), (b"o", b"w"), (b"l", b"ow"), (b"w", b"est"), (b"n", b"e")]
    vocab, merges = train_bpe(write(tmp_path, text), 1000, [EOT], pattern=r"\S+")
    assert merges[6:] == [(b"ne", b"west"), (b"w", b"i"), (b"wi", b"d"), (b"wid", b"est"),
                          (b"low", b"e"), (b"lowe", b"r")]  # then no pair is left
    assert len(vocab) == 256 + 1 + 12


def test_tie_compares_the_pair_tuple_not_the_concatenation(tmp_path, merge_loop):
    # After (A, B) merges, (AB, C) and (A, Z) tie at 3: the tuple (b"AB", b"C") > (b"A", b"Z"),
    # although the joined b"ABC" < b"AZ".
    text = "ABC\n" * 3 + "AZ\n" * 3 + "AB\n" * 2
    _, merges = train_bpe(write(tmp_path, text), 258, [])
    assert merges == [(b"A", b"B"), (b"AB", b"C")]


def test_overlapping_occurrences_counted_but_merged_left_to_right(tmp_path, merge_loop):
    # "aaaa" holds (a, a) three times; merged it is "aa aa", which holds (aa, aa) once.
    text = "aaaa bbb"
    path = write(tmp_path, text)
    vocab, merges = train_bpe(path, 260, [])
    assert merges[0] == (b"a", b"a")
    assert merges == reference_train_bpe(text, 260)[1]
    _, merges = train_bpe(write(tmp_path, "aaa"), 300, [])
    assert merges == [(b"a", b"a"), (b"aa", b"a")]  # "aaa" -> "aa a" -> "aaa", then nothing is left


def test_special_tokens_are_cut_out_never_crossed_and_longest_wins(tmp_path, merge_loop):
    text = ("hello<|endoftext|>world " * 20) + ("x<|endoftext|><|endoftext|>y " * 5)
    specials = [EOT, EOT + EOT]
    vocab, merges = train_bpe(write(tmp_path, text), 400, specials)
    for a, b in merges:
        joined = a + b
        assert b"<|" not in joined and b"|>" not in joined
        assert b"endoftext" not in joined
    # No merge joins the text on the two sides of a special token.
    assert all(b"oworld" not in a + b and b"lloworld" not in a + b for a, b in merges)
    assert (vocab, merges) == reference_train_bpe(text, 400, specials)


def test_stops_early_when_no_pair_is_left(tmp_path, merge_loop):
    vocab, merges = train_bpe(write(tmp_path, "ab ab"), 10_000, [EOT])
    # Pre-tokens "ab" and " ab": (a, b) occurs twice, then (" ", "ab") once, then nothing is left.
    assert merges == [(b"a", b"b"), (b" ", b"ab")]
    assert len(vocab) == 257 + 2


@pytest.mark.parametrize("pretokenizer", ["compiled", "regex"])
def test_same_result_for_any_worker_count_and_chunk_size(tmp_path, pretokenizer):
    text = (FIXTURES / "corpus.en").read_text(encoding="utf-8")[:60_000]
    path = write(tmp_path, text)
    expected = reference_train_bpe(text, 400, [EOT])
    for workers in (1, 2, 4):
        for chunk_bytes in (257, 4096, 1 << 20):
            got = train_bpe(path, 400, [EOT], num_workers=workers, chunk_bytes=chunk_bytes,
                            pretokenizer=pretokenizer)
            assert got == expected, (workers, chunk_bytes)


def test_corpus_without_special_tokens_is_still_split_and_parallel(tmp_path):
    from nbbpe.corpus import chunk_boundaries

    text = (FIXTURES / "corpus.en").read_text(encoding="utf-8")[:40_000].replace("<|endoftext|>", "")
    path = write(tmp_path, text)
    assert len(chunk_boundaries(path, 1000, [])) > 20
    expected = reference_train_bpe(text, 350)
    assert train_bpe(path, 350, None, num_workers=2, chunk_bytes=1000) == expected


TRICKY = ["a", "b", "A", "B", "aa", "ab", " ", "  ", "\n", "\t", "'s", "'", "é", "ü", "中", "文",
          "🙂", "1", "23", ".", "!", "\u00a0", "\u2028", "\r\n", "<|endoftext|>",
          "'S", "'ll", "ǅ", "\u0301", "1234", "/", "\r"]  # cl100k's and o200k's corners
BUILT_IN_PATTERNS = [nbbpe.GPT2_PATTERN, nbbpe.CL100K_PATTERN, nbbpe.O200K_PATTERN]


@settings(max_examples=80)
@given(
    pieces=st.lists(st.sampled_from(TRICKY), min_size=1, max_size=120),
    extra=st.integers(0, 60),
    workers=st.sampled_from([1, 2]),
    chunk_bytes=st.sampled_from([7, 64, 1 << 20]),
    pretokenizer=st.sampled_from(["compiled", "regex"]),
    pattern=st.sampled_from(BUILT_IN_PATTERNS),
)
def test_fast_path_equals_reference_on_random_corpora(tmp_path_factory, pieces, extra, workers,
                                                      chunk_bytes, pretokenizer, pattern):
    text = "".join(pieces)
    path = write(tmp_path_factory.mktemp("c"), text)
    vocab_size = 257 + extra
    got = train_bpe(path, vocab_size, [EOT], num_workers=workers, chunk_bytes=chunk_bytes,
                    pretokenizer=pretokenizer, pattern=pattern)
    assert got == reference_train_bpe(text, vocab_size, [EOT], pattern=pattern)


@pytest.mark.parametrize("pattern", BUILT_IN_PATTERNS, ids=["gpt2", "cl100k", "o200k"])
def test_each_built_in_pattern_trains_as_the_reference_on_real_text(tmp_path, pattern,
                                                                      merge_loop):
    text = ((FIXTURES / "web_sample.txt").read_text(encoding="utf-8")[:20_000]
            + (FIXTURES / "multi_sample.txt").read_text(encoding="utf-8")[:8_000]
            + " 12345 I'M DONE\r\n")
    path = write(tmp_path, text)
    expected = reference_train_bpe(text, 600, [EOT], pattern=pattern)
    for pretokenizer in ("compiled", "regex"):
        assert train_bpe(path, 600, [EOT], pattern=pattern, pretokenizer=pretokenizer,
                         num_workers=2, chunk_bytes=3000) == expected


def test_unknown_pretokenizers_and_uncompiled_patterns_are_refused(tmp_path):
    path = write(tmp_path, "some text")
    with pytest.raises(ValueError, match="no compiled pre-tokenizer implements this pattern"):
        train_bpe(path, 330, [EOT], pattern=r"\w+|\s+", pretokenizer="compiled")
    with pytest.raises(ValueError, match="pretokenizer must be"):
        train_bpe(path, 330, [EOT], pretokenizer="fast")


def _merges_both_ways(words: dict[bytes, int], num_merges: int):
    """(kernel's, merge_python's) merges of `words` (bytes -> count), as id arrays."""
    from nbbpe.intern import intern_words
    from nbbpe.merge import learn_merges
    from nbbpe.merge_python import learn_merges_in_python
    from nbbpe.pretokenize_kernels import PretokenCounts

    data = list(words)
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum([len(w) for w in data], out=offsets[1:])
    interned = intern_words(PretokenCounts(np.frombuffer(b"".join(data), dtype=np.uint8).copy(),
                                           offsets, np.array(list(words.values()), dtype=np.int64)))
    python = learn_merges_in_python(*interned, num_merges)
    kernel = learn_merges(*interned, num_merges, np.zeros(1, dtype=np.int64))  # (in place)
    return [a.tolist() for a in kernel], [a.tolist() for a in python]


@settings(max_examples=200)
@given(words=st.dictionaries(st.one_of(st.binary(min_size=1, max_size=12),
                                       st.text(alphabet="abAB ", min_size=1, max_size=10).map(
                                           str.encode)),
                             st.integers(1, 50), min_size=1, max_size=40),
       num_merges=st.integers(1, 300))
def test_merge_python_learns_the_kernels_merges(words, num_merges):
    kernel, python = _merges_both_ways(words, num_merges)
    assert python == kernel


def test_merge_python_learns_the_kernels_merges_on_real_text():
    from reference_bpe import reference_pretoken_counts

    text = ((FIXTURES / "web_sample.txt").read_text(encoding="utf-8")
            + (FIXTURES / "multi_sample.txt").read_text(encoding="utf-8"))
    words = reference_pretoken_counts(text, [EOT])
    kernel, python = _merges_both_ways(words, 5000)
    assert python == kernel and len(kernel[0]) == 5000


@settings(max_examples=40)
@given(words=st.lists(st.text(alphabet="abAB", min_size=1, max_size=6), min_size=1, max_size=40),
       extra=st.integers(1, 40))
def test_ties_of_every_kind_on_small_alphabets(tmp_path_factory, words, extra):
    # Few letters and short words: many pairs tie, with prefixes of one another.
    text = "\n".join(words)
    path = write(tmp_path_factory.mktemp("t"), text)
    assert train_bpe(path, 256 + extra, []) == reference_train_bpe(text, 256 + extra)


@pytest.mark.parametrize("pretokenizer", ["compiled", "regex"])
def test_invalid_utf8_strict_names_the_offset_and_replace_reads_fffd(tmp_path, pretokenizer):
    data = b"hello world " * 10 + b"caf\xe9 bar" + b" tail \xf0\x9f\x99<|endoftext|>" * 10
    path = write(tmp_path, data)
    for workers, chunk_bytes in [(1, 1 << 20), (2, 16)]:
        with pytest.raises(InvalidUTF8Error, match=r"corpus.txt byte 123: invalid UTF-8") as info:
            train_bpe(path, 300, [EOT], num_workers=workers, chunk_bytes=chunk_bytes,
                      pretokenizer=pretokenizer)
        assert info.value.offset == 123
    text = data.decode("utf-8", errors="replace")
    expected = reference_train_bpe(text, 300, [EOT])
    for workers, chunk_bytes in [(1, 1 << 20), (2, 16)]:
        assert train_bpe(path, 300, [EOT], errors="replace", num_workers=workers,
                         chunk_bytes=chunk_bytes, pretokenizer=pretokenizer) == expected


@pytest.mark.parametrize(
    "vocab_size, specials, error, message",
    [
        (255, [], ValueError, "too small"),
        (256, [EOT], ValueError, "too small"),
        (300.0, [], TypeError, "must be an int"),
        (True, [], TypeError, "must be an int"),
        (300, EOT, TypeError, "list of strings"),
        (300, [b"<|x|>"], TypeError, "not a str"),
        (300, [""], ValueError, "non-empty"),
        (300, [EOT, EOT], ValueError, "more than once"),
    ],
)
def test_bad_arguments_give_clear_errors(vocab_size, specials, error, message):
    with pytest.raises(error, match=message):
        train_bpe(FIXTURES / "corpus.en", vocab_size, specials)


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        train_bpe(tmp_path / "missing.txt", 300, [])
    with pytest.raises(ValueError, match="no files in directory"):
        train_bpe(tmp_path, 300, [])
    with pytest.raises(ValueError, match="empty"):
        train_bpe(write(tmp_path, ""), 300, [])
    with pytest.raises(ValueError, match="errors must be"):
        train_bpe(FIXTURES / "corpus.en", 300, [], errors="ignore")
    with pytest.raises(ValueError, match="num_workers"):
        train_bpe(FIXTURES / "corpus.en", 300, [], num_workers=0)


def test_a_failing_worker_stops_the_others_and_its_error_is_raised(tmp_path, monkeypatch):
    import nbbpe.pretokenize

    calls = []
    real_add = nbbpe.pretokenize.UnitCounter.add

    def fail_on_the_third_unit(self, unit):
        calls.append(unit)
        if len(calls) == 3:
            raise RuntimeError("disk on fire")
        return real_add(self, unit)

    monkeypatch.setattr(nbbpe.pretokenize.UnitCounter, "add", fail_on_the_third_unit)
    path = write(tmp_path, "some words here " * 5000)
    with pytest.raises(RuntimeError, match="disk on fire"):
        train_bpe(path, 300, [], num_workers=2, chunk_bytes=500)
    assert len(calls) < 10  # the others stopped at once, not after the whole corpus (160 units)


def test_timings_are_reported():
    timings = {}
    train_bpe(FIXTURES / "corpus.en", 300, [EOT], timings=timings)
    assert set(timings) >= {"pretokenize", "intern", "merge", "total"}
    assert all(v >= 0 for v in timings.values())


def test_public_api():
    assert nbbpe.train_bpe is train_bpe


def test_progress_reports_pretokenization_and_merges(capsys):
    from nbbpe.merge import merge_progress

    seen = []
    with merge_progress(seen.append):
        vocab, merges = train_bpe(FIXTURES / "corpus.en", 500, [EOT], progress=True)
    err = capsys.readouterr().err
    assert "pre-tokenize" in err and "merge" in err and f"{len(merges)}/{500 - 257}" in err
    # read from the kernel by another thread as it runs, and once at the end
    assert seen and seen[-1] == len(merges) and seen == sorted(seen) and seen[0] > 0
    assert (vocab, merges) == train_bpe(FIXTURES / "corpus.en", 500, [EOT], progress=False)


def test_merge_progress_is_read_from_the_running_kernel(monkeypatch):
    # The reporter thread passes on each new count the kernel has written, while it runs; the
    # kernel itself writes the merges done so far.
    import threading

    from nbbpe import merge

    tokens = np.frombuffer(b"abababcdcd", dtype=np.uint8).astype(np.int32)
    progress = np.zeros(1, dtype=np.int64)
    left, _ = merge.learn_merges(tokens, np.array([0, 6, 10]), np.array([3, 2]), 3, progress)
    assert len(left) == 3 and progress[0] == 3

    seen, reached = [], threading.Event()

    counts = (5, 9)

    def fake_kernel(tokens, offsets, word_counts, num_merges, progress):
        for n in counts:  # each count waits until a report of it arrives
            reached.clear()
            progress[0] = n
            assert reached.wait(10)
        return np.zeros(12, np.int32), np.zeros(12, np.int32)

    def listener(n):
        seen.append(n)
        reached.set()

    monkeypatch.setattr(merge, "learn_merges", fake_kernel)
    monkeypatch.setattr(merge, "_REPORT_EVERY_S", 0.001)
    with merge.merge_progress(listener):
        left, _ = merge.merges_with_progress(None, None, None, 12)
    assert seen == [5, 9, 12] and len(left) == 12
    seen.clear()
    counts = (5, 12)  # the reporter tells the end itself: it is not told twice
    with merge.merge_progress(listener):
        merge.merges_with_progress(None, None, None, 12)
    assert seen == [5, 12]


def test_first_run_precompiles_the_signatures_the_other_process_uses():
    # the helpers the training process compiles while a child compiles learn_merges (and the
    # encode kernel's helpers, while a child compiles it) must be the very signatures the
    # child types, or the child compiles them again: mutable C arrays and int64 sizes
    from numba import typeof, types

    from nbbpe import encode, merge, pretokenize_kernels
    from nbbpe.encode_tables import copy_ids, find, is_full, store

    merge.compile_helpers(all_of_them=True)
    for dtype in (types.uint8, types.int32, types.int64):
        assert (types.Array(dtype, 1, "C"), types.int64) in merge.grow.signatures
    assert pretokenize_kernels.grow is merge.grow  # counting's tables grow with the same copy
    assert (types.Array(types.int64, 2, "C"), types.int64) in merge._grow_rows.signatures
    ids, ends = types.Array(types.int32, 1, "C"), types.Array(types.int64, 1, "C")
    assert (ids, ids, types.int64, types.int64, types.int64, ids, types.int64, ends, ends,
            ends) in merge._file_word_lists.signatures
    arena, heap = types.Array(types.uint8, 1, "C"), types.Array(types.int64, 2, "C")
    assert (arena, types.int64, types.int64) in merge._prefix_key.signatures
    assert (types.int64, ids, ids, types.int64) in merge._new_table.signatures
    assert (heap, types.int64, types.int64, types.int64, ids, ids, ends, arena, ends,
            ends) in merge._heap_push.signatures
    assert (heap, types.int64, ids, ids, arena, ends, ends) in merge._heap_pop.signatures
    text = types.Array(types.uint8, 1, "C", readonly=True)
    int64s, int32s = types.Array(types.int64, 1, "C"), types.Array(types.int32, 1, "C")
    cache = typeof(encode.SharedCache(encode.new_table(16, 256, 64), 16).table)
    for mode, merge_loop in ((encode.MERGES, encode._merge_rounds),
                             (encode.RANKS, encode._merge_leftmost)):
        encode.compile_shared_first(mode)  # the merge loop as the kernels call it, and helpers
        ranks = typeof(encode._no_merges(np.arange(256, dtype=np.int32), mode))
        assert (int32s, types.int64, types.int64, int64s, ranks) in merge_loop.signatures
    assert ((cache,) + (types.int64,) * 4 + (text, types.int64, types.int64, int32s, types.int64,
                                             types.int64, int64s)) in store.signatures
    assert (cache, types.int64, types.int64, types.int64, types.int64, text, types.int64,
            types.int64) in find.signatures
    assert (cache,) in is_full.signatures
    assert (cache, types.int64, int32s, types.int64) in copy_ids.signatures


def test_python_callers_do_not_compile_inlined_helpers():
    # a call from Python of an inline="always" function compiles it on its own (0.2 s of a
    # first run); Python uses its py_func, kernels inline it
    from nbbpe import encode

    tok = nbbpe.Tokenizer.from_files(FIXTURES / "gpt2_vocab.json", FIXTURES / "gpt2_merges.txt")
    assert tok.encode("a" * 300 + " hello") == tok.encode("a" * 300) + tok.encode(" hello")
    assert encode.new_scratch().size > 0
    assert encode._heap_space.signatures == []


def _counters_used(monkeypatch):
    """The kinds of counter ("compiled", "regex") that count anything from now on."""
    from nbbpe import pretokenize, pretokenize_kernels

    used = []
    for kind, cls in (("compiled", pretokenize_kernels.PretokenCounter),
                      ("regex", pretokenize.RegexPretokenCounter)):
        def add(self, *args, _add=cls.add, _kind=kind, **kwargs):
            used.append(_kind)
            return _add(self, *args, **kwargs)

        monkeypatch.setattr(cls, "add", add)
    return used


def test_a_first_run_counts_a_small_source_with_regex_and_learns_the_same(tmp_path, monkeypatch):
    # Compiling the counting kernel takes seconds, more than `regex` takes on a small source: a
    # first run ("auto", the kernel not in the cache) counts it with `regex`, the same counts.
    import gzip

    from nbbpe import pretokenize_kernels, sources

    text = (FIXTURES / "corpus.en").read_text(encoding="utf-8")[:30_000]
    path = write(tmp_path, text)
    expected = reference_train_bpe(text, 400, [EOT])
    used = _counters_used(monkeypatch)
    compiled = {"gpt2": False}
    monkeypatch.setattr(pretokenize_kernels, "counter_is_compiled", lambda f: compiled[f])
    assert train_bpe(path, 400, [EOT]) == expected and set(used) == {"regex"}
    used.clear()
    assert train_bpe(path, 400, [EOT], pretokenizer="compiled") == expected  # as asked
    assert set(used) == {"compiled"}
    used.clear()
    monkeypatch.setattr(sources, "SMALL_SOURCE", len(text.encode()) - 1)  # not small
    assert train_bpe(path, 400, [EOT]) == expected and set(used) == {"compiled"}
    monkeypatch.setattr(sources, "SMALL_SOURCE", 2 << 20)
    used.clear()
    packed = tmp_path / "corpus.txt.gz"  # compressed: its size says little of the text's
    packed.write_bytes(gzip.compress(text.encode()))
    assert train_bpe(packed, 400, [EOT]) == expected and set(used) == {"compiled"}
    used.clear()
    docs = text.split(EOT)  # JSONL: a document a line, each as hard a boundary as EOT
    lines = tmp_path / "docs.jsonl"
    lines.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs), encoding="utf-8")
    assert train_bpe(lines, 400, [EOT]) == expected and set(used) == {"regex"}
    used.clear()
    compiled["gpt2"] = True  # cached: the kernel counts small sources too
    assert train_bpe(path, 400, [EOT]) == expected and set(used) == {"compiled"}


def test_source_pretokenizer_keeps_what_is_asked_off_the_first_run_of_a_local_source(
        tmp_path, monkeypatch):
    from nbbpe import pretokenize_kernels
    from nbbpe.pretokenize import source_pretokenizer
    from nbbpe.sources import resolve_source
    from nbbpe.workers import LocalExecutor

    monkeypatch.setattr(pretokenize_kernels, "counter_is_compiled", lambda family: False)
    files = resolve_source(write(tmp_path, "some text"))
    gpt2 = nbbpe.GPT2_PATTERN
    assert source_pretokenizer(files, gpt2, "auto") == "regex"
    assert source_pretokenizer(files, gpt2, "auto", LocalExecutor(2)) == "regex"
    assert source_pretokenizer(files, gpt2, "auto", object()) == "auto"  # e.g. a Dask cluster
    assert source_pretokenizer(files, r"\w+|\s+", "auto") == "auto"  # regex anyway
    assert source_pretokenizer(files, gpt2, "regex") == "regex"
    assert source_pretokenizer(files, gpt2, "compiled") == "compiled"


def test_a_first_run_learns_a_small_sources_merges_in_python(tmp_path, monkeypatch):
    # Compiling the merge loop takes seconds; a first run on a small local source learns its
    # merges in Python (merge_python), the same merges.
    import gzip

    from nbbpe import merge_python, sources

    text = (FIXTURES / "corpus.en").read_text(encoding="utf-8")[:30_000]
    path = write(tmp_path, text)
    expected = reference_train_bpe(text, 400, [EOT])
    calls = []
    learn = merge_python.learn_merges_in_python
    monkeypatch.setattr(merge_python, "learn_merges_in_python",
                        lambda *args: calls.append(1) or learn(*args))
    compiled = {"yes": False}
    monkeypatch.setattr(merge_python, "merge_kernel_compiled", lambda: compiled["yes"])

    def in_python(source, **options) -> bool:
        assert train_bpe(source, 400, [EOT], **options) == expected
        used = bool(calls)
        calls.clear()
        return used

    assert in_python(path)
    assert in_python(path, pretokenizer="regex", num_workers=2, chunk_bytes=1000)
    assert not in_python(path, pretokenizer="compiled")  # as asked
    packed = tmp_path / "corpus.txt.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert not in_python(packed)
    assert nbbpe.train_bpe_from_iterator(text.split(EOT), 400, [EOT]) == expected
    assert not calls  # an iterator's size is not known ahead
    monkeypatch.setattr(sources, "SMALL_SOURCE", len(text.encode()) - 1)  # not small
    assert not in_python(path)
    monkeypatch.setattr(sources, "SMALL_SOURCE", 2 << 20)
    compiled["yes"] = True  # cached: the kernel learns small sources' merges too
    assert not in_python(path)


def test_small_local_source_is_at_most_small_source_bytes_uncompressed_and_here(tmp_path):
    import gzip

    from nbbpe.sources import SMALL_SOURCE, resolve_source, small_local_source
    from nbbpe.workers import LocalExecutor

    small = resolve_source(write(tmp_path, "x" * 1000))
    assert small_local_source(small) and small_local_source(small, LocalExecutor(2))
    assert not small_local_source(small, object())  # a cluster's executor
    assert not small_local_source(resolve_source(write(tmp_path, "x" * (SMALL_SOURCE + 1), "big")))
    packed = tmp_path / "c.txt.gz"
    packed.write_bytes(gzip.compress(b"x" * 1000))
    assert not small_local_source(resolve_source(packed))
    assert small_local_source(resolve_source([str(tmp_path / "corpus.txt")] * 2))


def test_too_much_merging_in_python_leaves_the_merges_to_the_kernel(tmp_path, monkeypatch):
    from nbbpe import merge, merge_python

    text = (FIXTURES / "corpus.en").read_text(encoding="utf-8")[:30_000]
    expected = reference_train_bpe(text, 400, [EOT])
    monkeypatch.setattr(merge_python, "merge_kernel_compiled", lambda: False)
    monkeypatch.setattr(merge_python, "MOST_WORK", 1000)
    kernel_calls = []
    learn = merge.merges_with_progress
    monkeypatch.setattr(merge, "merges_with_progress",
                        lambda *args: kernel_calls.append(1) or learn(*args))
    assert train_bpe(write(tmp_path, text), 400, [EOT]) == expected
    assert kernel_calls
    monkeypatch.setattr(merge_python, "MOST_WORK", 10**9)
    kernel_calls.clear()
    assert train_bpe(write(tmp_path, text), 400, [EOT]) == expected
    assert not kernel_calls


def test_the_counting_kernel_is_loaded_before_the_counting_threads_start(tmp_path, monkeypatch):
    # a kernel loaded in one thread while another calls one raced in Numba's `typeof` dispatch
    # ("dictionary changed size during iteration"): the first call is this thread's
    import threading

    from nbbpe import pretokenize_kernels

    calls = []
    add = pretokenize_kernels.PretokenCounter.add

    def spy(self, *args, **kwargs):
        calls.append(threading.current_thread() is threading.main_thread())
        return add(self, *args, **kwargs)

    monkeypatch.setattr(pretokenize_kernels.PretokenCounter, "add", spy)
    text = (FIXTURES / "corpus.en").read_text(encoding="utf-8")[:20_000]
    expected = reference_train_bpe(text, 300, [EOT])
    assert train_bpe(write(tmp_path, text), 300, [EOT], pretokenizer="compiled", num_workers=2,
                     chunk_bytes=2000) == expected
    assert calls[0] and not any(calls[1:])  # here first, then only the workers
