"""Throughput of nbbpe's compiled pre-tokenizers against `regex`, per pattern family, same text.

    python scripts/bench_pretok.py [FILE ...] [--pattern gpt2 cl100k o200k] [--threads 1 2]
        [--repeat 5] [--methods ...] [--no-compile-time]

For each file and pattern family (gpt2, cl100k, o200k: GPT-2's, cl100k_base's and o200k_base's
patterns, `nbbpe.patterns`), in MB/s (10**6 bytes of the file per second of wall time; the
median of --repeat runs in this process, with their range):

- kernel spans: `first_invalid_utf8` (the UTF-8 check every compiled path makes first), then
  the family's spans kernel (`nbbpe.scanners.<family>.<family>_spans(buf, class_table(), ...)`),
  which writes the start and end of every pre-token (arrays allocated before the clock starts);
- kernel count: `count_pretokens(buf, family, ["<|endoftext|>"])`: UTF-8 check, special tokens
  cut out, scan, and a table of unique pre-tokens with counts, as training does;
- regex finditer: `[m.end() for m in regex.compile(PATTERN).finditer(text)]` (boundaries, like
  the spans kernel; the special token is plain text to both);
- regex findall:  `PATTERN.findall(text)`;
- regex count:    `PreTokenizer(PATTERN, [EOT]).count_into(Counter(), text)`, the reference
                  counting path (like the kernel count).

The regex rows start from the decoded `str` (decoding not timed), the kernel rows from bytes.
All `regex` calls pass concurrent=True (released GIL, as nbbpe's regex path does).

With 2 threads the file is cut in two halves where a pre-token always ends (after an ASCII
letter or digit followed by a line break, near the middle), each half is worked on by its own
thread from a common start (a barrier), and the rate is the file size over the time from the
start to the last thread's end. The kernels release the GIL, so the threads run in parallel;
for the counts each thread fills its own `PretokenCounter`, and the two tables are then combined
with `merge_counts` (timed apart, and checked equal to the 1-thread count).
Checks, outside the clock: the spans kernel finds as many pre-tokens as `regex.finditer`.

Also per run: MB per CPU-second (process time, all threads): with 1 thread, the rate it would
have with the CPU to itself, which other load on a shared machine disturbs less than wall time;
and CPU/wall, the CPUs busy on average (near 2 with 2 threads if they really ran in parallel;
below 1 with 1 thread if the CPU was shared).

Numba compile time (an empty cache) and cache-load time (a fresh process with the cache filled)
are measured apart in subprocesses with their own NUMBA_CACHE_DIR, never mixed into the rates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import regex

from nbbpe import patterns
from nbbpe.pretokenize import PreTokenizer
from nbbpe.pretokenize_kernels import PretokenCounter, count_pretokens, merge_counts
from nbbpe.scanners import cl100k, gpt2, o200k
from nbbpe.scanners.classes import first_invalid_utf8

EOT = "<|endoftext|>"
CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"
DEFAULT_FILES = [CORPORA / name for name in ("web_5M.txt", "tinystories_real.txt", "multi_1M.txt")]

FAMILIES = {  # family -> (its pattern, its spans kernel, its class table)
    "gpt2": (patterns.GPT2_PATTERN, gpt2.gpt2_spans, gpt2.class_table),
    "cl100k": (patterns.CL100K_PATTERN, cl100k.cl100k_spans, cl100k.class_table),
    "o200k": (patterns.O200K_PATTERN, o200k.o200k_spans, o200k.class_table),
}
METHODS = ("kernel spans", "kernel count", "regex finditer", "regex findall", "regex count")

# Run in a fresh process: the first calls of each family's kernels, each timed.
STARTUP_PROBE = """
import json, sys, time
import numpy as np
t0 = time.perf_counter()
from nbbpe.pretokenize_kernels import count_pretokens, merge_counts
from nbbpe.scanners import cl100k, gpt2, o200k
from nbbpe.scanners.classes import first_invalid_utf8
times = {"import": time.perf_counter() - t0}
kernels = {"gpt2": (gpt2.gpt2_spans, gpt2.class_table), "cl100k": (cl100k.cl100k_spans, cl100k.class_table),
           "o200k": (o200k.o200k_spans, o200k.class_table)}
buf = np.frombuffer("it's 12 wörds <|endoftext|> more".encode(), dtype=np.uint8)
t0 = time.perf_counter()
first_invalid_utf8(buf, 0, len(buf))
times["utf8 check"] = time.perf_counter() - t0
for family in sys.argv[1:]:
    spans, class_table = kernels[family]
    t0 = time.perf_counter()
    table = class_table()
    t1 = time.perf_counter()
    bounds, out = np.array([0, len(buf)]), np.empty(len(buf), dtype=np.int64)
    spans(buf, table, bounds[:1], bounds[1:], out, out.copy())
    t2 = time.perf_counter()
    merge_counts([count_pretokens(buf, family, ["<|endoftext|>"])])
    t3 = time.perf_counter()
    times.update({f"{family} table": t1 - t0, f"{family} spans": t2 - t1, f"{family} count": t3 - t2})
print(json.dumps(times))
"""


def startup_times(cache_dir: str, families: list[str]) -> dict[str, float]:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", STARTUP_PROBE, *families], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# --- the measured work --------------------------------------------------------------------------


class Work:
    """The methods for one family, each a function of one input (a half or the whole file).

    Every function returns something to check (a number of pre-tokens, or a counts table).
    """

    def __init__(self, family: str, size: int):
        pattern, self.spans_kernel, class_table = FAMILIES[family]
        self.family = family
        self.pattern = pattern
        self.compiled = regex.compile(pattern)
        self.table = class_table()
        # Room for one pre-token per byte; a half writes into its own part (see `spans`).
        self.starts = np.empty(size, dtype=np.int64)
        self.ends = np.empty(size, dtype=np.int64)

    def spans(self, buf: np.ndarray, at: int = 0) -> int:
        if first_invalid_utf8(buf, 0, len(buf)) >= 0:
            raise ValueError("invalid UTF-8")
        bounds = np.array([0, len(buf)], dtype=np.int64)
        return self.spans_kernel(buf, self.table, bounds[:1], bounds[1:],
                                 self.starts[at:at + len(buf)], self.ends[at:at + len(buf)])

    def count(self, buf: np.ndarray, counter: PretokenCounter | None = None):
        if counter is None:
            return count_pretokens(buf, self.family, [EOT])
        counter.add(buf)
        return counter.result()

    def finditer(self, text: str) -> int:
        return len([m.end() for m in self.compiled.finditer(text, concurrent=True)])

    def findall(self, text: str) -> int:
        return len(self.compiled.findall(text, concurrent=True))

    def regex_count(self, text: str) -> Counter:
        counts: Counter = Counter()
        PreTokenizer(self.pattern, [EOT]).count_into(counts, text)
        return counts


def middle_cut(data: bytes) -> int:
    """Where to cut the file in two, near its middle, without changing any pre-token (of any
    family, special token or not): after an ASCII letter or digit followed by a line break.
    (Always the end of a pre-token, and the line break starts one; no rule looks behind.)"""
    match = regex.compile(rb"[A-Za-z0-9](?=[\r\n])").search(data, len(data) // 2)
    return match.end() if match else len(data) // 2


def run_threads(jobs) -> tuple[float, float, list]:
    """Run the jobs (functions of no argument) on one thread each from a common start; the
    wall seconds from the start to the last end, the process CPU seconds, and their results."""
    barrier = threading.Barrier(len(jobs) + 1)
    results: list = [None] * len(jobs)
    errors: list = []

    def worker(k, job):
        barrier.wait()
        try:
            results[k] = job()
        except BaseException as error:  # noqa: BLE001 (re-raised in the caller)
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(k, job)) for k, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start, cpu = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.join()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if errors:
        raise errors[0]
    return seconds, cpu, results


def jobs_for(work: Work, method: str, n: int, data: dict):
    """The jobs of one run of `method` on `n` threads (1: the whole file in this thread)."""
    if n == 1:
        whole = {"kernel spans": lambda: work.spans(data["bytes"]),
                 "kernel count": lambda: work.count(data["bytes"]),
                 "regex finditer": lambda: work.finditer(data["str"]),
                 "regex findall": lambda: work.findall(data["str"]),
                 "regex count": lambda: work.regex_count(data["str"])}
        return [whole[method]]
    (a, b), (ta, tb) = data["byte halves"], data["str halves"]
    if method == "kernel spans":
        return [lambda: work.spans(a, 0), lambda: work.spans(b, len(a))]
    if method == "kernel count":  # each thread its own counter, made before the clock starts
        counters = [PretokenCounter(work.family, [EOT]) for _ in range(2)]
        return [lambda: work.count(a, counters[0]), lambda: work.count(b, counters[1])]
    function = {"regex finditer": work.finditer, "regex findall": work.findall,
                "regex count": work.regex_count}[method]
    return [lambda: function(ta), lambda: function(tb)]


def measure(work: Work, method: str, n: int, data: dict, repeat: int) -> dict:
    """Median and range of MB/s over `repeat` runs; medians of MB per CPU-second (process time,
    all threads) and of CPU/wall (CPUs busy on average); the last run's results."""
    megabytes = len(data["bytes"]) / 1e6
    rates, cpu_rates, busy = [], [], []
    results = None
    for _ in range(repeat):
        if n == 1:  # on this thread: no thread start in the time
            job, = jobs_for(work, method, 1, data)
            start, cpu = time.perf_counter(), time.process_time()
            results = [job()]
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        else:
            seconds, cpu, results = run_threads(jobs_for(work, method, n, data))
        rates.append(megabytes / seconds)
        cpu_rates.append(megabytes / max(cpu, 1e-9))
        busy.append(cpu / seconds)
    return {"mb_s": statistics.median(rates), "min": min(rates), "max": max(rates),
            "cpu_mb_s": statistics.median(cpu_rates), "cpu_per_wall": statistics.median(busy),
            "results": results}


# --- the report ---------------------------------------------------------------------------------


def bench_file(path: Path, families: list[str], threads: list[int], methods: list[str],
               repeat: int) -> dict:
    raw = path.read_bytes()
    cut = middle_cut(raw)
    data = {"bytes": np.frombuffer(raw, dtype=np.uint8), "str": raw.decode("utf-8")}
    data["byte halves"] = (data["bytes"][:cut], data["bytes"][cut:])
    data["str halves"] = (raw[:cut].decode("utf-8"), raw[cut:].decode("utf-8"))
    print(f"\n{path.name}: {len(raw):,} bytes (halves {cut:,} + {len(raw) - cut:,}); "
          f"median (min-max) of {repeat} runs; load average {os.getloadavg()[0]:.1f}")
    out = {}
    for family in families:
        work = Work(family, len(raw))
        # Before any clock starts: the kernels loaded (or compiled), the spans arrays touched.
        work.spans(data["bytes"])
        merge_counts([work.count(data["bytes"][:1000])])
        print(f"  {family + ':':<8}{'threads':>15}{'MB/s':>9} {'(min-max)':<16}{'MB/CPU-s':>9}{'CPU/wall':>9}")
        rows = {}
        for method in methods:
            rows[method] = {n: measure(work, method, n, data, repeat) for n in threads}
            for k, n in enumerate(threads):
                r = rows[method][n]
                spread = f"({r['min']:.1f}-{r['max']:.1f})"
                print(f"    {method if k == 0 else '':<15}{n:>4}{r['mb_s']:>9.1f} {spread:<16}"
                      f"{r['cpu_mb_s']:>9.1f}{r['cpu_per_wall']:>9.2f}", flush=True)
        report_checks(rows, threads)
        out[family] = {m: {n: {k: v for k, v in r.items() if k != "results"} for n, r in by_n.items()}
                       for m, by_n in rows.items()}
        del work
    return out


def report_checks(rows: dict, threads: list[int]) -> None:
    for kernel, reference in (("kernel spans", "regex finditer"), ("kernel count", "regex count")):
        if kernel in rows and reference in rows:
            ratios = ", ".join(f"{rows[kernel][n]['mb_s'] / rows[reference][n]['mb_s']:.1f}x "
                               f"({n} thread{'s' if n > 1 else ''})" for n in threads)
            print(f"    {kernel} / {reference}: {ratios}")
    if "kernel spans" in rows and "regex finditer" in rows:
        for n in threads:
            ours, theirs = (sum(rows[m][n]["results"]) for m in ("kernel spans", "regex finditer"))
            if ours != theirs:
                print(f"    PRE-TOKENS DIFFER ({n} threads): kernel {ours:,}, regex {theirs:,}")
    if "kernel count" in rows and 2 in threads:
        tables = rows["kernel count"][2]["results"]
        start = time.perf_counter()
        merged = merge_counts(tables)
        merge_ms = (time.perf_counter() - start) * 1e3
        whole = rows["kernel count"][1]["results"][0] if 1 in threads else None
        same = "" if whole is None else (", equal to the 1-thread count" if merged.to_dict() == whole.to_dict()
                                         else ", NOT EQUAL TO THE 1-THREAD COUNT")
        print(f"    merge_counts of the 2 threads' tables ({len(tables[0].counts):,} + "
              f"{len(tables[1].counts):,} words -> {len(merged.counts):,}): {merge_ms:.1f} ms "
              f"(not in the 2-thread rate){same}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("files", nargs="*", type=Path, default=DEFAULT_FILES)
    parser.add_argument("--pattern", nargs="+", default=list(FAMILIES), choices=list(FAMILIES),
                        help="pattern families (default: all three)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement (median, range)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], choices=[1, 2],
                        help="1: the whole file on this thread; 2: each half on its own thread")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS,
                        metavar="METHOD", help=f"any of: {', '.join(repr(m) for m in METHODS)}")
    parser.add_argument("--no-compile-time", action="store_true",
                        help="skip measuring compile and cache-load time")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)

    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at the start")
    startup = {}
    if not args.no_compile_time:
        with tempfile.TemporaryDirectory() as cache_dir:
            startup["compile"] = startup_times(cache_dir, args.pattern)
            startup["cache load"] = startup_times(cache_dir, args.pattern)
        print("first calls in a fresh process, seconds:")
        for label, times in (("compile", startup["compile"]), ("cache load", startup["cache load"])):
            parts = ", ".join(f"{key} {value:.2f}" for key, value in times.items())
            print(f"  {label:<11} total {sum(times.values()):6.2f}  ({parts})")
    everything = {"startup": startup, "files": {}}
    for path in args.files:
        everything["files"][str(path)] = bench_file(path, args.pattern, sorted(args.threads),
                                                    args.methods, args.repeat)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
