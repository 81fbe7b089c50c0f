"""Dataset encoding: `encode_file` (1 and N workers) against tiktoken's `encode_ordinary_batch`.

    python scripts/bench_encode_file.py /work/shared/corpora/web_100M.txt
    python scripts/bench_encode_file.py /work/shared/corpora/web_5M.txt --workers 1 2 --repeat 2

Both use the GPT-2 files in tests/fixtures (tiktoken is built offline from gpt2_vocab.json, never
downloaded), with `<|endoftext|>` as the document separator:

- nbbpe: `encode_file(tokenizer, corpus, out.bin, num_workers=N)`, the whole job: chunking,
  reading, decoding, encoding in N worker processes, writing the uint16 file. Compiled kernels
  are loaded before the clock starts (their one-time cost is printed apart);
- tiktoken: the text read into memory (not timed) and split at `<|endoftext|>` into documents,
  then `encode_ordinary_batch(docs, num_threads=N)` on batches of about 8 MB of documents; only
  those calls are timed (converting and writing the ids are not), which favours tiktoken.

Each case runs in a fresh process. Memory is that process with its workers: the peak of the sum of
their PSS (pages a forked worker shares with its parent counted once) and of their RSS (shared
pages counted in every process), sampled with psutil every 50 ms, and the largest RSS of any
single process (exact, from the kernel). The ids of every case must equal
(the tiktoken ids of the documents joined with id 50256): the script checks this on the files.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
EOT = "<|endoftext|>"
EOT_ID = 50256
BATCH_BYTES = 8 << 20


def run_nbbpe(corpus: str, workers: int, out: str) -> dict:
    from nbbpe import Tokenizer, encode_file
    from nbbpe.cli import PeakMemory

    t0 = time.perf_counter()
    tokenizer = Tokenizer.from_files(os.path.join(FIXTURES, "gpt2_vocab.json"),
                                     os.path.join(FIXTURES, "gpt2_merges.txt"), [EOT])
    t1 = time.perf_counter()
    tokenizer.encode_to_numpy(f"load the kernels{EOT}")
    t2 = time.perf_counter()
    with PeakMemory() as memory:
        result = encode_file(tokenizer, corpus, out, num_workers=workers, progress=False)
    return {"seconds": result.seconds, "tokens": result.num_tokens, "bytes": result.source_bytes,
            "build_seconds": t1 - t0, "kernel_load_seconds": t2 - t1, "peak_pss": memory.peak_pss,
            "peak_rss_sum": memory.peak_rss, "max_rss": memory.max_rss, "ids": out}


def run_tiktoken(corpus: str, threads: int, out: str) -> dict:
    import tiktoken

    from nbbpe.cli import PeakMemory
    from nbbpe.pretokenize import GPT2_PATTERN
    from nbbpe.vocab_files import load_gpt2_files

    vocab, _ = load_gpt2_files(os.path.join(FIXTURES, "gpt2_vocab.json"),
                               os.path.join(FIXTURES, "gpt2_merges.txt"))
    ranks = {token: i for i, token in vocab.items() if token != EOT.encode()}
    encoding = tiktoken.Encoding(name="gpt2-offline", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                 special_tokens={EOT: EOT_ID})
    encoding.encode_ordinary("warm up")
    with PeakMemory() as memory:
        with open(corpus, encoding="utf-8") as f:
            docs = f.read().split(EOT)
        size = os.path.getsize(corpus)
        batches, batch, batch_bytes = [], [], 0
        for doc in docs:
            batch.append(doc)
            batch_bytes += len(doc)
            if batch_bytes >= BATCH_BYTES:
                batches.append(batch)
                batch, batch_bytes = [], 0
        batches.append(batch)
        del docs
        seconds = 0.0
        tokens = 0
        with open(out, "wb") as sink:
            for k, batch in enumerate(batches):
                start = time.perf_counter()
                encoded = encoding.encode_ordinary_batch(batch, num_threads=threads)
                seconds += time.perf_counter() - start
                for i, ids in enumerate(encoded):
                    last = k == len(batches) - 1 and i == len(encoded) - 1
                    ids = np.array(ids if last else ids + [EOT_ID], dtype=np.uint16)
                    tokens += len(ids)
                    sink.write(ids.tobytes())
    return {"seconds": seconds, "tokens": tokens, "bytes": size, "peak_pss": memory.peak_pss,
            "peak_rss_sum": memory.peak_rss, "max_rss": memory.max_rss, "ids": out}


def same_ids(a: str, b: str) -> bool:
    x, y = np.memmap(a, dtype=np.uint16, mode="r"), np.memmap(b, dtype=np.uint16, mode="r")
    if len(x) != len(y):
        return False
    step = 1 << 24
    return all(np.array_equal(x[i:i + step], y[i:i + step]) for i in range(0, len(x), step))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                        help="processes for nbbpe, threads for tiktoken (default: 1 2)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per case, interleaved; the fastest is shown (memory: of that run)")
    parser.add_argument("--tools", nargs="+", default=["nbbpe", "tiktoken"], choices=["nbbpe", "tiktoken"])
    parser.add_argument("--out", default=os.path.join("out", "bench_encode_file"))
    parser.add_argument("--keep", action="store_true", help="keep the token files written")
    parser.add_argument("--case", nargs=2, help=argparse.SUPPRESS)  # internal: TOOL WORKERS, one run
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    if args.case:
        tool, workers = args.case[0], int(args.case[1])
        out = os.path.join(args.out, f"{tool}_{workers}.bin")
        run = run_nbbpe if tool == "nbbpe" else run_tiktoken
        print(json.dumps(run(args.corpus, workers, out)))
        return 0

    import psutil

    print(f"corpus: {args.corpus} ({os.path.getsize(args.corpus) / 1e6:.1f} MB); machine: "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} before the runs")
    results = {}
    for _ in range(args.repeat):  # interleaved, so machine noise hits every case alike
        for workers in args.workers:
            for tool in args.tools:
                proc = subprocess.run([sys.executable, __file__, args.corpus, "--out", args.out,
                                       "--case", tool, str(workers)],
                                      capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    print(proc.stderr, file=sys.stderr)
                    return 1
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                rates = results.get((tool, workers), {}).get("all_mb_s", [])
                result["all_mb_s"] = rates + [result["bytes"] / result["seconds"] / 1e6]
                best = results.get((tool, workers))
                if best is None or result["seconds"] < best["seconds"]:
                    results[tool, workers] = result
                else:
                    best["all_mb_s"] = result["all_mb_s"]

    reference = next((r["ids"] for (tool, _), r in results.items() if tool == "tiktoken"), None)
    header = (f"{'tool':<10}{'workers':>8}{'MB/s':>8}{'M tok/s':>9}{'seconds':>9}{'tokens':>13}"
              f"{'peak PSS':>10}{'RSS sum':>9}{'max RSS':>9}{'vs tiktoken':>12}  ids")
    print(header)
    for (tool, workers), r in results.items():
        rate = r["bytes"] / r["seconds"]
        peer = results.get(("tiktoken", workers))
        ratio = f"{rate / (peer['bytes'] / peer['seconds']):.2f}x" if peer else "-"
        same = "-" if reference is None else ("equal" if same_ids(r["ids"], reference) else "DIFFER")
        print(f"{tool:<10}{workers:>8}{rate / 1e6:>8.2f}{r['tokens'] / r['seconds'] / 1e6:>9.2f}"
              f"{r['seconds']:>9.2f}{r['tokens']:>13,}{r['peak_pss'] / 1e6:>8.0f}MB"
              f"{r['peak_rss_sum'] / 1e6:>7.0f}MB{r['max_rss'] / 1e6:>7.0f}MB{ratio:>12}  {same}"
              + (f"  (runs: {', '.join(f'{x:.1f}' for x in r['all_mb_s'])} MB/s)" if args.repeat > 1 else ""))
    for (tool, workers), r in results.items():
        if tool == "nbbpe":
            print(f"nbbpe {workers} worker(s): tokenizer built in {r['build_seconds']:.2f} s, "
                  f"kernels loaded in {r['kernel_load_seconds']:.2f} s (not in the times above)")
    print(f"load average after the runs: {os.getloadavg()[0]:.1f}; "
          f"memory available: {psutil.virtual_memory().available / 2**30:.1f} GiB")
    if not args.keep:
        for r in results.values():
            os.remove(r["ids"])
            if os.path.exists(r["ids"] + ".json"):
                os.remove(r["ids"] + ".json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
