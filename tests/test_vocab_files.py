"""Vocab files: GPT-2 vocab.json + merges.txt, CS336 pickles, Hugging Face tokenizer.json and
tiktoken ranks; round trips without loss, other tools encoding identically, and bad files."""

import collections
import json
import pickle
from pathlib import Path

import pytest
import tiktoken
import tiktoken.load
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from nbbpe import Tokenizer, train_bpe
from nbbpe.vocab_files import (
    load_gpt2_files,
    load_hf_tokenizer_json,
    load_pickle_files,
    load_vocab_and_merges,
    save_gpt2_files,
    save_pickle_files,
    save_tiktoken_ranks,
    tiktoken_ranks,
)
from reference_encode import read_gpt2_vocab

FIXTURES = Path(__file__).parent / "fixtures"
EOT = "<|endoftext|>"
SPECIALS = [EOT, "<|pad|>"]


def read(name):
    return (FIXTURES / name).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def trained():
    """Trained on multilingual text: some tokens are pieces of characters, not valid UTF-8."""
    vocab, merges = train_bpe(FIXTURES / "multi_sample.txt", 700, SPECIALS, num_workers=1)
    partial = [t for t in vocab.values() if not _is_utf8(t)]
    assert any(len(t) > 1 for t in partial)  # merged tokens that split a character
    return vocab, merges


def _is_utf8(data):
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.fixture(scope="module")
def trained_tokenizer(trained):
    return Tokenizer(*trained, SPECIALS)


def test_gpt2_files_load(gpt2_files):
    vocab, merges = gpt2_files
    assert len(vocab) == 50257 and len(merges) == 50000
    assert vocab[262] == b" the" and vocab[50256] == EOT.encode() and vocab[0] == b"!"
    assert merges[0] == (b" ", b"t")
    assert {t: i for i, t in vocab.items()} == read_gpt2_vocab(FIXTURES / "gpt2_vocab.json")


# --- round trips ----------------------------------------------------------------------------


def test_gpt2_format_round_trips_trained_output(trained, tmp_path):
    vocab, merges = trained
    vocab_path, merges_path = save_gpt2_files(vocab, merges, tmp_path)
    assert load_gpt2_files(vocab_path, merges_path) == (vocab, merges)
    assert load_vocab_and_merges(vocab_path, merges_path) == (vocab, merges)
    with open(vocab_path, encoding="utf-8") as f:
        json.load(f)  # readable JSON


def test_gpt2_format_round_trips_gpt2_files(gpt2_files, tmp_path):
    paths = save_gpt2_files(*gpt2_files, tmp_path)
    assert load_gpt2_files(*paths) == gpt2_files


def test_pickles_round_trip_and_read_cs336_layouts(trained, tmp_path):
    vocab, merges = trained
    paths = save_pickle_files(vocab, merges, tmp_path / "vocab.pkl", tmp_path / "merges.pkl")
    assert load_pickle_files(*paths) == (vocab, merges)
    assert load_vocab_and_merges(*paths) == (vocab, merges)
    # what CS336 solutions write: plain pickle.dump, any protocol, or both objects in one file
    for protocol in (2, 3, pickle.HIGHEST_PROTOCOL):
        (tmp_path / "v.pkl").write_bytes(pickle.dumps(vocab, protocol=protocol))
        (tmp_path / "m.pkl").write_bytes(pickle.dumps(merges, protocol=protocol))
        assert load_vocab_and_merges(tmp_path / "v.pkl", tmp_path / "m.pkl") == (vocab, merges)
    (tmp_path / "both.pkl").write_bytes(pickle.dumps((vocab, merges)))
    assert load_pickle_files(tmp_path / "both.pkl", tmp_path / "both.pkl") == (vocab, merges)
    (tmp_path / "both.pkl").write_bytes(pickle.dumps({"vocab": vocab, "merges": merges}))
    assert load_pickle_files(tmp_path / "both.pkl", tmp_path / "both.pkl") == (vocab, merges)


def test_tokenizer_save_load_and_from_files_give_the_same_ids(trained_tokenizer, tmp_path):
    text = read("multi_sample.txt")[:30000]
    expected = trained_tokenizer.encode(text)
    trained_tokenizer.save(tmp_path / "saved")
    loaded = Tokenizer.load(tmp_path / "saved")
    assert loaded.vocab == trained_tokenizer.vocab and loaded.merges == trained_tokenizer.merges
    assert loaded.special_tokens == SPECIALS and loaded.pattern == trained_tokenizer.pattern
    assert loaded.encode(text) == expected
    from_text = Tokenizer.from_files(tmp_path / "saved" / "vocab.json", tmp_path / "saved" / "merges.txt",
                                     SPECIALS)
    assert from_text.encode(text) == expected
    trained_tokenizer.save_pickle(tmp_path / "vocab.pkl", tmp_path / "merges.pkl")
    from_pickles = Tokenizer.from_files(tmp_path / "vocab.pkl", tmp_path / "merges.pkl", SPECIALS)
    assert from_pickles.vocab == trained_tokenizer.vocab
    assert from_pickles.encode(text) == expected


# --- Hugging Face tokenizer.json ------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_hf(gpt2, tmp_path_factory):
    path = gpt2.save_tokenizer_json(tmp_path_factory.mktemp("hf") / "tokenizer.json")
    return tokenizers.Tokenizer.from_file(path), path


@pytest.mark.parametrize("name", ["address.txt", "german.txt", "tinystories_sample.txt",
                                  "corpus.en", "multi_sample.txt", "web_sample.txt"])
def test_exported_tokenizer_json_encodes_identically_in_hugging_face(gpt2, gpt2_hf, name):
    text = read(name)
    hf, _ = gpt2_hf
    ids = gpt2.encode(text)
    assert hf.encode(text).ids == ids
    assert hf.decode(ids, skip_special_tokens=False) == text


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
       | st.lists(st.sampled_from(["a", " ", "\n", "  ", "'s", "中文", "😀", EOT, "9", "\t"]),
                  max_size=20).map("".join))
@settings(max_examples=150)
def test_exported_tokenizer_json_on_generated_text(gpt2, gpt2_hf, text):
    hf, _ = gpt2_hf
    assert hf.encode(text).ids == gpt2.encode(text)


def test_tokenizer_json_of_trained_output(trained_tokenizer, tmp_path):
    path = trained_tokenizer.save_tokenizer_json(tmp_path / "tokenizer.json")
    hf = tokenizers.Tokenizer.from_file(path)
    text = read("multi_sample.txt")[:40000] + "<|pad|>" + EOT
    assert hf.encode(text).ids == trained_tokenizer.encode(text)
    vocab, merges, specials, pattern = load_hf_tokenizer_json(path)
    assert (vocab, merges, specials, pattern) == (
        trained_tokenizer.vocab, trained_tokenizer.merges, SPECIALS, trained_tokenizer.pattern)
    assert Tokenizer.from_tokenizer_json(path).encode(text) == trained_tokenizer.encode(text)


# --- tiktoken -------------------------------------------------------------------------------


def test_tiktoken_ranks_of_gpt2_equal_the_vocab_file(gpt2, tmp_path):
    expected = read_gpt2_vocab(FIXTURES / "gpt2_vocab.json")
    del expected[EOT.encode()]
    assert gpt2.tiktoken_ranks() == expected
    path = gpt2.save_tiktoken_ranks(tmp_path / "gpt2.tiktoken")
    assert tiktoken.load.load_tiktoken_bpe(str(path)) == expected


def test_tiktoken_ranks_file_of_trained_output_encodes_identically(trained_tokenizer, tmp_path):
    path = trained_tokenizer.save_tiktoken_ranks(tmp_path / "trained.tiktoken")
    ranks = tiktoken.load.load_tiktoken_bpe(str(path))
    assert ranks == trained_tokenizer.tiktoken_ranks()
    assert len(ranks) == len(trained_tokenizer.vocab) - len(SPECIALS)
    encoding = tiktoken.Encoding(name="trained", pat_str=trained_tokenizer.pattern, mergeable_ranks=ranks,
                                 special_tokens={EOT: 256, "<|pad|>": 257})
    text = read("multi_sample.txt")[:40000]
    assert encoding.encode(text, allowed_special="all") == trained_tokenizer.encode(text)


# --- bad files ------------------------------------------------------------------------------


def test_bad_gpt2_files_raise_naming_the_problem(tmp_path):
    merges = tmp_path / "merges.txt"
    merges.write_text("#version: 0.2\na b\n", encoding="utf-8")
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="vocab.json: not a JSON vocab file"):
        load_gpt2_files(vocab, merges)
    vocab.write_text('["a"]', encoding="utf-8")
    with pytest.raises(ValueError, match="expected a JSON object"):
        load_gpt2_files(vocab, merges)
    vocab.write_text('{"a": "1"}', encoding="utf-8")
    with pytest.raises(ValueError, match="token 'a' has id '1', not a non-negative integer"):
        load_gpt2_files(vocab, merges)
    vocab.write_text('{"a": 1, "b": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match="id 1 is given to two tokens"):
        load_gpt2_files(vocab, merges)
    vocab.write_text('{"a\u4e2d": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match="not in GPT-2's byte-to-unicode table"):
        load_gpt2_files(vocab, merges)
    vocab.write_text('{"a": 0}', encoding="utf-8")
    merges.write_text("#version: 0.2\na b c\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"merges.txt:2: expected two tokens, got 'a b c'"):
        load_gpt2_files(vocab, merges)
    with pytest.raises(FileNotFoundError, match="merges file not found"):
        load_gpt2_files(vocab, tmp_path / "missing.txt")
    with pytest.raises(IsADirectoryError, match="vocab path is a directory"):
        load_gpt2_files(tmp_path, merges)


def test_bad_pickles_raise_naming_the_problem(tmp_path):
    vocab = tmp_path / "vocab.pkl"
    merges = tmp_path / "merges.pkl"
    merges.write_bytes(pickle.dumps([(b"a", b"b")]))
    vocab.write_bytes(pickle.dumps(collections.OrderedDict({0: b"a"})))
    with pytest.raises(ValueError, match="refusing to load collections.OrderedDict"):
        load_pickle_files(vocab, merges)
    vocab.write_bytes(pickle.dumps({0: "a"}))
    with pytest.raises(TypeError, match=r"vocab.pkl\[0\]: expected bytes, got str"):
        load_pickle_files(vocab, merges)
    vocab.write_bytes(pickle.dumps({0: b"a"})[:-3])
    with pytest.raises(ValueError, match="vocab.pkl: cannot read vocab pickle: pickle data was truncated"):
        load_pickle_files(vocab, merges)
    vocab.write_bytes(pickle.dumps({0: b"a"}))
    merges.write_bytes(pickle.dumps([(b"a", b"b", b"c")]))
    with pytest.raises(TypeError, match=r"merges.pkl\[0\]: expected a \(bytes, bytes\) pair"):
        load_pickle_files(vocab, merges)
    text = tmp_path / "merges.txt"
    text.write_text("a b\n", encoding="utf-8")
    with pytest.raises(ValueError, match="is a pickle and the other is not"):
        load_vocab_and_merges(vocab, text)


def test_exports_refuse_a_vocab_with_the_same_bytes_twice(tmp_path):
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[256] = b"ab"
    vocab[257] = b"ab"
    with pytest.raises(ValueError, match="ids 256 and 257 have the same bytes"):
        tiktoken_ranks(vocab)
    with pytest.raises(ValueError, match="ids 256 and 257 have the same bytes"):
        Tokenizer(vocab, []).save_tokenizer_json(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="two ids for the same bytes"):
        save_gpt2_files(vocab, [], tmp_path)
    with pytest.raises(ValueError, match="same bytes"):
        save_tiktoken_ranks(vocab, [], tmp_path / "x.tiktoken")


def test_not_a_bpe_tokenizer_json(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}}), encoding="utf-8")
    with pytest.raises(ValueError, match="not a BPE tokenizer.json"):
        load_hf_tokenizer_json(path)
