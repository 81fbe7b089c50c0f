"""The `nbbpe` command line, end to end on the shipped TinyStories sample."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nbbpe import Tokenizer, open_token_file
from nbbpe.cli import main, sample_corpus_path
from nbbpe.vocab_files import save_gpt2_files

EOT = "<|endoftext|>"


def sample_text() -> str:
    return Path(sample_corpus_path()).read_text(encoding="utf-8")


def test_the_readme_commands_train_then_encode_the_shipped_sample(tmp_path):
    """`nbbpe train && nbbpe encode` as installed, in a fresh directory, with no corpus given."""
    nbbpe = Path(sys.executable).parent / "nbbpe"
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
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
    (["encode", "--tokenizer", "{tok}", "{tmp}/in.txt", "{tmp}/in.txt"], "is an input file"),
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
