"""The scripts in scripts/: training reports, the tokenizer experiments, and fetching data from a
local HTTP server (never the internet)."""

import gzip
import http.server
import importlib.util
import json
import os
import shutil
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from nbbpe import Tokenizer, open_token_file, train_bpe
from nbbpe.cli import sample_corpus_path

ROOT = Path(__file__).parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
EOT = "<|endoftext|>"


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- training scripts -------------------------------------------------------------------------


@pytest.mark.parametrize("name, dataset", [("train_tinystories", "TinyStories"), ("train_owt", "OpenWebText")])
def test_training_scripts_report_and_save_the_tokenizer(tmp_path, capsys, name, dataset):
    script = load_script(name)
    out = tmp_path / "tok"
    assert script.main(["--corpus", "sample", "--vocab-size", "300", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    for line in ("wall time", "peak memory", "longest token"):
        assert line in printed
    tokenizer = Tokenizer.load(out)
    assert tokenizer.n_vocab == 300 and tokenizer.special_tokens == [EOT]
    report = json.loads((out / "train_report.json").read_text(encoding="utf-8"))
    assert report["dataset"] == dataset and report["vocab_size"] == 300
    assert report["peak_pss"] > 0 and report["wall_seconds"] > 0
    longest = max((a + b for a, b in tokenizer.merges), key=len)
    assert report["longest_token_bytes"] == len(longest)


def test_training_script_without_its_dataset_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_script("train_owt").main(["--quiet"]) == 2
    assert "data/owt_train.txt not found: download OpenWebText with scripts/fetch_data.py" in \
        capsys.readouterr().err


# --- tokenizer experiments --------------------------------------------------------------------


def test_tokenizer_experiments_on_small_stand_ins(tmp_path, capsys):
    sample = Path(sample_corpus_path()).read_text(encoding="utf-8")
    files = {"ts_train": sample[:200_000], "ts_valid": sample[200_000:260_000],
             "owt_train": (FIXTURES / "web_sample.txt").read_text(encoding="utf-8"),
             "owt_valid": (FIXTURES / "multi_sample.txt").read_text(encoding="utf-8")[:30_000]}
    for name, text in files.items():
        (tmp_path / f"{name}.txt").write_text(text, encoding="utf-8")
    for name, corpus in [("ts", "ts_train"), ("owt", "owt_train")]:
        vocab, merges = train_bpe(tmp_path / f"{corpus}.txt", 320, [EOT], num_workers=1)
        Tokenizer(vocab, merges, [EOT]).save(tmp_path / f"{name}_tok")
    out = tmp_path / "tokens"
    argv = ["--tinystories-tokenizer", str(tmp_path / "ts_tok"), "--owt-tokenizer", str(tmp_path / "owt_tok"),
            "--tinystories-train", str(tmp_path / "ts_train.txt"),
            "--tinystories-valid", str(tmp_path / "ts_valid.txt"),
            "--owt-train", str(tmp_path / "owt_train.txt"), "--owt-valid", str(tmp_path / "owt_valid.txt"),
            "--docs", "4", "--throughput-mb", "0.05", "--workers", "2", "--out", str(out), "--quiet"]
    assert load_script("tokenizer_experiments").main(argv) == 0
    printed = capsys.readouterr().out
    assert "hours" in printed and "825 GB" in printed
    report = json.loads((out / "experiments.json").read_text())

    ts_tok, owt_tok = Tokenizer.load(tmp_path / "ts_tok"), Tokenizer.load(tmp_path / "owt_tok")
    docs = load_script("tokenizer_experiments").sample_documents(str(tmp_path / "owt_train.txt"), 4, 0)
    assert len(docs) == 4 and all(EOT not in text and text == text.strip() for _, text in docs)
    assert report["docs"]["owt"]["offsets"] == [offset for offset, _ in docs]
    cross = report["compression"]["tinystories tokenizer on owt"]
    assert cross["bytes"] == sum(len(t.encode()) for _, t in docs)
    assert cross["tokens"] == sum(len(ts_tok.encode(t)) for _, t in docs)
    assert set(report["compression"]) == {f"{a} tokenizer on {b}" for a in ("tinystories", "owt")
                                          for b in ("tinystories", "owt")}
    assert set(report["throughput"]) == {"tinystories", "owt"}
    for key, tokenizer, source in [("tinystories_train", ts_tok, "ts_train"),
                                   ("tinystories_valid", ts_tok, "ts_valid"),
                                   ("owt_train", owt_tok, "owt_train"), ("owt_valid", owt_tok, "owt_valid")]:
        ids = open_token_file(out / f"{key}.bin")
        assert ids.dtype == np.uint16 and report["encoded"][key]["tokens"] == len(ids)
        assert ids.tolist() == tokenizer.encode(files[source])


def test_sampled_documents_are_whole_distinct_and_seeded(tmp_path):
    docs = [f"document number {i} " * (1 + i % 7) for i in range(40)]
    path = tmp_path / "docs.txt"
    path.write_text("".join(f"{d}\n{EOT}\n" for d in docs), encoding="utf-8")
    sample = load_script("tokenizer_experiments").sample_documents
    picked = sample(str(path), 10, seed=3)
    assert len(picked) == 10 and len({o for o, _ in picked}) == 10
    assert all(text in {d.strip() for d in docs} for _, text in picked)
    assert picked == sample(str(path), 10, seed=3) != sample(str(path), 10, seed=4)
    assert len(sample(str(path), 100, seed=0)) == 40  # no more than there are


# --- fetching data ----------------------------------------------------------------------------


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass

    def do_GET(self):
        if self.path.endswith("cut.txt"):  # announces more than it sends, then hangs up
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"only a little")
            self.close_connection = True
            return
        super().do_GET()


@pytest.fixture
def server(tmp_path):
    """A local HTTP server whose files sit at the datasets' URL paths."""
    root = tmp_path / "www"
    texts = {}
    fetch = load_script("fetch_data")
    for urls in fetch.DATASETS.values():
        for url in urls:
            path = root / url.split("://", 1)[1].split("/", 1)[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            text = f"stories from {path.name}\n{EOT}\n" * 100
            if path.name.endswith(".gz"):
                path.write_bytes(gzip.compress(text.encode()))
                texts[path.name[:-3]] = text
            else:
                path.write_text(text, encoding="utf-8")
                texts[path.name] = text
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Handler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", texts, fetch
    httpd.shutdown()
    httpd.server_close()


def test_fetch_data_downloads_and_unpacks_every_dataset_from_a_mirror(server, tmp_path, capsys):
    base, texts, fetch = server
    dest = tmp_path / "data"
    assert fetch.main(["--dest", str(dest), "--mirror", base, "--quiet"]) == 0
    assert sorted(os.listdir(dest)) == sorted(texts) == [
        "TinyStoriesV2-GPT4-train.txt", "TinyStoriesV2-GPT4-valid.txt", "owt_train.txt", "owt_valid.txt"]
    for name, text in texts.items():
        assert (dest / name).read_text(encoding="utf-8") == text
    capsys.readouterr()
    assert fetch.main(["owt", "--dest", str(dest), "--mirror", base, "--quiet"]) == 0
    assert capsys.readouterr().out.count("already there") == 2


def test_fetch_data_failures_name_the_url_and_leave_no_file(server, tmp_path, capsys, monkeypatch):
    base, _, fetch = server
    dest = tmp_path / "data"
    monkeypatch.setitem(fetch.DATASETS, "tinystories", ["https://example.org/missing/file.txt"])
    assert fetch.main(["tinystories", "--dest", str(dest), "--mirror", base, "--quiet"]) == 2
    assert f"{base}/missing/file.txt: HTTP 404" in capsys.readouterr().err
    monkeypatch.setitem(fetch.DATASETS, "tinystories", ["https://example.org/cut.txt"])
    assert fetch.main(["tinystories", "--dest", str(dest), "--mirror", base, "--quiet"]) == 2
    assert f"{base}/cut.txt: " in capsys.readouterr().err
    assert os.listdir(dest) == []
    with pytest.raises(SystemExit):
        fetch.main(["wikipedia", "--dest", str(dest)])
    assert "unknown dataset 'wikipedia'" in capsys.readouterr().err


# --- benchmarks (tiny runs: they must keep working with the package's API) --------------------


def test_bench_pretok_runs_every_family_and_checks_itself(tmp_path, capsys):
    text = (FIXTURES / "web_sample.txt").read_text(encoding="utf-8")[:20_000]
    corpus = tmp_path / "small.txt"
    corpus.write_text(text + f"\n{EOT}\n" + (FIXTURES / "multi_sample.txt").read_text(encoding="utf-8")[:10_000],
                      encoding="utf-8")
    out = tmp_path / "pretok.json"
    load_script("bench_pretok").main([str(corpus), "--repeat", "1", "--no-compile-time", "--json", str(out)])
    printed = capsys.readouterr().out
    assert printed.count("equal to the 1-thread count") == 3 and "DIFFER" not in printed and "NOT EQUAL" not in printed
    numbers = json.loads(out.read_text())["files"][str(corpus)]
    assert set(numbers) == {"gpt2", "cl100k", "o200k"}
    for methods in numbers.values():
        assert len(methods) == 5
        assert all(row["mb_s"] > 0 for by_threads in methods.values() for row in by_threads.values())


def test_bench_train_measures_nbbpe_per_pattern(tmp_path, capsys):
    corpus = tmp_path / "small.txt"
    corpus.write_text((FIXTURES / "web_sample.txt").read_text(encoding="utf-8")[:30_000], encoding="utf-8")
    out = tmp_path / "train.json"
    bench_train = load_script("bench_train")
    assert bench_train.main([str(corpus), "--vocab-size", "300", "--tools", "nbbpe", "--pattern", "gpt2", "cl100k",
                             "--repeat", "1", "--json", str(out)]) == 0
    assert "nbbpe training time, cl100k / gpt2: " in capsys.readouterr().out
    result = json.loads(out.read_text())[str(corpus)]
    rows = {r["pattern"]: r for r in result["rows"]}
    assert set(rows) == {"gpt2", "cl100k"} and all("error" not in r for r in rows.values())
    assert all(r["vocab"] == 300 and r["process_s"] >= r["train_s"] > 0 and r["numba_s"] > 0 for r in rows.values())
    ratio, per_round = result["pattern_ratios"]["cl100k"]
    assert ratio == per_round[0] == rows["cl100k"]["train_s"] / rows["gpt2"]["train_s"]


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k"])
def test_bench_train_gives_hugging_face_the_same_pre_tokens(pattern):
    import regex

    bench_train = load_script("bench_train")
    text = (FIXTURES / "multi_sample.txt").read_text(encoding="utf-8")[:20_000] + " 1234567 it's IT'S\n\n  x"
    spans = [offsets for _, offsets in bench_train.hf_pre_tokenizer(pattern).pre_tokenize_str(text)]
    assert spans == [m.span() for m in regex.finditer(bench_train.pattern_string(pattern), text)]


def test_bench_encode_file_compares_token_files_in_chunks(tmp_path, gpt2, monkeypatch):
    """nbbpe's token file (separators as ids) against a gigatoken-like output (ids of each non-empty
    document end to end, and document offsets): equal, a changed id, a moved boundary."""
    from nbbpe import encode_file

    bench = load_script("bench_encode_file")
    monkeypatch.setattr(bench, "CHUNK", 1000)  # several chunks
    docs = ["Hello world.\n", "", "\nSecond document, it's here: 12345.\n", "\n" + "more text " * 300, "\nend"]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(EOT.join(docs), encoding="utf-8")
    ours = tmp_path / "nbbpe.bin"
    encode_file(gpt2, str(corpus), str(ours), num_workers=1, progress=False)

    def write_theirs(pieces):
        ids = [gpt2.encode(d) for d in pieces if d]
        np.array([i for doc in ids for i in doc], dtype=np.uint32).tofile(tmp_path / "giga.bin")
        np.cumsum([0] + [len(doc) for doc in ids], dtype=np.int64).tofile(tmp_path / "giga.bin.offsets")
        return str(tmp_path / "giga.bin")

    assert bench.compare_ids(str(ours), write_theirs(docs), 50256) == "equal"
    assert bench.compare_ids(str(ours), write_theirs(docs[:-1] + ["\nEnd"]), 50256).startswith("DIFFER: nbbpe's id")
    moved = [docs[0] + docs[2], docs[3], docs[4]]  # the same ids, one boundary fewer
    assert bench.compare_ids(str(ours), write_theirs(moved), 50256).startswith("DIFFER at the document boundaries")


def test_bench_encode_file_against_gigatoken(tmp_path, capsys):
    pytest.importorskip("gigatoken")
    corpus = tmp_path / "small.txt"
    corpus.write_text((FIXTURES / "web_sample.txt").read_text(encoding="utf-8")[:50_000], encoding="utf-8")
    out = tmp_path / "result.json"
    assert load_script("bench_encode_file").main([str(corpus), "--workers", "2", "--repeat", "1", "--out",
                                                  str(tmp_path / "out"), "--json", str(out)]) == 0
    assert "nbbpe / gigatoken, 2 workers: " in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["ids"] == {"2": "equal"} and {r["tool"] for r in result["rows"]} == {"nbbpe", "gigatoken"}
    assert all(r["mb_s"] > 0 and r["peak_pss"] > 0 for r in result["rows"])
    assert sorted(os.listdir(tmp_path / "out")) == []  # the token files are removed without --keep


def test_bench_encode_reports_each_batchs_speed(tmp_path, capsys):
    """A corpus read in several batches: each tool's MB/s per batch, in the JSON and printed
    (where in a large corpus a tool is slow); one batch: no such line."""
    bench = load_script("bench_encode")
    text = Path(sample_corpus_path()).read_text(encoding="utf-8")[:120_000]
    corpus = tmp_path / "small.txt"
    corpus.write_text(text, encoding="utf-8")
    expected = len(list(bench.batches(str(corpus), None, 30_000)))
    assert expected >= 3
    out = tmp_path / "result.json"
    assert bench.main([str(corpus), "--tools", "nbbpe", "--threads", "1", "--repeat", "1",
                       "--batch-mb", "0.03", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "MB/s by batch of ~" in printed
    rows = json.loads(out.read_text())["rows"]
    assert {r["tool"] for r in rows} == {"tiktoken", "nbbpe"}
    lines = printed.splitlines()
    by_batch = lines[next(k for k, l in enumerate(lines) if "MB/s by batch" in l) + 1:][:len(rows)]
    for row, line in zip(rows, by_batch):
        assert len(row["batch_mb_s"]) == expected and all(x > 0 for x in row["batch_mb_s"])
        assert line.split() == [row["tool"], *(f"{x:.0f}" for x in row["batch_mb_s"])]
    assert bench.main([str(corpus), "--tools", "nbbpe", "--threads", "1", "--repeat", "1"]) == 0
    assert "MB/s by batch" not in capsys.readouterr().out


def test_encode_breakdown_splits_a_cold_pass(tmp_path, capsys):
    corpus = tmp_path / "small.txt"
    corpus.write_text((FIXTURES / "multi_sample.txt").read_text(encoding="utf-8")[:20_000]
                      + f"\n{EOT}\n" + (FIXTURES / "web_sample.txt").read_text(encoding="utf-8")[:20_000],
                      encoding="utf-8")
    out = tmp_path / "breakdown.json"
    assert load_script("encode_breakdown").main([str(corpus), "--pattern", "gpt2", "o200k",
                                                 "--repeat", "2", "--json", str(out)]) == 0
    assert capsys.readouterr().out.count("small.txt") == 2
    for row in json.loads(out.read_text())[str(corpus)].values():
        assert len(row["rounds"]) == 2
        # New text: the cold pass merges, the warm one only looks up and gives the same ids
        # (what makes warm - scan the lookups). Times are not compared: on 40 KB they differ by
        # fractions of a millisecond, which a noisy machine reorders.
        assert row["learned"] > 100 and row["pretokens"] > 5_000
        for r in row["rounds"]:
            assert r["learned"] == row["learned"] and r["learned_warm"] == 0 and r["same_ids"]
            assert min(r["cold_s"], r["warm_s"], r["scan_s"], r["merge_alone_s"]) > 0
            # The merge loop alone merges (nearly) the pre-tokens the pass learned, to its ids.
            assert 0.9 * r["learned"] <= r["merged_alone"] <= r["learned"] and r["same_ids_alone"]
            by_length = r["merge_alone_by_length"].values()
            assert sum(v["pretokens"] for v in by_length) == r["merged_alone"]
            assert all((v["seconds"] > 0) == (v["pretokens"] > 0) for v in by_length)
            # Two threads making the warm call at once each give its ids, and both used CPU.
            assert r["same_ids_two_at_once"]
            assert min(r["cpu_alone_s"], r["cpu_two_at_once_s"]) > 0


def test_batch_threads_times_a_batch_per_thread_its_halves_bound_ceiling_halves_in_turn_and_idle_memory(capsys):
    # The shipped 1 MB sample: enough text for a batch to use both threads. One fresh process
    # per measurement; the bound's and the ceiling's children check that their halves' ids,
    # joined, are one call per document's (they fail otherwise, which `spawn` raises).
    script = load_script("batch_threads")
    corpus = str(sample_corpus_path())
    lines = []
    results = script.measure([corpus], ["timeline", "bound", "ceiling", "halves", "idle"], runs=1,
                             sleep=0.01, log=lines.append, split=0.4)
    timeline = [r for r in results if r["what"] == "timeline"]
    assert len(timeline) == 1
    threads = timeline[0]["threads"]
    assert set(threads) == {"calling", "pool"}  # both threads took groups
    assert sum(t["groups"] for t in threads.values()) >= 2
    for t in threads.values():
        assert 0 < t["first_ms"] < t["done_ms"] <= timeline[0]["ms"]
        assert t["in_groups_ms"] > 0 and t["outside_groups_ms"] >= 0
    assert set(timeline[0]["vmstat"]) == {"thp_fault_alloc", "compact_stall"}
    bound = [r for r in results if r["what"] == "bound"]
    assert len(bound) == 1 and len(bound[0]["halves_ms"]) == 2
    size = sum(len(d) for d in script.documents(corpus))
    assert sum(bound[0]["halves_bytes"]) == size
    assert abs(bound[0]["halves_bytes"][0] - bound[0]["halves_bytes"][1]) < size // 10
    assert bound[0]["ms"] >= max(bound[0]["halves_ms"])
    assert len(bound[0]["halves_faults"]) == 2 and min(bound[0]["halves_faults"]) >= 0
    # The ceiling: two parts (the first 0.4 of the characters) at once, their ids cast into one
    # fresh result, whose pages the two threads fault in (their output buffers were written)
    ceiling = [r for r in results if r["what"] == "ceiling"]
    assert len(ceiling) == 1
    c = ceiling[0]
    assert c["split"] == 0.4 and sum(c["halves_bytes"]) == size
    assert 0.3 * size < c["halves_bytes"][0] < 0.5 * size
    assert c["ms"] >= max(c["halves_ms"]) and c["balanced_ms"] == pytest.approx(sum(c["halves_ms"]) / 2)
    assert all(0 < k <= h for k, h in zip(c["kernel_ms"], c["halves_ms"]))
    assert c["ids"] > 100_000 and sum(c["halves_faults"]) >= 2 * c["ids"] // 4096 - 2
    assert any(line.startswith("    one call per document over it, by round:") for line in lines)
    # The halves in turn, the second on the first one's CPU and on the other: each timed alone
    halves = {tuple(r["cpus"]): r for r in results if r["what"] == "halves"}
    assert set(halves) == {(0, 0), (0, 1)}
    for r in halves.values():
        assert len(r["halves_ms"]) == 2 and min(r["halves_ms"]) > 0
        assert r["ms"] == pytest.approx(sum(r["halves_ms"]))
        assert len(r["halves_faults"]) == 2 and min(r["halves_faults"]) >= 0
    assert sum("the first half" in line for line in lines) == 2
    by_sleep = {r["sleep"]: r["ms"] for r in results if r["what"] == "doc" and r["tool"] == "nbbpe"
                and "sleep" in r}
    assert set(by_sleep) == {0.0, 0.01} and min(by_sleep.values()) > 0


def test_batch_threads_steady_times_batches_one_after_another():
    # One fresh process encoding the sample as 3 batches in a row: the first timed apart, the
    # others' median, and the page faults of each (fewer once a result takes the memory the
    # one before let go of).
    script = load_script("batch_threads")
    lines = []
    results = script.measure([str(sample_corpus_path())], ["steady"], runs=1, sleep=0.0,
                             log=lines.append, batches=3)
    assert len(results) == 1
    r = results[0]
    assert r["what"] == "steady" and r["batches"] == 3
    assert r["first_faults"] > r["steady_faults"] >= 0 and r["one_thread_ms"] > 0
    assert r["ms"] == r["first_ms"] > 0 and r["steady_ms"] > 0
    assert any("the others, median" in line and "page faults" in line for line in lines)
    assert any("one call per document on one thread, warm" in line for line in lines)


def test_batch_threads_faults_counts_a_pass_page_faults():
    # One fresh process per way of encoding the sample, the same ids each way. A 2-thread
    # batch's result is a block of its own, fresh in a fresh process: each page its ids fill
    # faults in during the pass.
    script = load_script("batch_threads")
    lines = []
    results = script.measure([str(sample_corpus_path())], ["faults"], runs=1, sleep=0.0,
                             log=lines.append)
    by_kind = {r["kind"]: r for r in results}
    assert set(by_kind) == set(script.FAULT_KINDS) and len(results) == 3
    assert len({r["ids"] for r in results}) == 1 and results[0]["ids"] > 100_000
    assert all(r["ms"] > 0 and r["faults"] >= 0 for r in results)
    two = by_kind["batch2"]
    assert two["faults"] >= two["ids"] * two["itemsize"] // 4096
    assert sum("minor page faults" in line for line in lines) == 3


@pytest.mark.parametrize("what", ["bound", "ceiling"])
def test_batch_threads_bound_and_ceiling_fail_on_halves_cut_where_the_ids_change(monkeypatch, what):
    # Their own check: halves cut inside a word give other ids than one call per document.
    script = load_script("batch_threads")
    import nbbpe.corpus

    def inside_a_word(text, at, *args, **kwargs):
        while not (text[at - 1].isalpha() and text[at].isalpha()):
            at += 1
        return at

    monkeypatch.setattr(nbbpe.corpus, "safe_text_cut", inside_a_word)
    cpus = os.sched_getaffinity(0)
    try:
        with pytest.raises(AssertionError, match="differ"):
            getattr(script, what)(str(sample_corpus_path()))
    finally:
        os.sched_setaffinity(0, cpus)


def in_process_corpus(tmp_path):
    """A small corpus of web text and multilingual text, for bench_in_process.py."""
    corpus = tmp_path / "small.txt"
    corpus.write_text((FIXTURES / "web_sample.txt").read_text(encoding="utf-8")[:6000]
                      + f"\n{EOT}\n" + (FIXTURES / "multi_sample.txt").read_text(encoding="utf-8")[:6000],
                      encoding="utf-8")
    return corpus


def test_bench_in_process_alternates_fresh_tools_and_checks_their_ids(tmp_path, capsys,
                                                                    monkeypatch):
    corpus = in_process_corpus(tmp_path)
    script = load_script("bench_in_process")
    out = tmp_path / "in_process.json"
    assert script.main([str(corpus), "--tools", "nbbpe,tiktoken", "--rounds", "2",
                        "--json", str(out)]) == 0
    assert "small.txt" in capsys.readouterr().out
    [result] = json.loads(out.read_text())
    assert result["documents"] > 1 and len(result["rounds"]) == 2
    rows = result["tools"]
    assert rows["nbbpe"]["exact"] and rows["tiktoken"]["exact"]
    assert rows["tiktoken"]["nbbpe_ratio_cold"]["median"] > 0
    assert all(run[name]["cold_s"] > 0 for run in result["rounds"] for name in rows)
    # A tool whose ids differ from the first tool's is reported so.
    build = script.bench_peers.build

    def off_by_one(name, encoding, threads):
        encoder = build(name, encoding, threads)
        if name == "tiktoken":
            one = encoder.one
            encoder.one = lambda doc: [*one(doc), 0]
        return encoder

    monkeypatch.setattr(script.bench_peers, "build", off_by_one)
    assert script.main([str(corpus), "--tools", "nbbpe,tiktoken", "--rounds", "1",
                        "--json", str(out)]) == 0
    assert not json.loads(out.read_text())[0]["tools"]["tiktoken"]["exact"]


def test_bench_in_process_batch_api_times_one_batch_call_and_checks_each_documents_ids(
        tmp_path, monkeypatch):
    corpus = in_process_corpus(tmp_path)
    script = load_script("bench_in_process")
    build = script.bench_peers.build
    calls = []

    def counted(name, encoding, threads):
        encoder = build(name, encoding, threads)
        assert threads == 1
        one, batch = encoder.one, encoder.batch
        encoder.one = lambda doc: calls.append((name, "one")) or one(doc)
        encoder.batch = lambda docs: calls.append((name, len(docs))) or batch(docs)
        return encoder

    monkeypatch.setattr(script.bench_peers, "build", counted)
    out = tmp_path / "batch.json"
    assert script.main([str(corpus), "--tools", "nbbpe,tiktoken", "--rounds", "1", "--api", "batch",
                        "--json", str(out)]) == 0
    [result] = json.loads(out.read_text())
    documents = result["documents"]
    assert result["api"] == "batch" and documents > 1
    assert result["tools"]["nbbpe"]["exact"] and result["tools"]["tiktoken"]["exact"]
    # Each tool: a call per warm-up text and a warm-up batch, then the timed passes, each one
    # batch call on all the documents (nbbpe gives flat ids and offsets, tiktoken lists).
    for name in ("nbbpe", "tiktoken"):
        timed = [c for c in calls if c[0] == name][len(script.bench_peers.WARM_UP) + 1:]
        assert timed == [(name, documents), (name, documents)]
    # Documents' ids are compared one by one: a batch that moves an id across a document
    # boundary differs.
    def shifted(name, encoding, threads):
        encoder = build(name, encoding, threads)
        if name == "tiktoken":
            batch = encoder.batch
            encoder.batch = lambda docs: (lambda r: [r[0][:-1], [r[0][-1], *r[1]], *r[2:]])(batch(docs))
        return encoder

    monkeypatch.setattr(script.bench_peers, "build", shifted)
    assert script.main([str(corpus), "--tools", "nbbpe,tiktoken", "--rounds", "1", "--api", "batch",
                        "--json", str(out)]) == 0
    assert not json.loads(out.read_text())[0]["tools"]["tiktoken"]["exact"]


def test_bench_in_process_whole_api_times_one_call_on_a_fresh_joined_str(tmp_path, monkeypatch):
    corpus = in_process_corpus(tmp_path)
    script = load_script("bench_in_process")
    build = script.bench_peers.build
    texts = []

    def counted(name, encoding, threads):
        encoder = build(name, encoding, threads)
        one = encoder.one
        encoder.one = lambda doc: texts.append((name, doc)) or one(doc)
        return encoder

    monkeypatch.setattr(script.bench_peers, "build", counted)
    out = tmp_path / "whole.json"
    assert script.main([str(corpus), "--tools", "nbbpe,tiktoken", "--rounds", "1", "--api", "whole",
                        "--json", str(out)]) == 0
    [result] = json.loads(out.read_text())
    joined = "\n".join(doc.decode() for doc in script.documents(str(corpus)))
    assert result["api"] == "whole" and result["documents"] > 2
    assert result["megabytes"] == len(joined.encode()) / 1e6
    assert result["tools"]["nbbpe"]["exact"] and result["tools"]["tiktoken"]["exact"]
    for name in ("nbbpe", "tiktoken"):  # after the warm-up: two calls, each on a str of its own
        cold, warm = [doc for who, doc in texts if who == name][len(script.bench_peers.WARM_UP):]
        assert cold == warm == joined and cold is not warm


def test_bench_short_texts_times_each_call_and_checks_the_ids(tmp_path, capsys):
    out = tmp_path / "short.json"
    assert load_script("bench_short_texts").main([
        "--tools", "nbbpe", "--repeat", "2", "--calls", "50",
        "--story-file", str(FIXTURES / "corpus.en"), "--json", str(out)]) == 0
    assert "nbbpe" in capsys.readouterr().out
    result = json.loads(out.read_text())
    rows = {row["tool"]: row for row in result["rows"]}
    assert set(rows) == {"nbbpe", "tiktoken"} and all(row["exact"] for row in rows.values())
    assert len(result["runs"]["nbbpe"]) == 2
    labels = ["3 B", "9 B", "843 B"]
    assert all(0 < rows["nbbpe"][label]["median"] < 1e4 for label in labels)
    assert result["runs"]["nbbpe"][0]["ids"]["9 B"] == [15496, 345]  # "Hello you"


# --- profile_encode: perf samples -> compiled functions -----------------------------------------


def test_profile_encode_names_numba_code_and_attributes_samples_to_it():
    profile = load_script("profile_encode")
    assert profile.readable("_ZN5nbbpe6encode13_merge_roundsB3v55B48c8tJTIeFIjxB2IKSgE5ArrayIiLi1E") \
        == "nbbpe.encode._merge_rounds"
    assert profile.readable("_ZN7cpython5nbbpe6encode6kernelB2v1E") == "nbbpe.encode.kernel (Python wrapper)"
    assert profile.readable("memcpy") == "memcpy"
    if shutil.which("nm") is None:
        pytest.skip("needs nm (binutils)")
    from numba import njit

    @njit  # compiled here, not loaded from a cache: its object file, and so its symbols, are kept
    def probe_function(x):
        return x * 3 + 1

    assert probe_function(2) == 7
    (compiled,) = probe_function.overloads.values()
    address = compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)
    regions = sorted(profile.regions_of(probe_function))
    found = profile.find_region(regions, address)
    assert found is not None and found.name.endswith("probe_function")
    # each function of the object where it was loaded: the wrapper too, at its own offset
    wrapper = compiled.library.get_pointer_to_function(compiled.fndesc.llvm_cpython_wrapper_name)
    assert profile.find_region(regions, wrapper).name.endswith("probe_function (Python wrapper)")
    assert profile.find_region(regions, wrapper).start == wrapper
    assert profile.find_region(regions, regions[0].start - 1) is None
    last = regions[-1]
    assert profile.find_region(regions, last.start + last.size - 1) == last
    assert profile.find_region(regions, last.start + last.size) is None
    samples = [(address, "?"), (address + 1, "?"), (1, "memcpy (libc.so.6)")]
    by_function, by_address = profile.attribute(samples, regions)
    assert by_function == {found.name: 2, "memcpy (libc.so.6)": 1}
    assert by_address == {address: 1, address + 1: 1}


def test_profile_encode_says_which_tools_it_lacks(monkeypatch, capsys):
    profile = load_script("profile_encode")
    monkeypatch.setattr(profile.shutil, "which", lambda tool: None if tool == "perf" else "/bin/" + tool)
    assert profile.main(["--seconds", "1"]) == 2
    assert "needs perf on PATH" in capsys.readouterr().err


def test_encode_variants_still_change_the_loop_they_were_measured_on(monkeypatch, capsys):
    variants = load_script("encode_variants")
    baseline = variants.patched_sources(variants.VARIANTS["baseline"])
    for name, variant in variants.VARIANTS.items():
        changed = variants.patched_sources(variant)  # raises if a replacement no longer applies
        assert set(changed) == set(variants.FUNCTIONS)
        differs = {f for f in changed if changed[f] != baseline[f]}
        assert differs == set(variant["replace"]), name
    stale = {"about": "a line the loop no longer has",
             "replace": {"encode_documents": [("no such line\n", "")]}}
    monkeypatch.setitem(variants.VARIANTS, "stale", stale)
    assert variants.main(["--variants", "stale"]) == 2
    assert "variant stale: encode_documents no longer holds" in capsys.readouterr().err


def test_machine_scaling_times_each_workload_on_one_and_two_threads(tmp_path, capsys):
    # Small work (scale 0.01): each workload's row has its two times and the speedup they
    # give, printed and in the JSON.
    scaling = load_script("machine_scaling")
    out = tmp_path / "scaling.json"
    assert scaling.main(["--repeat", "1", "--scale", "0.01", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [row["workload"] for row in rows] == [
        "dependent chain", "arithmetic over 32 KB", "integer work, 64 lanes", "random reads in 1 MB",
        "random reads in 8 MB", "random reads in 2 MB", "random reads in 16 MB, 32 at a time",
        "streaming writes, 64 MB"]
    for row in rows:
        assert row["one_thread_s"] > 0 and row["two_threads_s"] > 0
        assert row["speedup"] == pytest.approx(2 * row["one_thread_s"] / row["two_threads_s"])
    printed = capsys.readouterr().out
    assert printed.count("2 threads (the same work each)") == 8
    x = 1  # the dependent chain's steps, in Python: the compiled loop computes them all
    for _ in range(1000):
        x = (x * 6364136223846793005 + (x >> 29)) % 2**64
    assert int(scaling.dependent_chain(1000)) == x
    lanes = [0] * 64  # the integer lanes and the batched reads, in Python too
    for i in range(100):
        lanes = [(lane ^ i) + j for j, lane in enumerate(lanes)]
    assert int(scaling.integer_lanes(100)) == sum(lanes) % 2**64
    table = np.arange(1 << 10, dtype=np.int64) * 7
    x, total = 5, 0
    for _ in range(96):
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        total += int(table[(x >> 20) & 1023])
    assert scaling.batched_reads(table, 100, 5, np.empty(32, dtype=np.int64)) == total


# --- the soak test ------------------------------------------------------------------------------


def test_soak_batches_passes_nbbpe_and_catches_one_wrong_id(capsys):
    # A short soak on the shipped sample passes; the same soak against a tokenizer whose batches
    # have one id off reports it (the script's check is what makes a long soak worth running).
    script = load_script("soak_batches")
    assert script.main([str(sample_corpus_path()), "--seconds", "1.5", "--seed", "3"]) == 0
    assert "every text tiktoken's ids" in capsys.readouterr().out
    tok, reference = script.build("gpt2")
    corpus = Path(sample_corpus_path()).read_text(encoding="utf-8")
    real = tok.encode_batch_to_numpy

    def one_off(batch, *, num_threads=None):
        ids, offsets = real(batch, num_threads=num_threads)
        ids = ids.copy()
        if len(ids):
            ids[len(ids) // 2] ^= 1
        return ids, offsets

    tok.encode_batch_to_numpy = one_off
    batches, difference = script.soak(tok, reference, [corpus], seconds=30, seed=3)
    assert difference is not None and "threads" in difference and batches <= 2
