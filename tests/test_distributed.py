"""Training and encoding on a Dask cluster give exactly what the local threads give.

One LocalCluster of two worker processes (one thread each) on 127.0.0.1 serves the module. The
classes below that wrap a state or a function run on the workers, which import this module.
"""

import gzip
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import nbbpe  # noqa: E402
from nbbpe import SourceError, Tokenizer  # noqa: E402
from nbbpe.cli import main, sample_corpus_path  # noqa: E402
from nbbpe.distributed import DaskExecutor, _Failed  # noqa: E402
from nbbpe.pretokenize import _UnitCounterFactory  # noqa: E402
from nbbpe.pretokenize_kernels import merge_counts  # noqa: E402
from nbbpe.sources import SourceFile, Unit, plan_units, resolve_source  # noqa: E402
from nbbpe.token_files import UnitEncoder  # noqa: E402
from nbbpe.vocab_files import unspell  # noqa: E402
from nbbpe.workers import LocalExecutor  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
EOT = "<|endoftext|>"
STARTUP_SECONDS = 180  # a cold Numba cache makes the first tasks compile on 2 busy cores


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None,
                                  silence_logs=logging.CRITICAL,
                                  timeout=STARTUP_SECONDS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster):
    with distributed.Client(cluster, timeout=STARTUP_SECONDS) as client:
        client.wait_for_workers(2, timeout=STARTUP_SECONDS)
        yield client


def documents(path=FIXTURES / "corpus.en") -> list[str]:
    """The documents of a text file: split at <|endoftext|>, or else its non-blank lines."""
    text = Path(path).read_text(encoding="utf-8")
    return [d for d in (text.split(EOT) if EOT in text else text.splitlines()) if d.strip()]


@pytest.fixture(scope="module")
def mixed_source(tmp_path_factory):
    """A directory of JSONL, gzipped JSONL and Parquet files (several units each)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    root = tmp_path_factory.mktemp("mixed")
    docs = documents() + documents(sample_corpus_path())[:300]
    third = len(docs) // 3
    lines = "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs[:third]))
    (root / "a.jsonl").write_text(lines, encoding="utf-8")
    with gzip.open(root / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs[third:2 * third])
    pq.write_table(pa.table({"text": docs[2 * third:]}), root / "c.parquet", row_group_size=40)
    return root


# --- training -----------------------------------------------------------------------------------


def test_the_executor_has_the_cluster_threads(client):
    assert DaskExecutor(client).num_workers == 2


@pytest.mark.parametrize("vocab_size", [300, 700])
def test_training_on_a_text_file_gives_the_local_merges(client, vocab_size):
    corpus = FIXTURES / "corpus.en"
    local = nbbpe.train_bpe(corpus, vocab_size, [EOT], chunk_bytes=6_000, num_workers=2)
    on_dask = nbbpe.train_bpe(corpus, vocab_size, [EOT], chunk_bytes=6_000, client=client)
    assert on_dask == local


def test_training_matches_the_cs336_reference(client):
    vocab, merges = nbbpe.train_bpe(FIXTURES / "corpus.en", 500, [EOT], client=client)
    with open(FIXTURES / "train-bpe-reference-merges.txt", encoding="utf-8") as f:
        expected = [tuple(unspell(part) for part in line.rstrip("\n").split(" ")) for line in f]
    assert merges == expected


@pytest.mark.parametrize("vocab_size", [400, 1000])
def test_training_on_jsonl_and_parquet_gives_the_local_merges(client, mixed_source, vocab_size):
    local = nbbpe.train_bpe(mixed_source, vocab_size, [EOT], chunk_bytes=20_000, num_workers=2)
    on_dask = nbbpe.train_bpe(mixed_source, vocab_size, [EOT], chunk_bytes=20_000, client=client)
    assert on_dask == local


@pytest.mark.parametrize("vocab_size", [350, 900])
def test_training_from_an_iterator_gives_the_local_merges(client, vocab_size):
    docs = documents()
    local = nbbpe.train_bpe_from_iterator(docs, vocab_size, [EOT], chunk_bytes=4_000)
    # Small tasks and checkpoints: the lineage of the iterator's data is cut several times.
    executor = DaskExecutor(client, group_bytes=12_000, lineage_bytes=40_000)
    on_dask = nbbpe.train_bpe_from_iterator(iter(docs), vocab_size, [EOT], chunk_bytes=4_000,
                                            client=executor)
    assert on_dask == local


def test_an_empty_iterator_gives_no_merges(client):
    vocab, merges = nbbpe.train_bpe_from_iterator(iter([]), 300, [EOT], client=client)
    assert merges == [] and len(vocab) == 257


# --- encoding -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    vocab, merges = nbbpe.train_bpe(FIXTURES / "corpus.en", 600, [EOT])
    return Tokenizer(vocab, merges, [EOT])


def _same_outputs(local, on_dask):
    assert on_dask.num_tokens == local.num_tokens > 0
    if os.path.isdir(local.path):
        names = sorted(os.listdir(local.path))
        assert sorted(os.listdir(on_dask.path)) == names and len(names) > 2
        for name in names:
            assert Path(on_dask.path, name).read_bytes() == Path(local.path, name).read_bytes()
    else:
        assert Path(on_dask.path).read_bytes() == Path(local.path).read_bytes()
        assert Path(on_dask.sidecar_path).read_bytes() == Path(local.sidecar_path).read_bytes()


def test_encoding_a_text_file_writes_the_local_bytes(client, tokenizer, tmp_path):
    source = sample_corpus_path()
    local = nbbpe.encode_file(tokenizer, source, tmp_path / "local.bin", chunk_bytes=50_000)
    on_dask = nbbpe.encode_file(tokenizer, source, tmp_path / "dask.bin", chunk_bytes=50_000,
                                client=client)
    _same_outputs(local, on_dask)
    assert nbbpe.open_token_file(on_dask.path).tolist() == \
        tokenizer.encode(Path(source).read_text("utf-8"))


def test_encoding_into_shards_writes_the_local_bytes(client, tokenizer, mixed_source, tmp_path):
    kwargs = dict(chunk_bytes=20_000, shard_bytes=60_000)
    local = nbbpe.encode_file(tokenizer, mixed_source, tmp_path / "local", **kwargs)
    on_dask = nbbpe.encode_file(tokenizer, mixed_source, tmp_path / "dask", client=client,
                                **kwargs)
    _same_outputs(local, on_dask)


# --- failures -----------------------------------------------------------------------------------


class FailOnce:
    """A state factory whose states fail at unit `at` on the first attempt only: they create
    `flag` and then raise (`how="raise"`) or kill the worker process (`how="exit"`). A unit
    added before the failure is counted by the failed attempt: the retry must start afresh."""

    def __init__(self, make_state, flag: str, at, how: str = "raise"):
        self.make_state, self.flag, self.at, self.how = make_state, flag, at, how

    def __call__(self):
        return _FailingState(self.make_state(), self)


class _FailingState:
    def __init__(self, state, spec: FailOnce):
        self.state, self.spec = state, spec

    def add(self, unit):
        done = self.state.add(unit)
        if unit == self.spec.at and not os.path.exists(self.spec.flag):
            Path(self.spec.flag).write_text("failed once")
            if self.spec.how == "exit":
                os._exit(1)
            raise RuntimeError("a flaky failure")
        return done

    def finish(self):
        return self.state.finish()


class CountAttempts:
    """A state factory whose states raise `error` at unit `at`, logging each attempt."""

    def __init__(self, make_state, log: str, at, error: BaseException):
        self.make_state, self.log, self.at, self.error = make_state, log, at, error

    def __call__(self):
        return _AttemptState(self.make_state(), self)


class _AttemptState(_FailingState):
    def add(self, unit):
        if unit == self.spec.at:
            with open(self.spec.log, "a") as f:
                f.write("attempt\n")
            raise self.spec.error
        return self.state.add(unit)


class FailOnceFn:
    """`fn(unit)`, failing once at unit `at` (see FailOnce)."""

    def __init__(self, fn, flag: str, at):
        self.fn, self.flag, self.at = fn, flag, at

    def __call__(self, unit):
        if unit == self.at and not os.path.exists(self.flag):
            Path(self.flag).write_text("failed once")
            raise OSError("a flaky read")
        return self.fn(unit)


def _planned(path, chunk_bytes=5_000):
    return plan_units(resolve_source(path), chunk_bytes=chunk_bytes, special_tokens=[EOT])


def _factory(errors="strict"):
    from nbbpe.patterns import GPT2_PATTERN

    return _UnitCounterFactory((GPT2_PATTERN, [EOT], errors, "auto"), errors, 5_000)


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_task_that_fails_once_is_rerun_with_the_same_result(client, tmp_path, how):
    units = _planned(FIXTURES / "corpus.en")
    assert len(units) > 8
    flaky = FailOnce(_factory(), str(tmp_path / "flag"), units[len(units) // 2 + 1], how)
    expected = LocalExecutor(2).accumulate(_factory(), units, merge_counts).to_dict()
    counts = DaskExecutor(client).accumulate(flaky, units, merge_counts)
    assert (tmp_path / "flag").exists()
    assert counts.to_dict() == expected
    if how == "exit":  # the nanny restarted the worker: wait for it before the next test
        client.wait_for_workers(2, timeout=STARTUP_SECONDS)


def test_an_encoding_task_that_fails_once_is_rerun_with_the_same_ids(client, tokenizer, tmp_path):
    units = _planned(FIXTURES / "corpus.en")
    encoder = UnitEncoder(tokenizer, np.dtype(np.uint16), "strict", None, 5_000)
    flaky = FailOnceFn(encoder, str(tmp_path / "flag"), units[3])
    ids = np.concatenate(list(DaskExecutor(client).map(flaky, units)))
    assert (tmp_path / "flag").exists()
    assert ids.tolist() == tokenizer.encode((FIXTURES / "corpus.en").read_text("utf-8"))


def test_the_users_errors_are_not_retried(client, tmp_path):
    units = _planned(FIXTURES / "corpus.en")
    log = tmp_path / "attempts"
    bad = CountAttempts(_factory(), str(log), units[-2], SourceError("a bad line"))
    with pytest.raises(SourceError, match="a bad line"):
        DaskExecutor(client, retries=3).accumulate(bad, units, merge_counts)
    assert log.read_text() == "attempt\n"
    flaky = CountAttempts(_factory(), str(log), units[1], RuntimeError("a system error"))
    with pytest.raises(RuntimeError, match="a system error"):
        DaskExecutor(client, retries=2).accumulate(flaky, units, merge_counts)
    assert log.read_text() == "attempt\n" * 4  # the one above, then 1 + 2 retries


def _bad_text_file(path: Path, bad_offsets: list[int]) -> None:
    data = bytearray((FIXTURES / "corpus.en").read_bytes())
    for offset in bad_offsets:
        data[offset] = 0xFF
    path.write_bytes(bytes(data))


def _both_raise(run_local, run_dask):
    with pytest.raises(Exception) as local:
        run_local()
    with pytest.raises(Exception) as on_dask:
        run_dask()
    assert type(on_dask.value) is type(local.value)
    assert str(on_dask.value) == str(local.value)
    return str(local.value)


@pytest.mark.parametrize("offsets", [[90_000, 120_000], [60_000, 66_000], [131_000, 20_000]])
def test_invalid_utf8_in_a_text_file_names_the_first_bad_place(client, tokenizer, tmp_path,
                                                                offsets):
    corpus = tmp_path / "bad.txt"
    _bad_text_file(corpus, offsets)
    first = min(offsets)
    message = _both_raise(
        lambda: nbbpe.train_bpe(corpus, 300, [EOT], chunk_bytes=5_000, num_workers=2),
        lambda: nbbpe.train_bpe(corpus, 300, [EOT], chunk_bytes=5_000, client=client))
    assert f"bad.txt byte {first}: invalid UTF-8" in message
    assert "errors='replace'" in message
    message = _both_raise(
        lambda: nbbpe.encode_file(tokenizer, corpus, tmp_path / "l.bin", chunk_bytes=5_000),
        lambda: nbbpe.encode_file(tokenizer, corpus, tmp_path / "d.bin", chunk_bytes=5_000,
                                  client=client))
    assert f"bad.txt byte {first}: invalid UTF-8" in message
    assert not (tmp_path / "d.bin").exists() and not (tmp_path / "d.bin.partial").exists()


def test_errors_in_a_jsonl_file_name_the_first_bad_line(client, tokenizer, tmp_path):
    lines = [json.dumps({"text": d}).encode() for d in documents()]
    lines[150] = lines[150][:12] + b"\xc3\x28" + lines[150][12:]  # invalid UTF-8
    lines[40] = b'{"text": "unterminated'  # bad JSON, earlier
    corpus = tmp_path / "docs.jsonl"
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    message = _both_raise(
        lambda: nbbpe.train_bpe(corpus, 300, [EOT], chunk_bytes=3_000, num_workers=2),
        lambda: nbbpe.train_bpe(corpus, 300, [EOT], chunk_bytes=3_000, client=client))
    assert "docs.jsonl line 41: not valid JSON" in message
    lines[40] = json.dumps({"text": "fine"}).encode()
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    message = _both_raise(
        lambda: nbbpe.encode_file(tokenizer, corpus, tmp_path / "l.bin", chunk_bytes=3_000),
        lambda: nbbpe.encode_file(tokenizer, corpus, tmp_path / "d.bin", chunk_bytes=3_000,
                                  client=client))
    assert "docs.jsonl line 151" in message and "invalid UTF-8" in message


def test_an_error_of_the_iterator_comes_after_the_items_before_it(client):
    docs = documents()[:60]
    bad = [*docs[:30], "lone \ud800 surrogate", *docs[30:], 42]
    message = _both_raise(
        lambda: nbbpe.train_bpe_from_iterator(iter(bad), 300, [EOT], chunk_bytes=2_000),
        lambda: nbbpe.train_bpe_from_iterator(iter(bad), 300, [EOT], chunk_bytes=2_000,
                                              client=DaskExecutor(client, group_bytes=6_000)))
    assert "item at index 30 of texts" in message
    with pytest.raises(TypeError, match="item at index 60 of texts is int"):
        nbbpe.train_bpe_from_iterator(iter(docs + [42]), 300, [EOT], chunk_bytes=2_000,
                                      client=DaskExecutor(client, group_bytes=6_000))


def test_a_file_the_workers_cannot_read_is_reported_as_such(client, tmp_path):
    missing = SourceFile(str(tmp_path / "elsewhere.txt"), "text", None, 1_000)
    units = [Unit(missing, 0, 1_000)]
    with pytest.raises(FileNotFoundError) as info:
        DaskExecutor(client).accumulate(_factory(), units, merge_counts)
    message = str(info.value)
    assert "cannot read" in message and "elsewhere.txt" in message
    assert "filesystem all machines share" in message and "fsspec URLs" in message
    # Where the client can read the file, the message says so.
    seen_here = tmp_path / "here.txt"
    seen_here.write_text("text")
    failed = _Failed(0, FileNotFoundError(2, "No such file or directory", str(seen_here)))
    assert "this client can read it" in str(failed.exception())


def test_bad_executor_options_are_refused(client):
    with pytest.raises(ValueError, match="fan_in"):
        DaskExecutor(client, fan_in=1)
    with pytest.raises(TypeError, match="distributed.Client"):
        DaskExecutor(object())
    with pytest.raises(ValueError, match="not both"):
        nbbpe.train_bpe(FIXTURES / "corpus.en", 300, [EOT], client=client, num_workers=2)


# --- the command line ---------------------------------------------------------------------------


def test_the_command_line_runs_on_the_scheduler(cluster, mixed_source, tmp_path, capsys):
    address = cluster.scheduler_address
    args = [str(mixed_source), "--vocab-size", "400", "--quiet", "--chunk-mb", "0.02"]
    assert main(["train", *args, "--out", str(tmp_path / "local")]) == 0
    assert main(["train", *args, "--out", str(tmp_path / "dask"), "--scheduler", address]) == 0
    for name in ("vocab.json", "merges.txt", "nbbpe.json"):
        assert (tmp_path / "dask" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
    encode = ["encode", "--tokenizer", str(tmp_path / "local"), str(mixed_source), "--quiet",
              "--chunk-mb", "0.02", "--shard-bytes", "50000"]
    assert main([*encode, "-o", str(tmp_path / "local.ids")]) == 0
    assert main([*encode, "-o", str(tmp_path / "dask.ids"), "--scheduler", address]) == 0
    names = sorted(os.listdir(tmp_path / "local.ids"))
    assert len(names) > 2 and sorted(os.listdir(tmp_path / "dask.ids")) == names
    for name in names:
        assert (tmp_path / "dask.ids" / name).read_bytes() == \
            (tmp_path / "local.ids" / name).read_bytes()
    assert "scheduler       " + address in capsys.readouterr().out
