"""Encoding throughput of nbbpe and the fastest exact peers, side by side in one run, same ids.

    python scripts/bench_encode.py [CORPUS ...] [--pattern gpt2|cl100k|o200k] [--tools ...]
        [--threads 1 2] [--repeat 3] [--max-bytes 200M] [--json out.json]

The figures (the three shared corpora by default: web_5M.txt, multi_1M.txt, tinystories_real.txt):

    python scripts/bench_encode.py --tools nbbpe,nbbpe_list,nbbpe_regex,tiktoken,gigatoken,fastokens,hf,findall \
        --json out/bench_encode_gpt2.json
    python scripts/bench_encode.py --pattern cl100k \
        --tools nbbpe,tiktoken,gigatoken,fastokens,bpe_openai,quicktok,findall --json out/bench_encode_cl100k.json
    python scripts/bench_encode.py --pattern o200k \
        --tools nbbpe,tiktoken,gigatoken,fastokens,bpe_openai,quicktok,findall --json out/bench_encode_o200k.json
    python ../shared/tools/make_scale_corpus.py /tmp/scale_1G.txt 10 ../shared/corpora/web_100M.txt
    python scripts/bench_encode.py /tmp/scale_1G.txt --max-bytes 200M --repeat 2

What is measured (the tools and their exact calls are in scripts/bench_peers.py):

- the work: the corpus's documents (the text between `<|endoftext|>` lines; the separators are
  not encoded), as ordinary text, in file order; MB/s = UTF-8 bytes of the documents / seconds
  spent in the tools' encode calls. Documents reach the tools in batches of about `--batch-mb`
  (the whole corpus when it is smaller); checking the ids between batches is not timed;
- 1 thread: each document in turn with the tool's one-text call, the process pinned to one CPU
  (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false, NUMBA_NUM_THREADS=1);
- N threads: each batch through the tool's own batch API on N threads, pinned to N CPUs (nbbpe:
  `encode_batch_to_numpy`, or `encode_batch` for nbbpe_list);
- every (tool, threads) measurement runs in its own fresh process: the tool is built, warmed up
  on a tiny unrelated string and then encodes the corpus with cold caches (nbbpe loads, or
  compiles, its Numba kernels partly when built and partly in the warm-up call: both are timed
  apart from the encoding). Tools alternate (rotated each repeat), and
  `--repeat` rounds give the median and range of MB/s; the peak RSS of each process is reported;
- also per run: MB per CPU-second of the process in the encode calls (all its threads; with 1
  thread, the speed it would have with the CPU to itself, which other load disturbs less),
  CPU/wall (CPUs busy on average: below 1 with 1 thread means the CPU was shared), seconds to
  import and build the tool, seconds of the warm-up call, and the MB/s of each batch (printed,
  as medians over the rounds, when the corpus takes more than one: where in a large corpus a
  tool slows down);
- ids: the SHA-1 of each run's concatenated ids must equal tiktoken's; a tool whose ids differ
  is reported as NOT EXACT, with the first differing document, and is left out of the ratios.
  Ratios: to the fastest exact peer (tiktoken, gigatoken, fastokens, hf, bpe_openai, quicktok)
  and to tiktoken, by median MB/s.

The machine may be shared: read the ratios within one run, with their ranges.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # bench_peers beside this file, however this module was loaded
    sys.path.insert(0, HERE)

import bench_peers  # noqa: E402
import notebook_support  # noqa: E402
from bench_peers import ALL_TOOLS, PEERS, TOOL_MODULES, TOOLS, YARDSTICK, tool_available  # noqa: E402, F401

ROOT = os.path.dirname(HERE)
SEPARATOR = b"<|endoftext|>"
DEFAULT_CORPORA = ("web_5M.txt", "multi_1M.txt", "tinystories_real.txt")
DEFAULT_TOOLS = ("nbbpe", "nbbpe_list", "tiktoken", "gigatoken", "fastokens", "bpe_openai", "quicktok")
REFERENCE = "tiktoken"
BLOCK_BYTES = 1 << 24


# --- the corpus -------------------------------------------------------------------------------


def documents(path: str, max_bytes: int | None = None):
    """The documents of the file, as bytes: the text between `<|endoftext|>` lines (a document
    keeps its final line break; the separator's own line breaks are dropped); empty ones are
    skipped. With `max_bytes`, only the documents that end within the first `max_bytes` bytes
    of the file (at least the first). Read block by block, so memory stays bounded."""
    offset = 0  # where `carry` starts in the file
    carry = b""
    some = False
    with open(path, "rb") as f:
        while True:
            block = f.read(BLOCK_BYTES)
            parts = (carry + block).split(SEPARATOR)
            carry = parts.pop() if block else b""
            for part in parts:
                end = offset + len(part)
                if max_bytes is not None and end > max_bytes and some:
                    return
                doc = part[1:] if offset and part.startswith(b"\n") else part
                if doc:
                    some = True
                    yield doc
                offset = end + len(SEPARATOR)
            if not block:
                return


def batches(path: str, max_bytes: int | None, batch_bytes: int):
    """Lists of documents (str) of about `batch_bytes` UTF-8 bytes, with their byte count."""
    docs, size = [], 0
    for doc in documents(path, max_bytes):
        docs.append(doc.decode("utf-8"))
        size += len(doc)
        if size >= batch_bytes:
            yield docs, size
            docs, size = [], 0
    if docs:
        yield docs, size


class IdsDigest:
    """SHA-1 of all ids in order (as uint32), and an 8-byte digest per document."""

    def __init__(self):
        self.sha = hashlib.sha1()
        self.per_document = bytearray()
        self.count = 0

    def add(self, result, n: int) -> None:
        import numpy as np  # imported in the child after pinning its CPUs

        for ids in per_document(result, n):
            data = np.asarray(ids, dtype=np.uint32).tobytes()
            self.sha.update(data)
            self.per_document += hashlib.blake2b(data, digest_size=8).digest()
            self.count += len(data) // 4


def per_document(result, n: int):
    """Each document's ids, from a list of id sequences or from (flat ids, offsets)."""
    if isinstance(result, tuple):
        flat, offsets = result
        return (flat[offsets[i]:offsets[i + 1]] for i in range(n))
    return iter(result)


# --- one measurement, in a fresh process --------------------------------------------------------


def run_child(spec: dict) -> dict:
    """Build the tool, warm it up, encode the corpus; the numbers of this one run."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, spec["cpus"])
    load_average = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        encoder = bench_peers.build(spec["tool"], spec["encoding"], spec["threads"])
    except bench_peers.Unsupported as reason:
        return {"skipped": str(reason)}
    build_s = time.perf_counter() - t0
    if spec["threads"] == 1:
        encode, api = (lambda docs: [encoder.one(doc) for doc in docs]), encoder.one_api
    else:
        encode, api = encoder.batch, encoder.batch_api
    t0 = time.perf_counter()
    encode(bench_peers.WARM_UP)
    warmup_s = time.perf_counter() - t0
    encoder.warmed_up()
    base_rss = _current_rss()
    digest = None if spec["tool"] == YARDSTICK else IdsDigest()
    timed = encode_corpus(encode, spec, digest)
    if digest:
        with open(spec["doc_digests"], "wb") as f:
            f.write(digest.per_document)
    return timed | {
        "api": api, "ids": digest.count if digest else None, "digest": digest.sha.hexdigest() if digest else None,
        "build_s": build_s, "warmup_s": warmup_s, "base_rss_mb": base_rss / 1e6,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6,
        "load_average": load_average}


def encode_corpus(encode, spec: dict, digest: IdsDigest | None) -> dict:
    """Time `encode` on each batch of documents (and only that); feed the ids to `digest`."""
    seconds = cpu_seconds = 0.0
    size = count = 0
    batch_mb_s = []
    for docs, nbytes in batches(spec["corpus"], spec["max_bytes"], spec["batch_bytes"]):
        t0, c0 = time.perf_counter(), time.process_time()
        result = encode(docs)
        spent = time.perf_counter() - t0
        seconds += spent
        cpu_seconds += time.process_time() - c0
        batch_mb_s.append(nbytes / 1e6 / spent)
        size += nbytes
        count += len(docs)
        if digest:
            digest.add(result, len(docs))
        del result
    return {"megabytes": size / 1e6, "documents": count, "seconds": seconds, "mb_s": size / 1e6 / seconds,
            "cpu_mb_s": size / 1e6 / cpu_seconds, "cpu_per_wall": cpu_seconds / seconds,
            "batch_mb_s": batch_mb_s}


def diagnose_child(spec: dict) -> dict:
    """Where the tool's ids for one document first differ from tiktoken's."""
    import tiktoken

    doc = next(d for k, d in enumerate(documents(spec["corpus"], spec["max_bytes"])) if k == spec["document"])
    text = doc.decode("utf-8")
    encoder = bench_peers.build(spec["tool"], spec["encoding"], spec["threads"])
    result = [encoder.one(text)] if spec["threads"] == 1 else encoder.batch([text])
    got = [int(i) for i in next(per_document(result, 1))]
    reference = tiktoken.Encoding(**bench_peers.openai_spec(spec["encoding"]))
    expected = reference.encode_ordinary(text)
    at = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    window = slice(max(at - 3, 0), at + 5)
    return {"document": spec["document"], "document_bytes": len(doc), "tiktoken_ids": len(expected),
            "tool_ids": len(got), "first_difference": at, "tiktoken": expected[window], "tool": got[window],
            "text": reference.decode_bytes(expected[window]).decode("utf-8", "replace")}


def _current_rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


# --- all measurements, alternating -----------------------------------------------------------


def measure(corpora, tools=DEFAULT_TOOLS, encoding: str = "gpt2", threads=(1, 2), repeat: int = 3, *,
            max_bytes: int | None = None, batch_mb: float = 16, log=print) -> list[dict]:
    """Each (corpus, round, threads, tool) measurement in its own fresh process; all the runs.

    A run is a dict: corpus, encoding, tool, threads, round, cpus, max_bytes, and what
    `run_child` returns (or `skipped` / `error`); then `exact`, whether its ids equal tiktoken's
    on the corpus (None without a tiktoken run), and for the first run of a (corpus, tool,
    threads) whose ids differ, `mismatch`: where. Tools alternate, rotated each round.
    """
    corpora = [corpora] if isinstance(corpora, (str, os.PathLike)) else list(corpora)
    runs: list[dict] = []
    done_for_good: set = set()  # (corpus, tool, threads) skipped: no use asking again
    with tempfile.TemporaryDirectory(prefix="bench-encode-") as scratch:
        for corpus in map(os.fspath, corpora):
            for round_ in range(repeat):
                for n in threads:
                    for tool in _rotated(tools, round_):
                        if (tool == YARDSTICK and n > 1) or (corpus, tool, n) in done_for_good:
                            continue
                        run = dict(corpus=corpus, encoding=encoding, tool=tool, threads=n, round=round_,
                                   cpus=cpus_for(n, round_), max_bytes=max_bytes)
                        if not bench_peers.supports(tool, encoding):
                            only = ", ".join(bench_peers.TOOL_ENCODINGS[tool])
                            run["skipped"] = f"{tool} is built here for {only} only"
                        else:
                            run["doc_digests"] = os.path.join(scratch, f"{len(runs)}.bin")
                            run |= spawn("--child", dict(run, batch_bytes=int(batch_mb * 1e6)))
                        if "skipped" in run:
                            done_for_good.add((corpus, tool, n))
                        runs.append(run)
                        log(_progress(run, repeat))
        check_ids(runs, log)
    for run in runs:
        run.pop("doc_digests", None)
    return runs


def _rotated(tools, k: int) -> list:
    tools = list(tools)
    k %= max(len(tools), 1)
    return tools[k:] + tools[:k]


def cpus_for(threads: int, round_: int) -> list[int]:
    """One CPU for 1 thread, a different one each round (every tool gets the same in a round);
    the first `threads` CPUs otherwise."""
    if hasattr(os, "sched_getaffinity"):
        available = sorted(os.sched_getaffinity(0))
    else:
        available = list(range(os.cpu_count() or 1))
    return [available[round_ % len(available)]] if threads == 1 else available[:threads]


def child_env(threads: int) -> dict:
    """The environment of a run: the thread pools sized to `threads`, no caches set from outside."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTOKENS_")}
    n = str(threads)
    env.update(RAYON_NUM_THREADS=n, NUMBA_NUM_THREADS=n, OMP_NUM_THREADS=n,
               TOKENIZERS_PARALLELISM="true" if threads > 1 else "false",
               TIKTOKEN_CACHE_DIR="")  # tiktoken reads the local rank files without copying them to a cache
    return env


def spawn(mode: str, spec: dict) -> dict:
    """`run_child` ("--child") or `diagnose_child` ("--diagnose") in a fresh process; its dict, or
    {"error": the last line the process wrote to stderr}."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), mode, json.dumps(spec)],
                          env=child_env(spec["threads"]), capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]}
    return json.loads(lines[-1])


def _threads(n: int) -> str:
    return f"{n} thread{'s' if n > 1 else ''}"


def _progress(run: dict, repeat: int) -> str:
    where = (f"  {os.path.basename(run['corpus'])}, {_threads(run['threads'])}, "
             f"round {run['round'] + 1}/{repeat}, {run['tool']}: ")
    if "mb_s" in run:
        return where + (f"{run['mb_s']:.2f} MB/s (CPU {run['cpus']}, peak RSS {run['peak_rss_mb']:.0f} MB, "
                        f"warm-up {run['warmup_s']:.3f} s)")
    return where + (f"skipped: {run['skipped']}" if "skipped" in run else f"FAILED: {run['error']}")


# --- ids ----------------------------------------------------------------------------------------


def check_ids(runs: list[dict], log=print) -> None:
    """Set each run's `exact` against the first tiktoken run on its corpus; for the first run of
    each (corpus, tool, threads) that differs, find the first differing document and where in it."""
    reference = {}
    for run in runs:
        if run["tool"] == REFERENCE and run.get("digest"):
            reference.setdefault(run["corpus"], run)
    explained = set()
    for run in runs:
        if not run.get("digest"):
            continue
        ref = reference.get(run["corpus"])
        run["exact"] = None if ref is None else run["digest"] == ref["digest"]
        key = (run["corpus"], run["tool"], run["threads"])
        if run["exact"] is False and key not in explained:
            explained.add(key)
            run["mismatch"] = explain_mismatch(run, ref)
            log(f"  NOT EXACT: {run['tool']} ({_threads(run['threads'])}) on {os.path.basename(run['corpus'])}: "
                f"{describe_mismatch(run['mismatch'])}")


def explain_mismatch(run: dict, ref: dict) -> dict:
    with open(run["doc_digests"], "rb") as f:
        got = f.read()
    with open(ref["doc_digests"], "rb") as f:
        expected = f.read()
    differ = [k for k in range(min(len(got), len(expected)) // 8)
              if got[8 * k:8 * k + 8] != expected[8 * k:8 * k + 8]]
    mismatch = {"documents_differing": len(differ), "ids": run["ids"], "tiktoken_ids": ref["ids"]}
    if differ:
        spec = {key: run[key] for key in ("tool", "encoding", "corpus", "max_bytes", "threads")}
        mismatch["first"] = spawn("--diagnose", dict(spec, document=differ[0]))
    return mismatch


def describe_mismatch(m: dict) -> str:
    text = f"{m['documents_differing']} documents differ ({m['ids']:,} ids, tiktoken {m['tiktoken_ids']:,})"
    first = m.get("first", {})
    if "error" in first:
        return text + f"; diagnosing failed: {first['error']}"
    if first:
        text += (f"; the first is document {first['document']} ({first['document_bytes']:,} bytes, "
                 f"{first['tool_ids']:,} ids, tiktoken {first['tiktoken_ids']:,}), from id "
                 f"{first['first_difference']}: tiktoken {first['tiktoken']} vs {first['tool']}, "
                 f"text {first['text']!r}")
    return text


# --- summary ------------------------------------------------------------------------------------


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (corpus, threads, tool), in the order first run: median, min and max MB/s over
    the rounds, medians of MB per CPU-second, CPU/wall, build and warm-up seconds and of the RSS
    before encoding, the largest peak RSS; `exact`
    (None: no ids, or no tiktoken run); `skipped` or `errors`; and, for rows not known inexact,
    the ratios to the fastest exact peer and to tiktoken."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault((run["corpus"], run["threads"], run["tool"]), []).append(run)
    rows = [_row(key, group) for key, group in groups.items()]
    for corpus, threads in dict.fromkeys((r["corpus"], r["threads"]) for r in rows):
        table = [r for r in rows if (r["corpus"], r["threads"]) == (corpus, threads) and "mb_s" in r]
        best = max((r for r in table if r["tool"] in PEERS and r["exact"]), key=lambda r: r["mb_s"], default=None)
        tiktoken = next((r for r in table if r["tool"] == REFERENCE and r["exact"]), None)
        for row in table:
            if row["exact"] is not False and best:
                row |= {"best_peer": best["tool"], "vs_best_peer": row["mb_s"] / best["mb_s"]}
            if row["exact"] is not False and tiktoken:
                row["vs_tiktoken"] = row["mb_s"] / tiktoken["mb_s"]
    return rows


def _row(key: tuple, group: list[dict]) -> dict:
    corpus, threads, tool = key
    row = {"corpus": corpus, "threads": threads, "tool": tool, "runs": 0}
    if any("skipped" in r for r in group):
        return row | {"skipped": group[0]["skipped"]}
    errors = [r["error"] for r in group if "error" in r]
    done = [r for r in group if "mb_s" in r]
    if errors:
        row["errors"] = errors
    if not done:
        return row
    rates = [r["mb_s"] for r in done]
    exact = [r.get("exact") for r in done]
    return row | {
        "runs": len(done), "api": done[0]["api"], "megabytes": done[0]["megabytes"],
        "documents": done[0]["documents"], "mb_s": statistics.median(rates), "min_mb_s": min(rates),
        "max_mb_s": max(rates), "cpu_mb_s": statistics.median(r["cpu_mb_s"] for r in done),
        "cpu_per_wall": statistics.median(r["cpu_per_wall"] for r in done),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in done),
        "base_rss_mb": statistics.median(r["base_rss_mb"] for r in done),
        "build_s": statistics.median(r["build_s"] for r in done),
        "warmup_s": statistics.median(r["warmup_s"] for r in done),
        "load_average": [min(r["load_average"] for r in done), max(r["load_average"] for r in done)],
        "exact": False if False in exact else None if None in exact else True,
        "mismatch": next((r["mismatch"] for r in done if "mismatch" in r), None),
        "batch_mb_s": _batch_medians([r.get("batch_mb_s", []) for r in done]),
    }


def _batch_medians(runs: list[list[float]]) -> list[float]:
    """The median MB/s of each batch over the runs (those that have it: all runs read the same
    batches)."""
    n = min(map(len, runs), default=0)
    return [statistics.median(run[k] for run in runs) for k in range(n)]


def report(rows: list[dict], encoding: str, log=print) -> None:
    """A table per corpus and thread count, then the exact calls of each tool."""
    for corpus, threads in dict.fromkeys((r["corpus"], r["threads"]) for r in rows):
        table = [r for r in rows if (r["corpus"], r["threads"]) == (corpus, threads)]
        measured = [r for r in table if "mb_s" in r]
        log("")
        log(_table_title(corpus, threads, encoding, measured))
        log(f"  {'tool':<12}{'MB/s':>8} {'(min-max)':<15}{'x best':>7}{'x tiktoken':>11}{'MB/CPU-s':>9}"
            f"{'CPU/wall':>9}  {'ids':<10}{'peak RSS':>9}{'build':>8}{'warm-up':>9}")
        for r in measured:
            spread = f"({r['min_mb_s']:.1f}-{r['max_mb_s']:.1f})"
            log(f"  {r['tool']:<12}{r['mb_s']:>8.2f} {spread:<15}{_ratio(r, 'vs_best_peer'):>7}"
                f"{_ratio(r, 'vs_tiktoken'):>11}{r['cpu_mb_s']:>9.2f}{r['cpu_per_wall']:>9.2f}  {_ids(r):<10}"
                f"{r['peak_rss_mb']:>6.0f} MB{r['build_s']:>7.2f}s{r['warmup_s']:>8.3f}s")
        best = next((r["best_peer"] for r in measured if "best_peer" in r), None)
        log(f"  best exact peer: {best or 'none'}; ratios by median MB/s")
        if any(len(r["batch_mb_s"]) > 1 for r in measured):  # where in the corpus time goes
            log(f"  MB/s by batch of ~{_batch_size(measured[0])} (medians over the rounds):")
            for r in measured:
                log(f"  {r['tool']:<12}" + " ".join(f"{x:.0f}" for x in r["batch_mb_s"]))
        for r in table:
            if "skipped" in r:
                log(f"  {r['tool']}: skipped, {r['skipped']}")
            for error in sorted(set(r.get("errors", []))):
                log(f"  {r['tool']}: FAILED in {r['errors'].count(error)} run(s): {error}")
            if r.get("mismatch"):
                log(f"  {r['tool']}: NOT EXACT, left out of the ratios: {describe_mismatch(r['mismatch'])}")
    log("")
    log("Calls (1 thread: each document in turn; N threads: the batch API):")
    for tool in dict.fromkeys(r["tool"] for r in rows):
        apis = dict.fromkeys(f"{r['threads']}: {r['api']}" for r in rows if r["tool"] == tool and "api" in r)
        if apis:
            log(f"  {tool:<12}" + "\n  {:<12}".format("").join(apis))


def _table_title(corpus: str, threads: int, encoding: str, measured: list[dict]) -> str:
    mode = ("1 thread, pinned to one CPU: one call per document" if threads == 1 else
            f"{threads} threads on {threads} CPUs: each tool's batch API over the documents")
    if not measured:
        return f"{os.path.basename(corpus)}, {encoding}, {mode}"
    first = measured[0]
    low = min(r["load_average"][0] for r in measured)
    high = max(r["load_average"][1] for r in measured)
    rounds = max(r["runs"] for r in measured)
    return (f"{os.path.basename(corpus)}: {first['megabytes']:.2f} MB in {first['documents']:,} documents, "
            f"{encoding}; {mode}; {rounds} fresh process{'es' if rounds > 1 else ''} per tool; "
            f"load average {low:.1f}-{high:.1f}")


def _batch_size(row: dict) -> str:
    return f"{row['megabytes'] / len(row['batch_mb_s']):.0f} MB"


def _ratio(row: dict, key: str) -> str:
    return f"{row[key]:.2f}" if key in row else "-"


def _ids(row: dict) -> str:
    if row["exact"] is None:
        return "no ids" if row["tool"] == YARDSTICK else "unchecked"
    return "exact" if row["exact"] else "NOT EXACT"


def machine() -> dict:
    """The machine, the versions, and which nbbpe the runs import (with its git commit)."""
    versions = {}
    for package in ("nbbpe", "numba", "numpy", "tiktoken", "gigatoken", "fastokens", "tokenizers",
                    "bpe-openai", "quicktok-v1", "regex"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {"cpus": os.cpu_count(), "cpu": notebook_support.machine_summary()["cpu"],
            "python": platform.python_version(), "versions": versions, "nbbpe": _nbbpe_source(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def _nbbpe_source() -> str | None:
    spec = importlib.util.find_spec("nbbpe")  # finds it without importing it
    if spec is None:
        return None
    package = os.path.dirname(spec.origin)
    head = subprocess.run(["git", "-C", package, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return package
    changed = subprocess.run(["git", "-C", package, "diff", "--quiet", "HEAD", "--", "."], capture_output=True)
    return f"{package} (git {head.stdout.strip()}{', with uncommitted changes' if changed.returncode else ''})"


# --- for the notebooks --------------------------------------------------------------------------


def measure_encoding(corpus: str, tools=TOOLS, *, limit_mb: float | None = None, processes: int = 2,
                     repeat: int = 3, encoding: str = "gpt2") -> dict:
    """`measure` on one corpus with 1 thread and `processes` threads (each tool's batch API), the
    `regex.findall` yardstick included and tiktoken always (the reference), as a dict:

    corpus, encoding, megabytes, documents (also as `pieces`), threads, repeat, reference,
    findall: {mb_s}, single and pool: {tool: the summary row (`mb_s` the median) with
    `ids_equal`, whether its ids equal tiktoken's}, for the tools asked; rows; runs.
    """
    names = list(dict.fromkeys([*tools, *(t for t in (REFERENCE, YARDSTICK) if tool_available(t))]))
    runs = measure([corpus], names, encoding, (1, processes), repeat,
                   max_bytes=None if limit_mb is None else int(limit_mb * 1e6), log=lambda line: None)
    rows = summarize(runs)

    def by_tool(threads):
        return {r["tool"]: r | {"ids_equal": bool(r.get("exact"))} for r in rows
                if r["threads"] == threads and r["tool"] in tools}

    findall = next(r for r in rows if r["tool"] == YARDSTICK)
    first = next(r for r in rows if "mb_s" in r)
    return {"corpus": os.path.basename(corpus), "encoding": encoding, "megabytes": first["megabytes"],
            "documents": first["documents"], "pieces": first["documents"], "threads": processes,
            "repeat": repeat, "reference": REFERENCE, "findall": findall, "single": by_tool(1),
            "pool": by_tool(processes), "rows": rows, "runs": runs}


# --- command line -------------------------------------------------------------------------------


def parse_bytes(text: str) -> int:
    """200M, 1G, 5e8, 300000: decimal units."""
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    if text[-1:].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(float(text))


def default_corpora() -> list[str]:
    directory = notebook_support.shared_corpora_dir()
    if directory is None:
        raise SystemExit(f"no corpus given, and no shared corpora in {notebook_support.SHARED_CORPORA_DIRS}")
    return [os.path.join(directory, name) for name in DEFAULT_CORPORA]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("corpora", nargs="*", help=f"text files (default: the shared {', '.join(DEFAULT_CORPORA)})")
    parser.add_argument("--pattern", "--encoding", dest="encoding", default="gpt2", choices=bench_peers.ENCODINGS)
    parser.add_argument("--tools", default=",".join(DEFAULT_TOOLS),
                        help=f"comma-separated, of {','.join(ALL_TOOLS)} (tiktoken is always added: "
                             "it is the reference)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per tool and thread count")
    parser.add_argument("--max-bytes", type=parse_bytes, help="only the documents within the first N bytes (200M, 1G)")
    parser.add_argument("--batch-mb", type=float, default=16, help="documents handed to a tool at once")
    parser.add_argument("--json", help="write the settings, machine, runs and summary rows here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--diagnose", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [t for t in args.tools.split(",") if t.strip() and t.strip() not in ALL_TOOLS]
    if unknown:
        parser.error(f"unknown tools {unknown}; known: {', '.join(ALL_TOOLS)}")
    return args


def select_tools(tools: str, encoding: str) -> list[str]:
    """The tools asked for (tiktoken first) that are installed and built for `encoding`; says
    which are left out."""
    names = list(dict.fromkeys([REFERENCE, *(t.strip() for t in tools.split(",") if t.strip())]))
    missing = [t for t in names if not tool_available(t)]
    if missing:
        print(f"left out, not installed: {', '.join(f'{t} (package {TOOL_MODULES[t]})' for t in missing)}")
    other = [t for t in names if not bench_peers.supports(t, encoding)]
    if other:
        print(f"left out, not built for {encoding} here: {', '.join(other)}")
    return [t for t in names if t not in missing and t not in other]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child or args.diagnose:
        result = run_child(json.loads(args.child)) if args.child else diagnose_child(json.loads(args.diagnose))
        print(json.dumps(result))
        return 0
    corpora = args.corpora or default_corpora()
    about = machine()
    print(f"{about['date']}; {about['cpus']} CPUs ({about['cpu']}); Python {about['python']}; "
          f"nbbpe from {about['nbbpe']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in about["versions"].items() if v))
    names = select_tools(args.tools, args.encoding)
    limit = f"; the documents in the first {args.max_bytes:,} bytes of each corpus" if args.max_bytes else ""
    print(f"encoding {args.encoding}; tools {', '.join(names)}; threads {args.threads}; "
          f"{args.repeat} rounds{limit}")
    runs = measure(corpora, names, args.encoding, args.threads, args.repeat, max_bytes=args.max_bytes,
                   batch_mb=args.batch_mb)
    rows = summarize(runs)
    report(rows, args.encoding)
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("child", "diagnose")}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"settings": settings | {"corpora": corpora, "tools": names}, "machine": about,
                       "rows": rows, "runs": runs}, f, indent=1)
        print(f"\nnumbers written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
