"""Token files: `encode_file` equals whole-text `encode` for any workers and chunk sizes; dtype
choice; atomic output (failed, crashed and killed runs); sidecar; bad input."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbbpe import CL100K_PATTERN, InvalidUTF8Error, Tokenizer, encode_file, open_token_file
from nbbpe import token_files
from nbbpe.token_files import read_sidecar, tokenizer_sha256

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parent.parent
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def gpt2_plain(gpt2_files):
    """No special tokens: `<|endoftext|>` is ordinary text, chunks are cut at whitespace."""
    return Tokenizer(*gpt2_files)


def write(path, text: str) -> str:
    Path(path).write_bytes(text.encode("utf-8"))
    return str(path)


def ids_in(path) -> np.ndarray:
    return np.asarray(open_token_file(path))


def assert_no_output(path):
    path = str(path)
    assert not os.path.exists(path)
    assert not os.path.exists(path + ".json")
    assert not os.path.exists(path + ".partial")


# --- equal to whole-text encode ---------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("chunk_bytes", [1, 300, 1 << 20])
def test_equals_whole_text_encode_with_special_tokens(gpt2, tmp_path, workers, chunk_bytes):
    text = (FIXTURES / "web_sample.txt").read_text(encoding="utf-8")[:12_000]
    assert text.count(EOT) >= 3
    out = tmp_path / "out.bin"
    result = encode_file(gpt2, write(tmp_path / "in.txt", text), out, num_workers=workers,
                         chunk_bytes=chunk_bytes)
    expected = gpt2.encode(text)
    assert ids_in(out).tolist() == expected
    assert result.num_tokens == len(expected)
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.bin", "out.bin.json"]


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("chunk_bytes", [1, 500])
def test_equals_whole_text_encode_without_special_tokens(gpt2, gpt2_plain, tmp_path, workers,
                                                         chunk_bytes):
    # One corpus without special tokens, and one whose <|endoftext|> the tokenizer does not know.
    prose = (FIXTURES / "german.txt").read_text(encoding="utf-8") * 3
    prose += (FIXTURES / "address.txt").read_text(encoding="utf-8")
    docs = (FIXTURES / "tinystories_sample.txt").read_text(encoding="utf-8")
    for name, tokenizer, text in [("prose", gpt2, prose), ("docs", gpt2_plain, docs)]:
        out = tmp_path / f"{name}.bin"
        encode_file(tokenizer, write(tmp_path / f"{name}.txt", text), out, num_workers=workers,
                    chunk_bytes=chunk_bytes)
        assert ids_in(out).tolist() == tokenizer.encode(text), name


def test_equals_whole_text_encode_on_multilingual_text_in_many_chunks(gpt2, tmp_path):
    text = (FIXTURES / "multi_sample.txt").read_text(encoding="utf-8")[:60_000]
    out = tmp_path / "multi.bin"
    encode_file(gpt2, write(tmp_path / "multi.txt", text), out, num_workers=2, chunk_bytes=2_000)
    assert ids_in(out).tolist() == gpt2.encode(text)


def test_equals_whole_text_encode_with_the_cl100k_pattern(gpt2_files, tmp_path):
    tokenizer = Tokenizer(*gpt2_files, [EOT], pattern=CL100K_PATTERN)
    text = (FIXTURES / "web_sample.txt").read_text(encoding="utf-8")[:6_000] + "12345 6789\r\n  x\n"
    out = tmp_path / "out.bin"
    encode_file(tokenizer, write(tmp_path / "in.txt", text), out, num_workers=1, chunk_bytes=1)
    assert ids_in(out).tolist() == tokenizer.encode(text)


def test_overlapping_special_tokens_are_never_cut(gpt2_files, tmp_path):
    double = EOT + EOT
    tokenizer = Tokenizer(*gpt2_files, [EOT, double])
    text = f"a b{EOT}{EOT}{EOT} c d{EOT}{EOT}e f {EOT}" * 50
    out = tmp_path / "out.bin"
    encode_file(tokenizer, write(tmp_path / "in.txt", text), out, num_workers=2, chunk_bytes=1)
    assert ids_in(out).tolist() == tokenizer.encode(text)


def test_units_finishing_out_of_order_are_written_in_file_order(gpt2, tmp_path, monkeypatch):
    real = token_files.UnitEncoder.__call__

    def late_every_fourth_unit(self, unit):  # on the worker threads
        if unit.start % 4 == 0:
            time.sleep(0.02)
        return real(self, unit)

    monkeypatch.setattr(token_files.UnitEncoder, "__call__", late_every_fourth_unit)
    text = "".join(f"word{i} " for i in range(3000))
    out = tmp_path / "out.bin"
    encode_file(gpt2, write(tmp_path / "in.txt", text), out, num_workers=3, chunk_bytes=200)
    assert ids_in(out).tolist() == gpt2.encode(text)


PIECES = ["a", "Zq", "7", "42", " ", "  ", "\n", "\n\n", "\t", " x", "'s", "'ll", "!?", "é", "中文",
          "😀", EOT, f" {EOT}", "<|", "|>", "\r\n"]


@given(pieces=st.lists(st.sampled_from(PIECES), min_size=1, max_size=60),
       chunk_bytes=st.integers(1, 40))
@settings(max_examples=60)
def test_any_text_any_chunk_size_one_worker(gpt2, pieces, chunk_bytes):
    text = "".join(pieces)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.bin")
        encode_file(gpt2, write(os.path.join(tmp, "in.txt"), text), out, num_workers=1,
                    chunk_bytes=chunk_bytes)
        assert ids_in(out).tolist() == gpt2.encode(text)


def test_invalid_utf8_replaced_as_whole_file_decoding(gpt2, tmp_path):
    data = b"caf\xc3 ok\xff\xfe more text" + EOT.encode() + b" x\xe4\xb8 end\n"
    source = tmp_path / "bad.txt"
    source.write_bytes(data * 20)
    out = tmp_path / "out.bin"
    encode_file(gpt2, source, out, num_workers=2, chunk_bytes=1, errors="replace")
    assert ids_in(out).tolist() == gpt2.encode((data * 20).decode("utf-8", errors="replace"))


# --- dtype ------------------------------------------------------------------------------------


def tokenizer_with_largest_id(largest: int) -> Tokenizer:
    """Byte tokens, one more token with id `largest - 1`, and a special token appended at `largest`."""
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[largest - 1] = b"xyz"
    return Tokenizer(vocab, [], ["<|s|>"])


def test_uint32_is_chosen_past_65536_ids(tmp_path):
    tokenizer = tokenizer_with_largest_id(65_536)  # 65,537 ids
    assert tokenizer.n_vocab == 65_537
    text = "ab <|s|> c<|s|>"
    result = encode_file(tokenizer, write(tmp_path / "in.txt", text), tmp_path / "out.bin")
    assert result.dtype == "uint32"
    ids = open_token_file(tmp_path / "out.bin")
    assert ids.dtype == np.uint32
    assert ids.tolist() == tokenizer.encode(text)
    assert 65_536 in ids.tolist()
    assert os.path.getsize(tmp_path / "out.bin") == 4 * len(ids)
    assert np.fromfile(tmp_path / "out.bin", dtype=np.uint32).tolist() == ids.tolist()


def test_uint16_up_to_65536_ids(tmp_path):
    tokenizer = tokenizer_with_largest_id(65_535)  # 65,536 ids, the largest 65,535
    text = "<|s|>ab"
    result = encode_file(tokenizer, write(tmp_path / "in.txt", text), tmp_path / "out.bin")
    assert result.dtype == "uint16"
    assert np.fromfile(tmp_path / "out.bin", dtype=np.uint16).tolist() == [65_535, 97, 98]


def test_a_dtype_too_small_is_refused_before_any_work(tmp_path):
    tokenizer = tokenizer_with_largest_id(65_536)
    source = write(tmp_path / "in.txt", "ab")
    with pytest.raises(ValueError, match=r"uint16 cannot hold.*65,537 ids.*uint32"):
        encode_file(tokenizer, source, tmp_path / "out.bin", dtype=np.uint16)
    with pytest.raises(ValueError, match="int8 cannot hold"):
        tokenizer_with_largest_id(300).id_dtype("int8")
    with pytest.raises(TypeError, match="integer type"):
        encode_file(tokenizer, source, tmp_path / "out.bin", dtype=np.float32)
    assert_no_output(tmp_path / "out.bin")


def test_a_wider_dtype_can_be_forced(gpt2, tmp_path):
    text = "hello world" + EOT
    encode_file(gpt2, write(tmp_path / "in.txt", text), tmp_path / "out.bin", dtype="int32")
    assert read_sidecar(tmp_path / "out.bin")["dtype"] == "int32"
    assert open_token_file(tmp_path / "out.bin").tolist() == gpt2.encode(text)


# --- sidecar ----------------------------------------------------------------------------------


def test_sidecar_records_dtype_count_source_and_tokenizer_hash(gpt2, tmp_path):
    text = "Once upon a time" + EOT + "the end"
    source = write(tmp_path / "in.txt", text)
    result = encode_file(gpt2, source, tmp_path / "out.bin")
    meta = json.loads((tmp_path / "out.bin.json").read_text())
    assert meta["dtype"] == "uint16"
    assert meta["num_tokens"] == len(gpt2.encode(text)) == result.num_tokens
    assert meta["source_bytes"] == len(text.encode()) == result.source_bytes
    assert meta["source"] == os.path.abspath(source)
    assert meta["tokenizer_sha256"] == result.tokenizer_sha256 == tokenizer_sha256(gpt2)



def test_the_tokenizer_hash_depends_on_content_only(tmp_path):
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"th", 257: b"the"}
    merges = [(b"t", b"h"), (b"th", b"e")]
    tokenizer = Tokenizer(vocab, merges, [EOT])
    tokenizer.save(tmp_path / "tok")  # the same tokenizer, loaded another way: the same hash
    assert tokenizer_sha256(Tokenizer.load(tmp_path / "tok")) == tokenizer_sha256(tokenizer)
    others = [Tokenizer(vocab, merges[:1], [EOT]), Tokenizer(vocab, merges),
              Tokenizer(vocab, merges, ["<|other|>"]), Tokenizer(vocab, merges, [EOT], pattern=r"\S+|\s+"),
              Tokenizer(vocab | {256: b"he", 257: b"th", 258: b"the"}, merges, [EOT])]
    hashes = {tokenizer_sha256(t) for t in [tokenizer, *others]}
    assert len(hashes) == 1 + len(others)


def test_open_token_file_refuses_a_file_that_does_not_match_its_sidecar(gpt2, tmp_path):
    out = tmp_path / "out.bin"
    encode_file(gpt2, write(tmp_path / "in.txt", "some text " * 10), out)
    with open(out, "r+b") as f:
        f.truncate(os.path.getsize(out) - 2)
    with pytest.raises(ValueError, match="incomplete or was changed"):
        open_token_file(out)
    os.remove(str(out) + ".json")
    with pytest.raises(FileNotFoundError, match="no sidecar"):
        open_token_file(out)


# --- failures leave no file that looks complete -----------------------------------------------


def test_a_worker_error_is_raised_and_leaves_no_output_then_a_rerun_succeeds(gpt2, tmp_path):
    good = "fine text here " * 400
    source = tmp_path / "in.txt"
    source.write_bytes(good.encode() + b"bad \xff byte " + good.encode())
    out = tmp_path / "out.bin"
    with pytest.raises(InvalidUTF8Error, match=rf"in.txt byte {len(good) + 4}: invalid UTF-8"):
        encode_file(gpt2, source, out, num_workers=2, chunk_bytes=500)
    assert_no_output(out)
    result = encode_file(gpt2, source, out, num_workers=2, chunk_bytes=500, errors="replace")
    assert ids_in(out).tolist() == gpt2.encode(source.read_bytes().decode(errors="replace"))
    assert result.num_tokens == len(ids_in(out))


@pytest.mark.parametrize("chunk_bytes", [40, 300])
def test_the_first_invalid_byte_in_the_file_is_named_whichever_worker_fails_first(
        gpt2, tmp_path, chunk_bytes):
    source = tmp_path / "in.txt"
    source.write_bytes(b"ok text " * 30 + (b"bad \xff byte " + b"more text " * 5) * 20)
    for _ in range(3):
        with pytest.raises(InvalidUTF8Error, match=r"in.txt byte 244: invalid UTF-8"):
            encode_file(gpt2, source, tmp_path / "out.bin", num_workers=3, chunk_bytes=chunk_bytes)


def test_a_failing_worker_is_reported_and_a_failed_rerun_keeps_the_previous_output(
        gpt2, tmp_path, monkeypatch):
    text = "more fine text " * 400
    source = write(tmp_path / "in.txt", text)
    out = tmp_path / "out.bin"
    encode_file(gpt2, source, out, num_workers=2, chunk_bytes=500)
    before = (out.read_bytes(), (tmp_path / "out.bin.json").read_text())

    real = token_files.UnitEncoder.__call__

    def failing_encoder(self, unit):
        if unit.start > 2_000:
            raise MemoryError("out of memory in a worker")
        return real(self, unit)

    monkeypatch.setattr(token_files.UnitEncoder, "__call__", failing_encoder)
    with pytest.raises(MemoryError, match="out of memory in a worker"):
        encode_file(gpt2, source, out, num_workers=2, chunk_bytes=500)
    assert (out.read_bytes(), (tmp_path / "out.bin.json").read_text()) == before
    assert not os.path.exists(str(out) + ".partial")


KILLED_RUN = textwrap.dedent("""
    import sys, time
    from nbbpe import Tokenizer, encode_file, token_files
    real = token_files.UnitEncoder.__call__
    def slow_encoder(self, unit):
        time.sleep(0.05)
        return real(self, unit)
    token_files.UnitEncoder.__call__ = slow_encoder
    tokenizer = Tokenizer({i: bytes([i]) for i in range(256)}, [], ["<|endoftext|>"])
    encode_file(tokenizer, sys.argv[1], sys.argv[2], num_workers=2, chunk_bytes=1000)
""")


def test_a_killed_run_leaves_no_complete_looking_file_and_a_rerun_works(tmp_path):
    text = ("word " * 300 + EOT) * 200  # 300 chunks of 1 kB at 20 per second and worker
    source = write(tmp_path / "in.txt", text)
    out = tmp_path / "out.bin"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, source, str(out)], cwd=ROOT)
    try:
        partial = Path(str(out) + ".partial")
        deadline = time.monotonic() + 60
        while not (partial.exists() and partial.stat().st_size > 0):
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not out.exists() and not Path(str(out) + ".json").exists()

    tokenizer = Tokenizer({i: bytes([i]) for i in range(256)}, [], [EOT])
    encode_file(tokenizer, source, out, num_workers=2)
    assert ids_in(out).tolist() == tokenizer.encode(text)
    assert not partial.exists()


# --- bad input --------------------------------------------------------------------------------


def test_bad_input_gives_clear_errors(gpt2, tmp_path):
    source = write(tmp_path / "in.txt", "text")
    out = tmp_path / "out.bin"
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        encode_file(gpt2, tmp_path / "missing.txt", out)
    with pytest.raises(ValueError, match="corpus file is empty"):
        encode_file(gpt2, write(tmp_path / "empty.txt", ""), out)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ValueError, match="no files in directory"):
        encode_file(gpt2, tmp_path / "nothing", out)
    with pytest.raises(IsADirectoryError, match="output path is a directory"):
        encode_file(gpt2, source, tmp_path)
    with pytest.raises(ValueError, match="is an input file"):
        encode_file(gpt2, source, source)
    with pytest.raises(TypeError, match="must be an nbbpe Tokenizer"):
        encode_file(gpt2.encode, source, out)
    with pytest.raises(TypeError, match="output_path must be a str"):
        encode_file(gpt2, source, 3)
    for workers in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="num_workers must be a positive integer"):
            encode_file(gpt2, source, out, num_workers=workers)
    with pytest.raises(ValueError, match="chunk_bytes must be positive"):
        encode_file(gpt2, source, out, chunk_bytes=0)
    with pytest.raises(ValueError, match="errors must be one of"):
        encode_file(gpt2, source, out, errors="ignore")
    assert_no_output(out)
    assert Path(source).read_text() == "text"
