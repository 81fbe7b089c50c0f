"""tiktoken rank files (cl100k_base, o200k_base) against tiktoken built offline from the same files,
and the two merge orders against their slow twins: GPT-2's `bpe()` for merge lists and tiktoken's
byte-pair merge for rank files, on short pre-tokens and on long ones (merged on a heap)."""

from pathlib import Path

import numpy as np
import pytest
import regex
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from tiktoken.load import load_tiktoken_bpe

from nbbpe import CL100K_PATTERN, O200K_PATTERN, Tokenizer
from nbbpe.patterns import TIKTOKEN_GPT2_PATTERN
from reference_encode import ReferenceEncoder, bpe, tiktoken_bpe

FIXTURES = Path(__file__).parent / "fixtures"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "corpora"
EOT = "<|endoftext|>"
ENCODINGS = {  # name -> (pattern, special tokens), as tiktoken_ext/openai_public.py defines them
    "cl100k_base": (CL100K_PATTERN, {EOT: 100257, "<|fim_prefix|>": 100258,
                                     "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260,
                                     "<|endofprompt|>": 100276}),
    "o200k_base": (O200K_PATTERN, {EOT: 199999, "<|endofprompt|>": 200018}),
}


@pytest.fixture(scope="module", params=sorted(ENCODINGS))
def pair(request):
    """(nbbpe Tokenizer, tiktoken Encoding) of one rank file."""
    name = request.param
    pattern, specials = ENCODINGS[name]
    path = FIXTURES / f"{name}.tiktoken"
    ours = Tokenizer.from_tiktoken_file(path, pattern, specials)
    theirs = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=load_tiktoken_bpe(str(path)),
                               special_tokens=specials)
    return ours, theirs


def read(name):
    return (FIXTURES / name).read_text(encoding="utf-8")


LONG = ["=" * 70, "-" * 200, "a" * 300, "ab" * 150, "1234567890" * 20, " " * 100, "\n" * 80,
        "x" * 65 + "y" * 65, "🙂" * 40, "ſ's" * 30, "https://example.com/" + "a/" * 60]
pieces = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["'s", "'S", "'ſ", "'LL", "'ve", "'RE", " 's", "'d", "'M", "’s"]),
    st.from_regex(r" ?[A-Za-z]{1,10}| ?[0-9]{1,7}|[ \r\n\t]{1,5}|[!-/:-@]{1,4}/?\n?",
                  fullmatch=True),
    st.text(alphabet="中文日本語한국어ǅǈ\u0301\u093f\u0915\u0308eé", min_size=1, max_size=6),
    st.sampled_from([EOT, "<|endofprompt|>", "<|", "|>", EOT + EOT]),
    st.sampled_from(LONG),
)
texts = st.lists(pieces, max_size=30).map("".join)


@pytest.mark.parametrize("name", ["corpus.en", "multi_sample.txt", "web_sample.txt",
                                  "tinystories_sample.txt", "german.txt", "address.txt"])
def test_fixture_texts_match_tiktoken(pair, name):
    ours, theirs = pair
    text = read(name)
    assert ours.encode(text) == theirs.encode(text, allowed_special="all")


@pytest.mark.skipif(not SHARED.exists(), reason="the shared development corpora are absent")
@pytest.mark.parametrize("name", ["web_5M.txt", "multi_1M.txt", "tinystories_real.txt"])
def test_shared_corpora_match_tiktoken(pair, name):
    ours, theirs = pair
    text = (SHARED / name).read_text(encoding="utf-8")[:1_500_000]
    np.testing.assert_array_equal(ours.encode_to_numpy(text, dtype=np.int64),
                                  theirs.encode(text, allowed_special="all"))


@settings(max_examples=150)
@given(texts)
def test_generated_text_matches_tiktoken(pair, text):
    ours, theirs = pair
    assert ours.encode(text) == theirs.encode(text, allowed_special="all")


# What could follow a text and change its last pre-tokens if it were read: more of its last
# class, a contraction's letters, a space before a word, digits, a mark, a newline.
AFTER = ["x", "s", "ll", " x", "1", "\u0301", "\n", " ", "é", "'s", EOT]


@settings(max_examples=100)
@given(texts, st.sampled_from(AFTER))
def test_a_text_after_a_longer_one_on_the_short_path(pair, text, after):
    # Each text is copied into the thread's buffer, over what a longer text left there: the
    # kernel reads bytes past the text's end (a block at a time) but decides nothing from them.
    ours, theirs = pair
    ours.encode("warm-up: the second text on takes the short path")
    ours.encode(text + after * 40)
    assert ours.encode(text) == theirs.encode(text, allowed_special="all")


def test_the_short_paths_uint32_arrays_are_copies_of_their_own(pair):
    # With more than 65,536 ids, encode_to_numpy's arrays are uint32 by default: on the short
    # path, a copy of the thread's int32 output buffer read as uint32 (no conversion). Each
    # array must own its ids: the next text overwrites that buffer.
    ours, theirs = pair
    texts = [read("multi_sample.txt")[k:k + 300] for k in range(0, 6000, 300)] + ["", "a"]
    ours.encode("warm-up: the second text on takes the short path")
    arrays = [ours.encode_to_numpy(text) for text in texts]
    state = ours._thread_state()
    assert state.text_call is not None  # the short path was taken
    for text, ids in zip(texts, arrays):
        assert ids.dtype == np.uint32 and ids.flags.owndata
        assert not np.shares_memory(ids, state.out)
        assert ids.tolist() == theirs.encode(text, allowed_special="all")
    assert ours.encode_to_numpy(texts[3], dtype=np.int64).tolist() == arrays[3].tolist()


@settings(max_examples=60)
@given(st.lists(texts, max_size=8), st.integers(1, 3))
def test_batches_and_uint32_ids(pair, batch, threads):
    ours, theirs = pair
    ids, offsets = ours.encode_batch_to_numpy(batch, num_threads=threads)
    assert ids.dtype == np.uint32  # more than 65,536 ids
    want = theirs.encode_batch(batch, allowed_special="all")
    assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want


def test_the_regex_path_gives_the_same_ids(pair):
    ours, theirs = pair
    path = FIXTURES / f"{theirs.name}.tiktoken"
    regex_path = Tokenizer.from_tiktoken_file(path, ours.pattern, dict(ours._special_ids),
                                              pretokenizer="regex")
    text = read("multi_sample.txt") + " ".join(LONG)
    assert regex_path.encode(text) == ours.encode(text) == theirs.encode(text, allowed_special="all")


def test_a_rank_files_merges_make_the_token_of_their_rank(pair):
    ours, _ = pair
    assert ours._get_engine().ranks.merged_offset == 0  # computed, not loaded, when merging


def test_special_tokens_as_a_list_follow_the_largest_rank(tmp_path):
    path = FIXTURES / "cl100k_base.tiktoken"
    tok = Tokenizer.from_tiktoken_file(path, CL100K_PATTERN, ["<|a|>", "<|b|>"])
    assert tok.encode("x<|b|>") == [87, 100257]  # the ranks run from 0 to 100255
    assert tok.n_vocab == 100258 and tok.decode([100256, 100257]) == "<|a|><|b|>"


def test_save_and_load_keep_the_rank_order(tmp_path):
    path = FIXTURES / "o200k_base.tiktoken"
    tok = Tokenizer.from_tiktoken_file(path, O200K_PATTERN, {EOT: 199999})
    tok.save(tmp_path / "o200k")
    again = Tokenizer.load(tmp_path / "o200k")
    assert again.merge_order == "ranks" and again._special_ids == {EOT: 199999}
    text = read("multi_sample.txt") + EOT
    assert again.encode(text) == tok.encode(text)
    assert (tmp_path / "o200k" / "ranks.tiktoken").read_bytes() == path.read_bytes()


def test_bad_rank_files_give_clear_errors(tmp_path):
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("IQ== 0\nnot-base64! 1\n")
    with pytest.raises(ValueError, match=r"bad.tiktoken:2: not a 'base64-token rank' line"):
        Tokenizer.from_tiktoken_file(bad, CL100K_PATTERN)
    bad.write_text("IQ== 0\nIQ== 1\n")
    with pytest.raises(ValueError, match="listed twice"):
        Tokenizer.from_tiktoken_file(bad, CL100K_PATTERN)
    bad.write_text("IQ== 0\n")
    with pytest.raises(ValueError, match="lacks 255 of the 256 single bytes"):
        Tokenizer.from_tiktoken_file(bad, CL100K_PATTERN)
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_tiktoken_file(tmp_path / "missing.tiktoken", CL100K_PATTERN)


# --- the two merge orders against their twins, on random merge lists and rank tables --------

ALPHABET = b"abc"


def random_merges(draw_pairs):
    """Merges from a list of (left index, right index) draws over the tokens made so far:
    any order, so merged tokens may come before their parts' merges (weird, but allowed)."""
    tokens = [bytes([b]) for b in ALPHABET]
    merges = []
    for i, j in draw_pairs:
        a, b = tokens[i % len(tokens)], tokens[j % len(tokens)]
        if (a, b) in merges or len(a + b) > 12:
            continue
        merges.append((a, b))
        if a + b not in tokens:
            tokens.append(a + b)
    return merges


@settings(max_examples=120)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=40),
       st.lists(st.text(alphabet="abc", min_size=1, max_size=150), min_size=1, max_size=6))
def test_merge_lists_match_gpt2_bpe_on_short_and_long_pretokens(draws, words):
    merges = random_merges(draws)
    vocab = {i: bytes([i]) for i in range(256)}
    for a, b in merges:
        if a + b not in vocab.values():
            vocab[len(vocab)] = a + b
    ours = Tokenizer(vocab, merges, pattern=r"\S+|\s+")
    reference = ReferenceEncoder(vocab, merges, pattern=r"\S+|\s+")
    text = " ".join(words)  # words of up to 150 bytes: both the scan and the heap path
    assert ours.encode(text) == reference.encode(text)


@settings(max_examples=120)
@given(st.lists(st.binary(min_size=2, max_size=10).map(lambda b: bytes(ALPHABET[x % 3] for x in b)),
                max_size=30),
       st.lists(st.text(alphabet="abc", min_size=1, max_size=150), min_size=1, max_size=6))
def test_rank_files_match_tiktoken_bpe_on_short_and_long_pretokens(tmp_path_factory, tokens, words):
    ranks = {bytes([b]): b for b in range(256)}
    for token in tokens:  # any ranks: a token need not be reachable, parts need not come first
        ranks.setdefault(token, len(ranks))
    path = tmp_path_factory.mktemp("r") / "r.tiktoken"
    tiktoken_ranks = Tokenizer({r: t for t, r in ranks.items()}, []).tiktoken_ranks()
    assert tiktoken_ranks == ranks
    Tokenizer({r: t for t, r in ranks.items()}, []).save_tiktoken_ranks(path)
    ours = Tokenizer.from_tiktoken_file(path, r"\S+|\s+")
    theirs = tiktoken.Encoding("random", pat_str=r"\S+|\s+", mergeable_ranks=ranks,
                               special_tokens={})
    text = " ".join(words)
    want = [i for piece in regex.findall(r"\S+|\s+", text)
            for i in tiktoken_bpe(piece.encode(), ranks)]
    assert ours.encode(text) == want == theirs.encode(text)


def test_gpt2_pattern_as_tiktoken_spells_it_is_compiled(gpt2_files):
    tok = Tokenizer(*gpt2_files, [EOT], pattern=TIKTOKEN_GPT2_PATTERN)
    assert tok._family == "gpt2"
    text = read("web_sample.txt")
    assert tok.encode(text) == Tokenizer(*gpt2_files, [EOT]).encode(text)
    assert bpe((b"a", b"b"), {}) == [b"a", b"b"]  # the twin itself


@pytest.mark.parametrize("length", [4, 10, 64, 66, 200])  # short (scanned) and long (heap) pieces
def test_the_two_orders_differ_where_they_must(tmp_path, length):
    text = "ab" * (length // 2)
    # A merge list may rank a merge above the one that makes its left part: GPT-2 merges every
    # (a, b) in the round before (ab, a) can apply; merging one pair at a time would not.
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b"aba"}
    merges = [(b"ab", b"a"), (b"a", b"b")]
    want = ReferenceEncoder(vocab, merges, pattern=r"\S+").encode(text)
    assert want == [256] * (length // 2)
    assert Tokenizer(vocab, merges, pattern=r"\S+").encode(text) == want
    assert Tokenizer(vocab, merges, pattern=GPT2_LIKE).encode(text) == want
    # In a rank file "aba" may rank below "ab": tiktoken merges the leftmost (a, b), then
    # (ab, a) comes first; merging every (a, b) at once would give [ab, ab, ...].
    ranks = {bytes([i]): i for i in range(256)} | {b"aba": 256, b"ab": 257}
    path = tmp_path / "r.tiktoken"
    Tokenizer({r: t for t, r in ranks.items()}, []).save_tiktoken_ranks(path)
    want = tiktoken_bpe(text.encode(), ranks)
    assert want[0] == 256
    assert Tokenizer.from_tiktoken_file(path, r"\S+").encode(text) == want
    assert Tokenizer.from_tiktoken_file(path, GPT2_LIKE).encode(text) == want


GPT2_LIKE = TIKTOKEN_GPT2_PATTERN  # letters in one pre-token: the compiled scanner's kernels


def test_a_rank_file_with_gaps_in_its_ranks(tmp_path):
    ranks = {bytes([i]): i for i in range(256)}
    for k, token in enumerate([b"ab", b"abc", b" t", b" th", b"he", b" the", b"abcab"]):
        ranks[token] = 1000 + 7 * k  # far apart: ids are ranks, and positions are not ids
    path = tmp_path / "gaps.tiktoken"
    Tokenizer({r: t for t, r in ranks.items()}, []).save_tiktoken_ranks(path)
    tok = Tokenizer.from_tiktoken_file(path, r"\S+|\s+")
    text = "abcabc the abcab thethe  ab"
    want = [i for piece in regex.findall(r"\S+|\s+", text) for i in tiktoken_bpe(piece.encode(), ranks)]
    assert tok.encode(text) == want
    assert tok.decode(want) == text
