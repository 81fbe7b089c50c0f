"""Local threads against a Dask cluster on the same machine: training and encoding, side by side.

    python scripts/bench_distributed.py [CORPUS] [--max-bytes 200M] [--vocab-size 32000]
        [--repeat 3] [--tasks train,encode] [--workers 2] [--json results.json]

CORPUS defaults to /tmp/scale_1G.txt, made if absent with
`python ../shared/tools/make_scale_corpus.py /tmp/scale_1G.txt 10 ../shared/corpora/web_100M.txt`
(about 1 GB whose unique words grow with its size). `--max-bytes` takes its beginning, cut after a
document, for quicker runs.

Each measurement runs in a fresh process: `train_bpe` (vocab 32000, `<|endoftext|>`) or
`encode_file` (with the tokenizer of the first local training), either on `--workers` local
threads or with `client=` a `distributed.LocalCluster` of `--workers` worker processes of one
thread each, on the same cores. Local and cluster runs alternate (local first in even rounds,
the cluster first in odd ones), `--repeat` rounds. For each it reports the call's wall time (the
cluster is started before, and its start-up is reported apart), the whole process's wall time,
and the peak memory of the process tree (summed PSS, sampled every 0.25 s by `cli.PeakMemory`:
the cluster's worker processes are children of the process, so they are counted). Then the ratios
cluster / local (the target for the call's time is at most 1.15) and whether every run gave the
same merges (SHA-256 of the merges) and byte-identical token files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EOT = "<|endoftext|>"
DEFAULT_CORPUS = "/tmp/scale_1G.txt"
SCALE_TOOL = os.path.join(HERE, "..", "..", "shared", "tools", "make_scale_corpus.py")
SCALE_INPUT = os.path.join(HERE, "..", "..", "shared", "corpora", "web_100M.txt")
TARGET_RATIO = 1.15
# Memory is sampled this often: reading the PSS of the 3-4 processes of a cluster takes ~20 ms of
# CPU, which at PeakMemory's default 50 ms would slow the cluster runs more than the local ones.
SAMPLE_SECONDS = 0.25


# --- the corpus ---------------------------------------------------------------------------------


def ensure_corpus(path: str) -> str:
    if os.path.exists(path):
        return path
    if os.path.abspath(path) != DEFAULT_CORPUS:
        raise SystemExit(f"corpus not found: {path}")
    print(f"making {path} with {SCALE_TOOL} (10 passes over {SCALE_INPUT})", flush=True)
    subprocess.run([sys.executable, SCALE_TOOL, path, "10", SCALE_INPUT], check=True)
    return path


def corpus_prefix(path: str, max_bytes: int, directory: str) -> str:
    """The first `max_bytes` of `path` or less, cut right after a document (a line ending in
    <|endoftext|>, or else a newline), written into `directory`."""
    if os.path.getsize(path) <= max_bytes:
        return path
    stem = os.path.splitext(os.path.basename(path))[0]
    out = os.path.join(directory, f"{stem}_{max_bytes / 1e6:g}MB.txt")
    if os.path.exists(out):
        return out
    with open(path, "rb") as f:
        data = f.read(max_bytes)
    end = data.rfind(EOT.encode())
    end = end + len(EOT) if end >= 0 else data.rfind(b"\n") + 1
    newline = data.find(b"\n", end)
    end = newline + 1 if 0 <= newline else end
    with open(out + ".partial", "wb") as f:
        f.write(data[:end] if end > 0 else data)
    os.replace(out + ".partial", out)
    return out


def parse_size(text: str) -> int:
    units = {"k": 1e3, "m": 1e6, "g": 1e9}
    text = text.strip().lower().removesuffix("b")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


# --- one measurement, in a child process --------------------------------------------------------


def child(spec: dict) -> dict:
    started = time.perf_counter()
    import logging

    import nbbpe
    from nbbpe.cli import PeakMemory

    cluster = client = None
    startup = 0.0
    if spec["mode"] == "dask":
        import distributed

        t0 = time.perf_counter()
        cluster = distributed.LocalCluster(
            n_workers=spec["workers"], threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address=None, silence_logs=logging.ERROR)
        client = distributed.Client(cluster)
        client.wait_for_workers(spec["workers"])
        if not spec["cold"]:  # a cluster ready to work: its workers have loaded the kernels
            from nbbpe.distributed import warm_up

            warm_up(client)
        startup = time.perf_counter() - t0
    where = {"client": client} if client is not None else {"num_workers": spec["workers"]}
    result: dict = {"startup_s": startup}
    if spec["task"] == "train":
        timings: dict = {}
        t0 = time.perf_counter()
        with PeakMemory(interval=SAMPLE_SECONDS) as memory:
            vocab, merges = nbbpe.train_bpe(spec["corpus"], spec["vocab_size"], [EOT],
                                            progress=False, timings=timings, **where)
        result["call_s"] = time.perf_counter() - t0
        result["phases"] = timings
        result["digest"] = hashlib.sha256(pickle.dumps(merges, protocol=4)).hexdigest()
        result["merges"] = len(merges)
        if spec.get("save_tokenizer") and not os.path.exists(spec["save_tokenizer"]):
            nbbpe.Tokenizer(vocab, merges, [EOT]).save(spec["save_tokenizer"])
    else:
        tokenizer = nbbpe.Tokenizer.load(spec["tokenizer"])
        t0 = time.perf_counter()
        with PeakMemory(interval=SAMPLE_SECONDS) as memory:
            made = nbbpe.encode_file(tokenizer, spec["corpus"], spec["out"], progress=False,
                                     **where)
        result["call_s"] = time.perf_counter() - t0
        result["num_tokens"] = made.num_tokens
        digest = hashlib.sha256()
        for path in (made.path, made.sidecar_path):
            with open(path, "rb") as f:
                while block := f.read(1 << 24):
                    digest.update(block)
        result["digest"] = digest.hexdigest()
        os.remove(made.path)
        os.remove(made.sidecar_path)
    result.update(peak_pss=memory.peak_pss, peak_rss=memory.peak_rss)
    if client is not None:
        client.close()
        cluster.close()
    result["process_s"] = time.perf_counter() - started
    return result


def measure(spec: dict, timeout: float) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                          capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{spec['task']} on {spec['mode']} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["whole_process_s"] = wall  # as seen from outside, interpreter start-up included
    # Someone changed nbbpe's sources meanwhile, and a process compiled instead of loading.
    result["compiled"] = "compiling kernels" in proc.stderr
    return result


def warm_the_numba_cache(directory: str) -> None:
    """Train and encode a little, so that no measurement compiles kernels (not measured)."""
    sample = os.path.join(directory, "warm.txt")
    with open(sample, "w", encoding="utf-8") as f:
        f.write(("Once upon a time, 42 cats sat.\n" + EOT + "\n") * 2000)
    # pretokenizer="compiled": on a cold cache "auto" would count this small file with `regex`,
    # and encode it in Python
    code = ("import nbbpe, sys; v, m = nbbpe.train_bpe(sys.argv[1], 300, ['<|endoftext|>'], "
            "pretokenizer='compiled'); "
            "nbbpe.encode_file(nbbpe.Tokenizer(v, m, ['<|endoftext|>'], pretokenizer='compiled'), "
            "sys.argv[1], "
            "sys.argv[1] + '.bin'); import nbbpe.distributed as d; d.load_kernels()")
    subprocess.run([sys.executable, "-c", code, sample], check=True, capture_output=True)


# --- the report ---------------------------------------------------------------------------------


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    values = [v / scale for v in values]
    return (f"{statistics.median(values):.{digits}f} "
            f"[{min(values):.{digits}f}-{max(values):.{digits}f}]")


def report(task: str, runs: dict[str, list[dict]]) -> dict:
    local, dask = runs["local"], runs["dask"]
    print(f"\n{task}")
    print(f"  {'':6} {'call s, median [range]':>24} {'process s':>20} {'cluster start s':>18} "
          f"{'peak PSS MB':>22}")
    for mode, rows in runs.items():
        print(f"  {mode:6} {spread([r['call_s'] for r in rows]):>24} "
              f"{spread([r['whole_process_s'] for r in rows]):>20} "
              f"{spread([r['startup_s'] for r in rows]):>18} "
              f"{spread([r['peak_pss'] for r in rows], 1e6, 0):>22}")
    if task == "train":
        for mode, rows in runs.items():
            phases = {k: statistics.median(r["phases"][k] for r in rows)
                      for k in ("pretokenize", "merge")}
            print(f"  {mode:6} phases (median): pre-tokenize {phases['pretokenize']:.2f} s, "
                  f"merge {phases['merge']:.2f} s")
    per_round = [d["call_s"] / loc["call_s"] for loc, d in zip(local, dask)]
    ratio = statistics.median(r["call_s"] for r in dask) / statistics.median(
        r["call_s"] for r in local)
    memory = statistics.median(r["peak_pss"] for r in dask) / statistics.median(
        r["peak_pss"] for r in local)
    process = statistics.median(r["whole_process_s"] for r in dask) / statistics.median(
        r["whole_process_s"] for r in local)
    digests = {r["digest"] for rows in runs.values() for r in rows}
    what = "merges" if task == "train" else "token files"
    compiled = sum(r["compiled"] for rows in runs.values() for r in rows)
    if compiled:
        print(f"  ({compiled} run(s) compiled kernels: nbbpe's sources changed during the run)")
    print(f"  cluster/local: call {ratio:.3f} (per round {', '.join(f'{r:.3f}' for r in per_round)}; "
          f"target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'NOT met'}), "
          f"whole process {process:.3f}, peak memory {memory:.2f}")
    print(f"  identical {what} in all {len(local) + len(dask)} runs: "
          f"{'yes' if len(digests) == 1 else 'NO'} (sha256 {sorted(digests)[0][:16]}...)")
    return {"runs": runs, "ratio_call": ratio, "ratio_per_round": per_round,
            "ratio_process": process, "ratio_peak_pss": memory, "identical": len(digests) == 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", nargs="?", default=DEFAULT_CORPUS)
    parser.add_argument("--max-bytes", type=parse_size, default=None,
                        help="use the corpus's first bytes only (e.g. 200M)")
    parser.add_argument("--vocab-size", type=int, default=32_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2,
                        help="local threads, and cluster worker processes of one thread each")
    parser.add_argument("--tasks", default="train,encode")
    parser.add_argument("--workdir", default="/tmp/nbbpe-bench-distributed")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--cold", action="store_true",
                        help="do not load the kernels in the cluster's workers before the call "
                             "(the call pays for it, as the first run on a new cluster does)")
    parser.add_argument("--json", help="write the measurements here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0

    os.makedirs(args.workdir, exist_ok=True)
    corpus = ensure_corpus(args.corpus)
    if args.max_bytes:
        corpus = corpus_prefix(corpus, args.max_bytes, args.workdir)
    tasks = [t for t in args.tasks.split(",") if t]
    size = os.path.getsize(corpus)
    tokenizer_dir = os.path.join(args.workdir, f"tokenizer_{os.path.basename(corpus)}_{args.vocab_size}")
    print(f"corpus {corpus} ({size / 1e6:.1f} MB), vocab {args.vocab_size}, {args.repeat} rounds; "
          f"local: {args.workers} threads; cluster: LocalCluster of {args.workers} worker "
          f"processes x 1 thread, same machine ({os.cpu_count()} CPUs), started before the call"
          + (" (its workers load the kernels during the call)" if args.cold else
             " and its workers' kernels loaded (cluster start includes that)"))
    base = dict(corpus=corpus, vocab_size=args.vocab_size, workers=args.workers, cold=args.cold)
    warm_the_numba_cache(args.workdir)
    if "encode" in tasks and not os.path.exists(tokenizer_dir):
        print("training the tokenizer to encode with (not measured)", flush=True)
        measure(dict(base, task="train", mode="local", save_tokenizer=tokenizer_dir), args.timeout)
    results: dict = {task: {"local": [], "dask": []} for task in tasks}
    for round_ in range(args.repeat):
        for task in tasks:
            order = ["local", "dask"] if round_ % 2 == 0 else ["dask", "local"]
            for mode in order:
                spec = dict(base, task=task, mode=mode, save_tokenizer=tokenizer_dir,
                            tokenizer=tokenizer_dir,
                            out=os.path.join(args.workdir, f"tokens_{mode}.bin"))
                result = measure(spec, args.timeout)
                results[task][mode].append(result)
                print(f"round {round_ + 1} {task:6} {mode:5}: call {result['call_s']:.2f} s, "
                      f"process {result['whole_process_s']:.2f} s, peak PSS "
                      f"{result['peak_pss'] / 1e6:.0f} MB"
                      + (" (compiled kernels)" if result["compiled"] else ""), flush=True)
    summary = {"corpus": corpus, "corpus_bytes": size, "vocab_size": args.vocab_size,
               "workers": args.workers, "repeat": args.repeat}
    ok = True
    for task in tasks:
        summary[task] = report(task, results[task])
        ok = ok and summary[task]["identical"]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
