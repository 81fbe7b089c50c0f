"""Throughput of the compiled GPT-2 pre-tokenizer against `regex`, on the same text.

    python scripts/bench_pretok.py [FILE ...] [--repeat N] [--processes 1 2] [--methods ...]

For each file, in MB/s (10**6 bytes of the file per second of wall time, best of --repeat runs):

- kernel scan:  `scan_gpt2(bytes)`: UTF-8 check + class per byte + boundaries (starts, ends);
- kernel count: `count_gpt2(bytes, ["<|endoftext|>"])`: special tokens cut out + scan + counts;
- regex finditer: `[m.end() for m in GPT2.finditer(text)]` (boundaries, like the scan);
- regex findall:  `GPT2.findall(text)`;
- regex count:    `PreTokenizer(GPT2_PATTERN, [EOT]).count_into(Counter(), text)`, the reference
                  counting path of training (like the kernel count).

The regex rows start from the decoded `str` (decoding not timed); the kernel rows from bytes.
With 2 processes, each forked process works on half of the file (cut where no pre-token changes)
after a common start; the rate is the file size over the time from the first start to the last
finish. The machine is shared: short runs in 2 processes suffer most from other load.
Numba compile time (an empty cache) and cache-load time (a fresh process) are measured apart in
subprocesses with their own NUMBA_CACHE_DIR, never mixed into the throughput.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import regex

from nbbpe.pretokenize import GPT2_PATTERN, PreTokenizer
from nbbpe.pretokenize_kernels import count_gpt2, merge_counts, scan_gpt2

EOT = "<|endoftext|>"
CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"
DEFAULT_FILES = [CORPORA / name for name in ("web_5M.txt", "tinystories_real.txt", "multi_1M.txt")]
GPT2 = regex.compile(GPT2_PATTERN)

STARTUP_PROBE = """
import json, time
t0 = time.perf_counter()
from nbbpe import pretokenize_kernels as k
t1 = time.perf_counter()
k.char_classes()
t2 = time.perf_counter()
k.scan_gpt2(b"it's 12 words")
t3 = time.perf_counter()
k.merge_counts([k.count_gpt2(b"a <|endoftext|> b", ["<|endoftext|>"])])
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "char_classes": t2 - t1, "scan": t3 - t2, "count": t4 - t3}))
"""


def startup_times(cache_dir: str) -> dict[str, float]:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", STARTUP_PROBE], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# --- the measured work: each takes the input (bytes or str) and returns something small ---------


def kernel_scan(data: bytes):
    return len(scan_gpt2(data)[0])


def kernel_count(data: bytes):
    return count_gpt2(data, [EOT])


def regex_finditer(text: str):
    return len([m.end() for m in GPT2.finditer(text)])


def regex_findall(text: str):
    return len(GPT2.findall(text))


def regex_count(text: str):
    counts: Counter = Counter()
    PreTokenizer(GPT2_PATTERN, [EOT]).count_into(counts, text)
    return counts


METHODS = {
    "kernel scan": (kernel_scan, "bytes"),
    "kernel count": (kernel_count, "bytes"),
    "regex finditer": (regex_finditer, "str"),
    "regex findall": (regex_findall, "str"),
    "regex count": (regex_count, "str"),
}


def halves(data: bytes) -> list[bytes]:
    """The file cut in two near its middle where no pre-token changes: at the special token
    nearest the middle, or if that is far off, after an ASCII letter or digit followed by a
    newline (a pre-token always ends there, and no rule looks behind)."""
    middle = len(data) // 2
    token = EOT.encode()
    candidates = [c for c in (data.rfind(token, 0, middle), data.find(token, middle)) if c >= 0]
    cut = min(candidates, key=lambda c: abs(c - middle), default=-1)
    if cut < 0 or abs(cut - middle) > len(data) // 20:
        match = regex.compile(rb"[A-Za-z0-9](?=\n)").search(data, middle)
        cut = match.end() if match else middle
    return [data[:cut], data[cut:]]


def _timed_worker(function, part, barrier, results, warm_up):
    if warm_up:  # a forked process's first call pays its page faults; the parent's was warm
        function(part[: 1 << 20])
    barrier.wait()
    start = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
    result = function(part)
    end = time.perf_counter()
    results.put((start, end, result if function is kernel_count else None))


def run_parallel(function, parts):
    """Wall time of `function` over the parts, one forked process each, from a common start."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(parts))
    results = context.Queue()
    warm_up = function in (kernel_scan, kernel_count)
    workers = [context.Process(target=_timed_worker,
                               args=(function, part, barrier, results, warm_up))
               for part in parts]
    for worker in workers:
        worker.start()
    outcomes = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise RuntimeError(f"a benchmark worker failed with exit code {worker.exitcode}")
    seconds = max(end for _, end, _ in outcomes) - min(start for start, _, _ in outcomes)
    return seconds, [result for _, _, result in outcomes]


def best_of(repeat, measure):
    return min(measure() for _ in range(repeat))


def bench_file(path: Path, repeat: int, processes: list[int], methods: list[str]) -> None:
    data = path.read_bytes()
    text = data.decode("utf-8")
    megabytes = len(data) / 1e6
    inputs = {"bytes": data, "str": text}
    split_inputs = {"bytes": halves(data), "str": [part.decode("utf-8") for part in halves(data)]}
    print(f"\n{path.name}: {len(data):,} bytes (halves {len(split_inputs['bytes'][0]):,} + "
          f"{len(split_inputs['bytes'][1]):,}), best of {repeat}")
    print(f"  {'MB/s':<16}" + "".join(f"{f'{n} proc':>10}" for n in processes))
    rates: dict[str, dict[int, float]] = {}
    merge_seconds = None
    for name in methods:
        function, kind = METHODS[name]
        rates[name] = {}
        for n in processes:
            if n == 1:
                def measure():
                    start = time.perf_counter()
                    function(inputs[kind])
                    return time.perf_counter() - start
            else:
                def measure():
                    nonlocal merge_seconds
                    seconds, tables = run_parallel(function, split_inputs[kind])
                    if function is kernel_count:
                        start = time.perf_counter()
                        merge_counts(tables)
                        merge_seconds = time.perf_counter() - start
                    return seconds
            rates[name][n] = megabytes / best_of(repeat, measure)
        print(f"  {name:<16}" + "".join(f"{rates[name][n]:>10.1f}" for n in processes), flush=True)
    for kernel, reference in (("kernel scan", "regex finditer"), ("kernel count", "regex count")):
        if kernel in rates and reference in rates:
            ratios = ", ".join(f"{rates[kernel][n] / rates[reference][n]:.1f}x ({n} proc)"
                               for n in processes)
            print(f"  {kernel} / {reference}: {ratios}")
    if merge_seconds is not None:
        print(f"  merge_counts of the 2 workers' tables: {merge_seconds * 1e3:.1f} ms "
              "(not in the 2-proc rate)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, default=DEFAULT_FILES)
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (best kept)")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2], choices=[1, 2],
                        help="1: the whole file in this process; 2: each half in its own")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS),
                        metavar="METHOD", help=f"any of: {', '.join(repr(m) for m in METHODS)}")
    parser.add_argument("--no-compile-time", action="store_true",
                        help="skip measuring compile and cache-load time")
    args = parser.parse_args(argv)

    if not args.no_compile_time:
        with tempfile.TemporaryDirectory() as cache_dir:
            cold = startup_times(cache_dir)
            warm = startup_times(cache_dir)
        print("first calls in a fresh process, seconds (import, char_classes, scan, count+merge):")
        for label, times in (("empty Numba cache (compile)", cold), ("Numba cache filled", warm)):
            parts = ", ".join(f"{key} {value:.2f}" for key, value in times.items())
            print(f"  {label:<28} total {sum(times.values()):6.2f}  ({parts})")
    # Compile (or load) here, before any timing.
    scan_gpt2(b"a b"), merge_counts([count_gpt2(b"a b", [EOT])])
    for path in args.files:
        bench_file(path, args.repeat, args.processes, args.methods)


if __name__ == "__main__":
    main()
