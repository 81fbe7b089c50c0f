"""The `nbbpe` command line, end to end on the shipped TinyStories sample."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nbbpe
from nbbpe import Tokenizer, open_token_file
from nbbpe.cli import main, sample_corpus_path
from nbbpe.vocab_files import save_gpt2_files

EOT = "<|endoftext|>"


def sample_text() -> str:
    return Path(sample_corpus_path()).read_text(encoding="utf-8")


def test_the_readme_commands_train_then_encode_the_shipped_sample(tmp_path):
    """`nbbpe train && nbbpe encode` as installed, in a fresh directory, with no corpus given."""
    nbbpe = Path(sys.executable).parent / "nbbpe"
    env = dict(os.environ, PYTHONIOENCODING="utf-8", NBBPE_TRACEBACK="1")  # should it fail
    train = subprocess.run([nbbpe, "train", "--out", "out/tokenizer"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stderr
    for line in ("wall time", "peak memory", "longest token"):
        assert line in train.stdout
    encode = subprocess.run([nbbpe, "encode", "--tokenizer", "out/tokenizer"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert encode.returncode == 0, encode.stderr
    assert "out/tinystories_sample.bin" in encode.stdout
    tokenizer = Tokenizer.load(tmp_path / "out" / "tokenizer")
    assert tokenizer.special_tokens == [EOT] and 5_000 < tokenizer.n_vocab <= 10_000
    ids = open_token_file(tmp_path / "out" / "tinystories_sample.bin")
    assert ids.dtype == np.uint16
    assert ids.tolist() == tokenizer.encode(sample_text())


def test_the_command_exits_with_mains_status(tmp_path):
    # `nbbpe` and `python -m nbbpe` run main, then exit with its status (without collecting)
    missing = tmp_path / "no_tokenizer"
    for command in ([Path(sys.executable).parent / "nbbpe"], [sys.executable, "-m", "nbbpe"]):
        failed = subprocess.run([*command, "encode", "--tokenizer", str(missing)], cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert failed.returncode == 2
        assert "nbbpe encode: error:" in failed.stderr and "no_tokenizer" in failed.stderr
    assert "Traceback" not in failed.stderr
    shown = subprocess.run([Path(sys.executable).parent / "nbbpe", "encode", "--tokenizer",
                            str(missing)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, NBBPE_TRACEBACK="1"))
    assert shown.returncode == 2 and "Traceback" in shown.stderr  # NBBPE_TRACEBACK: where from


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tokenizer trained by `nbbpe train` on the shipped sample, its directory and the output."""
    root = tmp_path_factory.mktemp("cli")
    tokenizer_dir = root / "tok"
    assert main(["train", "--vocab-size", "300", "--special-token", EOT, "--special-token", "<|pad|>",
                 "--out", str(tokenizer_dir), "--quiet", "--workers", "2"]) == 0
    return tokenizer_dir


def test_train_saves_a_tokenizer_that_loads_with_its_special_tokens(trained, capsys):
    tokenizer = Tokenizer.load(trained)
    assert tokenizer.special_tokens == [EOT, "<|pad|>"]
    assert tokenizer.n_vocab == 300 and len(tokenizer.merges) == 300 - 258


def test_encode_a_given_corpus_to_a_given_file_with_options(trained, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    text = sample_text()[:50_000] + "<|pad|>"
    corpus.write_text(text, encoding="utf-8")
    out = tmp_path / "ids" / "corpus.u32"
    assert main(["encode", "--tokenizer", str(trained), str(corpus), str(out), "--workers", "2",
                 "--dtype", "uint32", "--chunk-mb", "0.01", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "bytes/token" in printed and "MB/s" in printed and "tokens/s" in printed
    ids = np.fromfile(out, dtype=np.uint32)
    assert ids.tolist() == Tokenizer.load(trained).encode(text)
    meta = json.loads(Path(str(out) + ".json").read_text())
    assert meta["dtype"] == "uint32" and meta["num_tokens"] == len(ids)


def test_encode_defaults_to_out_slash_the_corpus_name(trained, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "stories.txt"
    corpus.write_text("Once upon a time" + EOT, encoding="utf-8")
    assert main(["encode", "--tokenizer", str(trained), str(corpus), "--quiet"]) == 0
    assert open_token_file(tmp_path / "out" / "stories.bin").tolist() == \
        Tokenizer.load(trained).encode("Once upon a time" + EOT)


def test_info_shows_vocab_longest_tokens_and_compression(trained, capsys):
    assert main(["info", str(trained), "--top", "3", "--sample-bytes", "20000"]) == 0
    printed = capsys.readouterr().out
    assert "300 ids, 42 merges, special tokens ['<|endoftext|>', '<|pad|>']" in printed
    learned = [a + b for a, b in Tokenizer.load(trained).merges]
    longest = sorted(learned, key=lambda t: (-len(t), t))[0]
    assert f"longest tokens  {longest.decode()!r} ({len(longest)} B), " in printed
    assert "bytes/token on the first 0.02 MB" in printed


def test_a_plain_gpt2_style_directory_takes_special_tokens_from_the_command_line(tmp_path, capsys):
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"th", 257: b"the"}
    save_gpt2_files(vocab, [(b"t", b"h"), (b"th", b"e")], tmp_path / "plain")
    corpus = tmp_path / "in.txt"
    corpus.write_text(f"the end{EOT}then", encoding="utf-8")
    out = tmp_path / "out.bin"
    assert main(["encode", "--tokenizer", str(tmp_path / "plain"), "--special-token", EOT,
                 str(corpus), str(out), "--quiet"]) == 0
    assert open_token_file(out).tolist() == [257, 32, 101, 110, 100, 258, 257, 110]


@pytest.mark.parametrize("argv, message", [
    (["encode", "--tokenizer", "{tmp}/nowhere"], "tokenizer directory not found"),
    (["encode", "--tokenizer", "{tmp}"], "no tokenizer in"),
    (["encode", "--tokenizer", "{tok}", "{tmp}/missing.txt"], "corpus file not found"),
    (["encode", "--tokenizer", "{tok}", "--special-token", "<|x|>"], "only for plain vocab.json"),
    (["encode", "--tokenizer", "{tok}", "{tmp}/in.txt", "-o", "{tmp}/in.txt"], "is an input file"),
    (["train", "{tmp}/in.txt", "--vocab-size", "100", "--out", "{tmp}/t"], "vocab_size=100 is too small"),
    (["info", "{tmp}/nowhere"], "tokenizer directory not found"),
])
def test_bad_input_exits_with_a_clear_message(trained, tmp_path, capsys, argv, message):
    (tmp_path / "in.txt").write_text("some text", encoding="utf-8")
    argv = [a.format(tmp=tmp_path, tok=trained) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith(f"nbbpe {argv[0]}: error:")
    assert not (tmp_path / "in.txt.json").exists()


def test_a_dtype_too_small_for_the_vocab_is_an_error(tmp_path, capsys):
    vocab = {i: bytes([i]) for i in range(256)} | {70_000: b"big"}
    save_gpt2_files(vocab, [], tmp_path / "big")
    (tmp_path / "in.txt").write_text("text", encoding="utf-8")
    assert main(["encode", "--tokenizer", str(tmp_path / "big"), str(tmp_path / "in.txt"),
                 str(tmp_path / "out.bin"), "--dtype", "uint16"]) == 2
    assert "uint16 cannot hold the ids of this tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "out.bin").exists()


# --- sources, options and the cluster -----------------------------------------------------------


def _docs(n=200) -> list[str]:
    return [d for d in sample_text().split(EOT) if d.strip()][:n]


@pytest.fixture(scope="module")
def jsonl_and_parquet(tmp_path_factory):
    """Two JSONL files (one gzipped, its text in the field "body") and a Parquet file."""
    import gzip

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    root = tmp_path_factory.mktemp("sources")
    docs = _docs()
    (root / "a.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs[:80]),
                                  encoding="utf-8")
    with gzip.open(root / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"body": d}) + "\n" for d in docs[80:150])
    pq.write_table(pa.table({"story": docs[150:]}), root / "c.parquet", row_group_size=20)
    return root, docs


def test_train_takes_several_sources_with_their_fields_and_a_pattern(jsonl_and_parquet, tmp_path,
                                                                      capsys):
    root, docs = jsonl_and_parquet
    sources = [str(root / "*.jsonl*"), str(root / "c.parquet")]
    assert main(["train", *sources, "--text-field", "body", "--text-column", "story",
                 "--pattern", "cl100k", "--vocab-size", "320", "--out", str(tmp_path / "tok"),
                 "--quiet", "--chunk-mb", "0.01"]) == 0
    tokenizer = Tokenizer.load(tmp_path / "tok")
    vocab, merges = nbbpe.train_bpe_from_iterator(docs, 320, [EOT], pattern=nbbpe.CL100K_PATTERN)
    assert tokenizer.pattern == nbbpe.CL100K_PATTERN and tokenizer.merges == merges


def test_train_takes_a_regex_pattern_and_refuses_a_bad_one(tmp_path, capsys):
    corpus = tmp_path / "in.txt"
    corpus.write_text("aaa bbb aaa bbb ccc", encoding="utf-8")
    assert main(["train", str(corpus), "--pattern", r"\w+|\s+", "--vocab-size", "260",
                 "--out", str(tmp_path / "tok"), "--quiet"]) == 0
    assert Tokenizer.load(tmp_path / "tok").pattern == r"\w+|\s+"
    assert main(["train", str(corpus), "--pattern", "(a)|b", "--out", str(tmp_path / "t2")]) == 2
    assert "--pattern '(a)|b' is neither one of gpt2, cl100k, o200k nor a usable regex" in \
        capsys.readouterr().err


def test_invalid_utf8_names_the_command_line_option(trained, tmp_path, capsys):
    corpus = tmp_path / "bad.txt"
    corpus.write_bytes(b"Once upon a time \xff there was" + EOT.encode())
    for argv in (["train", str(corpus), "--vocab-size", "260", "--out", str(tmp_path / "t")],
                 ["encode", "--tokenizer", str(trained), str(corpus), "-o", str(tmp_path / "o")]):
        assert main([*argv, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "bad.txt byte 17: invalid UTF-8" in err
        assert "pass --errors replace" in err and "errors='replace'" not in err
        assert main([*argv, "--quiet", "--errors", "replace"]) == 0
    assert open_token_file(tmp_path / "o").tolist() == Tokenizer.load(trained).encode(
        corpus.read_bytes().decode("utf-8", errors="replace"))


def test_encode_jsonl_and_parquet_with_or_without_a_separator(trained, jsonl_and_parquet, tmp_path,
                                                              capsys):
    root, docs = jsonl_and_parquet
    tokenizer = Tokenizer.load(trained)
    common = ["encode", "--tokenizer", str(trained), str(root), "--text-field", "body",
              "--text-column", "story", "--quiet", "--chunk-mb", "0.01"]
    assert main([*common, "-o", str(tmp_path / "auto.bin")]) == 0
    eot = tokenizer.encode(EOT)
    assert open_token_file(tmp_path / "auto.bin").tolist() == \
        [i for d in docs for i in tokenizer.encode(d) + eot]
    assert main([*common, "-o", str(tmp_path / "none.bin"), "--separator", "none"]) == 0
    assert open_token_file(tmp_path / "none.bin").tolist() == \
        [i for d in docs for i in tokenizer.encode(d)]
    assert main([*common, "-o", str(tmp_path / "pad.bin"), "--separator", "<|pad|>"]) == 0
    assert open_token_file(tmp_path / "pad.bin").tolist() == \
        [i for d in docs for i in tokenizer.encode(d) + tokenizer.encode("<|pad|>")]
    assert main([*common, "-o", str(tmp_path / "x.bin"), "--separator", "<|nope|>"]) == 2
    assert "separator '<|nope|>' is not one of the tokenizer's special tokens" in \
        capsys.readouterr().err


def test_encode_into_shards_by_default_in_out_slash_the_source_name(trained, tmp_path,
                                                                    monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "stories.txt"
    text = sample_text()[:200_000]
    corpus.write_text(text, encoding="utf-8")
    assert main(["encode", "--tokenizer", str(trained), str(corpus), "--shard-bytes", "40K",
                 "--chunk-mb", "0.01", "--quiet"]) == 0
    assert " in 5 shards" in capsys.readouterr().out
    shards = open_token_file(tmp_path / "out" / "stories")
    assert len(shards.shards) == 5
    assert shards[:].tolist() == Tokenizer.load(trained).encode(text)


@pytest.mark.parametrize("source, shards, expected", [
    ("data/stories.txt", False, "out/stories.bin"), ("a/b.jsonl.gz", False, "out/b.bin"),
    ("c.parquet", True, "out/c"), ("corpus/", False, "out/corpus.bin"),
    ("s3://bucket/x.json.zst", False, "out/x.bin"), ("plain", False, "out/plain.bin")])
def test_the_default_output_is_named_after_the_source(source, shards, expected):
    from nbbpe.cli import default_output_path

    assert default_output_path(source, shards) == expected.replace("/", os.sep)


def test_the_older_form_encode_corpus_output_still_writes_the_output(trained, tmp_path, capsys):
    corpus = tmp_path / "in.txt"
    corpus.write_text("Once upon a time" + EOT, encoding="utf-8")
    out = tmp_path / "in.bin"
    for _ in range(2):  # the second time, OUT exists: it is still the output, not a source
        assert main(["encode", "--tokenizer", str(trained), str(corpus), str(out), "--quiet"]) == 0
        assert open_token_file(out).tolist() == Tokenizer.load(trained).encode(corpus.read_text())
    other = tmp_path / "more.txt"
    other.write_text(" and then", encoding="utf-8")
    assert main(["encode", "--tokenizer", str(trained), str(corpus), str(other), "--quiet"]) == 2
    assert "give the output with -o OUT when encoding several sources" in capsys.readouterr().err
    assert main(["encode", "--tokenizer", str(trained), str(corpus), str(other), "-o", str(out),
                 "--quiet"]) == 0
    assert open_token_file(out).tolist() == Tokenizer.load(trained).encode(
        "Once upon a time" + EOT) + Tokenizer.load(trained).encode(" and then")


def test_a_scheduler_that_cannot_be_reached_is_a_clear_error(tmp_path, capsys):
    pytest.importorskip("distributed")
    assert main(["train", "--scheduler", "tcp://127.0.0.1:9", "--connect-timeout", "0.5",
                 "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Dask scheduler at 'tcp://127.0.0.1:9'" in err
    assert "dask scheduler" in err and "dask worker tcp://127.0.0.1:9" in err


def test_without_dask_the_scheduler_option_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "nbbpe.distributed", raising=False)
    monkeypatch.setitem(sys.modules, "distributed", None)
    assert main(["train", "--scheduler", "tcp://127.0.0.1:9", "--out", str(tmp_path / "t")]) == 2
    assert "pip install 'nbbpe[dask]'" in capsys.readouterr().err


def test_workers_and_scheduler_together_are_refused(capsys):
    assert main(["train", "--workers", "2", "--scheduler", "tcp://127.0.0.1:9"]) == 2
    assert "give --workers or --scheduler, not both" in capsys.readouterr().err


@pytest.mark.parametrize("text, size", [("1000", 1000), ("64K", 64 << 10), ("1.5M", 3 << 19),
                                        ("2GiB", 2 << 30), ("1g", 1 << 30)])
def test_shard_sizes_take_units(text, size):
    from nbbpe.cli import _byte_size

    assert _byte_size(text) == size


def test_a_bad_shard_size_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["encode", "--shard-bytes", "lots"])
    assert "not a size in bytes: 'lots'" in capsys.readouterr().err


def test_a_first_run_on_a_small_source_compiles_nothing(tmp_path):
    # An empty Numba cache: `nbbpe train` counts with `regex` and learns the merges in Python,
    # `nbbpe encode` encodes in Python (in several units, on two workers), and no kernel is
    # compiled; the files are those of the compiled path.
    text = sample_text()[:120_000]
    (tmp_path / "small.txt").write_text(text, encoding="utf-8")
    cache = tmp_path / "numba_cache"
    cache.mkdir()
    nbbpe = Path(sys.executable).parent / "nbbpe"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONIOENCODING="utf-8",
               NBBPE_TRACEBACK="1")
    for command in (["train", "small.txt", "--vocab-size", "600", "--out", "tok"],
                    ["encode", "small.txt", "--tokenizer", "tok", "-o", "small.bin"]):
        done = subprocess.run([nbbpe, *command, "--chunk-mb", "0.01", "--workers", "2"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "compiling kernels" not in done.stderr
    assert [p.name for p in cache.rglob("*") if p.is_file()] == []
    vocab, merges = nbbpe_train_compiled(tmp_path / "small.txt", 600)
    tokenizer = Tokenizer.load(tmp_path / "tok")
    assert tokenizer.merges == merges
    assert open_token_file(tmp_path / "small.bin").tolist() == Tokenizer(
        vocab, merges, [EOT], pretokenizer="compiled").encode(text)


def nbbpe_train_compiled(path, vocab_size):
    return nbbpe.train_bpe(path, vocab_size, [EOT], pretokenizer="compiled")
