"""The Python encoder a small first `encode_file` uses instead of compiling the kernels: the same
ids as the kernels, as tiktoken and as the reference twin, in both merge orders, with special
tokens and any pattern; and `encode_file` takes it only where it should."""

import gzip
import json
from pathlib import Path

import pytest
import tiktoken
from hypothesis import given
from hypothesis import strategies as st
from tiktoken.load import load_tiktoken_bpe

from nbbpe import (CL100K_PATTERN, O200K_PATTERN, InvalidUTF8Error, Tokenizer, encode_file,
                   open_token_file, train_bpe)
from nbbpe import encode_python, sources
from nbbpe.encode_python import TooMuchWork, PythonEncoder, python_encoding_for
from nbbpe.sources import resolve_source
from nbbpe.workers import LocalExecutor

FIXTURES = Path(__file__).parent / "fixtures"
EOT = "<|endoftext|>"
TEXTS = ["corpus.en", "german.txt", "multi_sample.txt", "pretok_multilingual.txt",
         "tinystories_sample.txt", "web_sample.txt", "address.txt"]


def read(name: str, size: int = 200_000) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")[:size]


pieces = st.one_of(
    st.text(max_size=8),
    st.from_regex(r" ?[A-Za-z]{1,10}| ?[0-9]{1,7}|[ \r\n\t]{1,5}|[!-/:-@]{1,4}", fullmatch=True),
    st.text(alphabet="中文日本語한국어\u0301\u0915eé🙂", min_size=1, max_size=6),
    st.sampled_from([EOT, "<|", "|>", EOT + EOT, "'s", " 's", "'LL", "a" * 40, "ab" * 30]),
)
texts = st.lists(pieces, max_size=30).map("".join)


@pytest.mark.parametrize("name", TEXTS)
def test_gpt2s_files_give_the_kernels_ids(gpt2, name):
    text = read(name)
    assert PythonEncoder(gpt2).encode(text) == gpt2.encode(text)


@given(texts)
def test_gpt2s_files_give_the_kernels_ids_on_any_text(gpt2, text):
    assert PythonEncoder(gpt2).encode(text) == gpt2.encode(text)


@pytest.fixture(scope="module", params=[("cl100k_base", CL100K_PATTERN, 100257),
                                        ("o200k_base", O200K_PATTERN, 199999)])
def rank_file(request):
    """(nbbpe Tokenizer, tiktoken Encoding) of one of OpenAI's rank files (RANKS order)."""
    name, pattern, eot = request.param
    path = FIXTURES / f"{name}.tiktoken"
    theirs = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=load_tiktoken_bpe(str(path)),
                               special_tokens={EOT: eot})
    return Tokenizer.from_tiktoken_file(path, pattern, {EOT: eot}), theirs


def test_rank_files_give_tiktokens_and_the_kernels_ids(rank_file):
    ours, theirs = rank_file
    encoder = PythonEncoder(ours)
    for name in TEXTS:
        text = read(name, 50_000)
        expected = theirs.encode(text, allowed_special="all")
        assert encoder.encode(text) == expected == ours.encode(text), name


@given(texts)
def test_rank_files_give_tiktokens_ids_on_any_text(rank_file, text):
    ours, theirs = rank_file
    assert PythonEncoder(ours).encode(text) == theirs.encode(text, allowed_special="all")


@pytest.fixture(scope="module")
def repetitive():
    """A tokenizer trained on text of few letters, whose merges overlap (`aa`, `aaa`, `aaaa`):
    where merging every occurrence of a pair in a round, left to right, matters."""
    import tempfile

    text = " ".join(["aaaa", "aaa", "abab", "aab", "baaa", "aaaaaaa", "ba", "bbbbb"] * 50)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "text.txt"
        path.write_text(text, encoding="utf-8")
        vocab, merges = train_bpe(path, 256 + 20, [EOT])
    return Tokenizer(vocab, merges, [EOT])


@given(st.text(alphabet="ab <|endoftext|>", max_size=60))
def test_merge_rounds_give_the_kernels_ids(repetitive, text):
    assert PythonEncoder(repetitive).encode(text) == repetitive.encode(text)


def test_a_custom_pattern_gives_the_regex_paths_ids(gpt2_files):
    tok = Tokenizer(*gpt2_files, [EOT], pattern=r"\p{L}+|\p{N}|\s+|[^\s\p{L}\p{N}]+")
    text = read("multi_sample.txt") + EOT + read("web_sample.txt", 20_000)
    assert PythonEncoder(tok).encode(text) == tok.encode(text)


def test_a_pretoken_too_long_to_merge_in_python_is_refused(gpt2):
    encoder = PythonEncoder(gpt2)
    longest = "x" * encode_python.LONGEST_PRETOKEN
    assert encoder.encode(longest) == gpt2.encode(longest)
    with pytest.raises(TooMuchWork):
        encoder.encode(" " + longest + "x")


# --- when encode_file takes it ------------------------------------------------------------------


def _python_encodes(monkeypatch) -> list:
    """Record each text `PythonEncoder.encode` is given."""
    seen = []
    encode = PythonEncoder.encode

    def spy(self, text):
        seen.append(text)
        return encode(self, text)

    monkeypatch.setattr(PythonEncoder, "encode", spy)
    return seen


def test_a_first_run_encodes_a_small_source_in_python_to_the_same_file(gpt2_files, tmp_path,
                                                                        monkeypatch):
    # Compiling the encode kernel takes seconds, more than Python takes on a small source: a
    # first run (the kernel not in the cache: conftest says it is) encodes in Python.
    text = read("web_sample.txt", 60_000)
    source = tmp_path / "in.txt"
    source.write_text(text, encoding="utf-8")
    expected = Tokenizer(*gpt2_files, [EOT]).encode(text)
    seen = _python_encodes(monkeypatch)
    monkeypatch.setattr(encode_python, "encode_kernel_compiled", lambda tokenizer: False)
    for workers in (1, 2):
        encode_file(Tokenizer(*gpt2_files, [EOT]), source, tmp_path / "out.bin",
                    num_workers=workers, chunk_bytes=4096)
        assert list(open_token_file(tmp_path / "out.bin")) == expected
        # every unit in Python (two workers take them in any order)
        assert sum(map(len, seen)) == len(text) and all(unit in text for unit in seen)
        seen.clear()
    docs = text.split(EOT)  # JSONL: each document followed by the separator
    lines = tmp_path / "docs.jsonl"
    lines.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs), encoding="utf-8")
    tok = Tokenizer(*gpt2_files, [EOT])
    encode_file(tok, lines, tmp_path / "docs.bin")
    assert seen == docs
    eot = Tokenizer(*gpt2_files, [EOT]).encode(EOT)
    assert list(open_token_file(tmp_path / "docs.bin")) == [
        i for doc in docs for i in [*tok.encode(doc), *eot]]


def test_the_kernels_encode_where_python_should_not(gpt2_files, tmp_path, monkeypatch):
    text = read("web_sample.txt", 20_000)
    source = tmp_path / "in.txt"
    source.write_text(text, encoding="utf-8")
    expected = Tokenizer(*gpt2_files, [EOT]).encode(text)
    seen = _python_encodes(monkeypatch)
    compiled = {"yes": True}
    monkeypatch.setattr(encode_python, "encode_kernel_compiled", lambda t: compiled["yes"])

    def encodes_in_python(source, **options) -> bool:
        tok = Tokenizer(*gpt2_files, [EOT], **options)
        encode_file(tok, source, tmp_path / "out.bin")
        assert list(open_token_file(tmp_path / "out.bin")) == expected
        used = bool(seen)
        seen.clear()
        return used

    assert not encodes_in_python(source)  # the kernel is cached: it encodes small sources too
    compiled["yes"] = False
    assert encodes_in_python(source)
    assert not encodes_in_python(source, pretokenizer="compiled")  # as asked
    assert encodes_in_python(source, pretokenizer="regex")  # regex pre-tokens either way
    packed = tmp_path / "in.txt.gz"  # compressed: its size says little of the text's
    packed.write_bytes(gzip.compress(text.encode()))
    assert not encodes_in_python(packed)
    monkeypatch.setattr(sources, "SMALL_SOURCE", len(text.encode()) - 1)  # not small
    assert not encodes_in_python(source)


def test_python_encoding_for_needs_a_local_source_and_no_tables_yet(gpt2_files, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setattr(encode_python, "encode_kernel_compiled", lambda tokenizer: False)
    (tmp_path / "in.txt").write_text("a b")
    files = resolve_source(str(tmp_path / "in.txt"))
    tok = Tokenizer(*gpt2_files, [EOT])
    assert python_encoding_for(tok, files, None)
    assert python_encoding_for(tok, files, LocalExecutor(2))
    assert not python_encoding_for(tok, files, object())  # e.g. a Dask cluster
    tok.encode("built")  # the tables are built: the kernels are loaded
    assert not python_encoding_for(tok, files, None)


def test_encode_kernel_is_the_one_the_tokenizer_runs(gpt2_files, rank_file):
    from nbbpe import encode

    assert encode_python.encode_kernel(Tokenizer(*gpt2_files)) is encode.encode_gpt2_merges
    assert encode_python.encode_kernel(Tokenizer(*gpt2_files, pretokenizer="regex")) is (
        encode.encode_pieces_merges)
    tok = rank_file[0]
    assert encode_python.encode_kernel(tok) is encode.ENCODERS[tok._family][encode.RANKS]


def test_a_long_pretoken_hands_the_job_to_the_kernels(gpt2_files, tmp_path, monkeypatch):
    text = read("web_sample.txt", 20_000) + "x" * 1000 + read("corpus.en", 20_000)
    source = tmp_path / "in.txt"
    source.write_text(text, encoding="utf-8")
    monkeypatch.setattr(encode_python, "encode_kernel_compiled", lambda tokenizer: False)
    seen = _python_encodes(monkeypatch)
    tok = Tokenizer(*gpt2_files, [EOT])
    encode_file(tok, source, tmp_path / "out.bin", num_workers=1)
    assert list(open_token_file(tmp_path / "out.bin")) == tok.encode(text)
    assert seen and "x" * 1000 in seen[-1]  # Python met it, the kernels encoded it


def test_invalid_utf8_in_python_as_in_the_kernels(gpt2_files, tmp_path, monkeypatch):
    data = "héllo wörld ".encode() * 50 + b"\xff\xfe bad " + "more text".encode() * 20
    bad = data.index(b"\xff")
    source = tmp_path / "in.txt"
    source.write_bytes(data)
    monkeypatch.setattr(encode_python, "encode_kernel_compiled", lambda tokenizer: False)
    seen = _python_encodes(monkeypatch)
    tok = Tokenizer(*gpt2_files, [EOT])
    with pytest.raises(InvalidUTF8Error, match=rf"in.txt byte {bad}: invalid UTF-8"):
        encode_file(tok, source, tmp_path / "out.bin", num_workers=1)
    assert not (tmp_path / "out.bin").exists()
    encode_file(tok, source, tmp_path / "out.bin", num_workers=1, errors="replace")
    assert seen and "\ufffd" in seen[-1]
    assert list(open_token_file(tmp_path / "out.bin")) == tok.encode(
        data.decode("utf-8", errors="replace"))


def _job_past_the_python_budget(tmp_path, monkeypatch):
    """(text, its file): a small job encode_file starts in Python (the kernel counts as not
    compiled), whose many long new pre-tokens pass a budget (`MOST_WORK`) lowered to 500."""
    text = read("multi_sample.txt", 30_000)
    source = tmp_path / "in.txt"
    source.write_text(text, encoding="utf-8")
    monkeypatch.setattr(encode_python, "encode_kernel_compiled", lambda tokenizer: False)
    monkeypatch.setattr(encode_python, "MOST_WORK", 500)
    return text, source


def test_too_much_merging_in_python_hands_the_job_to_the_kernels(gpt2_files, tmp_path,
                                                                  monkeypatch):
    # many long new pre-tokens could take Python minutes: past MOST_WORK the kernels take over
    text, source = _job_past_the_python_budget(tmp_path, monkeypatch)
    seen = _python_encodes(monkeypatch)
    kernel_calls = []
    encode_utf8 = Tokenizer.encode_utf8
    monkeypatch.setattr(Tokenizer, "encode_utf8",
                        lambda self, *a, **k: kernel_calls.append(1) or encode_utf8(self, *a, **k))
    tok = Tokenizer(*gpt2_files, [EOT])
    encode_file(tok, source, tmp_path / "out.bin", num_workers=1, chunk_bytes=4096)
    assert list(open_token_file(tmp_path / "out.bin")) == tok.encode(text)
    assert seen and kernel_calls  # Python began, the kernels finished
    with pytest.raises(TooMuchWork):
        PythonEncoder(tok).encode(text)


def test_when_the_kernels_take_over_one_thread_loads_them_first(gpt2_files, tmp_path,
                                                                monkeypatch):
    # as encode_file warms the kernels up before its threads start when it uses them from the
    # beginning: loading kernels in one thread while another calls one is not safe
    text, source = _job_past_the_python_budget(tmp_path, monkeypatch)
    events = []
    encode, encode_utf8 = Tokenizer.encode, Tokenizer.encode_utf8
    monkeypatch.setattr(Tokenizer, "encode",
                        lambda self, text: events.append(text) or encode(self, text))
    monkeypatch.setattr(Tokenizer, "encode_utf8",
                        lambda self, *a, **k: events.append("kernel") or encode_utf8(self, *a, **k))
    tok = Tokenizer(*gpt2_files, [EOT])
    encode_file(tok, source, tmp_path / "out.bin", num_workers=2, chunk_bytes=4096)
    assert events.count("warm up") == 1 and "kernel" in events
    assert events.index("warm up") < events.index("kernel")
    assert list(open_token_file(tmp_path / "out.bin")) == encode(tok, text)
