"""Train with nbbpe and its peers on the same corpus, side by side in one run.

    python scripts/bench_train.py CORPUS [CORPUS ...] --vocab-size 10000 [--workers 2]
        [--tools nbbpe,nbbpe_regex,rustbpe,hf,gigatoken] [--json results.json]

Each tool runs in its own fresh process. For each one this prints the training call's wall time,
the whole process's wall time (start-up and imports included), the peak memory of the process
and its children together (sum of PSS, sampled with psutil every 20 ms), and MB/s; for nbbpe also the one-time Numba cost
(loading cached kernels, or compiling them on a cold cache) and its phases. Then the ratios
nbbpe / peer. The machines are shared and noisy: compare ratios from one run, not absolute times.

nbbpe_regex is nbbpe with the reference `regex` pre-tokenizer instead of the compiled scanner.
Peers: rustbpe (`train_from_iterator`, documents streamed from the file), Hugging Face
`tokenizers` (byte-level BPE trainer), gigatoken (`train_bpe`), and `python` (a plain
regex + multiprocessing trainer, scripts/python_baseline_bpe.py: slow, opt-in). None but nbbpe
and `python` give the CS336 merges, so only their times are compared.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
EOT = "<|endoftext|>"
DEFAULT_TOOLS = "nbbpe,nbbpe_regex,rustbpe,hf,gigatoken"
# The package each tool needs; the peers are optional (the `bench` extra).
TOOL_MODULES = dict(nbbpe="nbbpe", nbbpe_regex="nbbpe", rustbpe="rustbpe", hf="tokenizers",
                    gigatoken="gigatoken", python="regex")


def tool_available(tool: str) -> bool:
    """Whether the tool's package can be imported here (without importing it)."""
    return importlib.util.find_spec(TOOL_MODULES[tool]) is not None


def corpus_of_size(source: str, size: int, directory: str) -> str:
    """A corpus of about `size` bytes made from the file `source`, written into `directory`.

    Smaller than `source`: its beginning, cut right after the last `<|endoftext|>` line that
    fits (or a newline, if there is none), so no document is cut in half. Larger: whole copies
    of `source` one after another, then such a beginning. Copies repeat the words, so they
    scale the counts and the work, not the vocabulary: fine for timing, not for the merges.
    """
    source_size = os.path.getsize(source)
    stem = os.path.splitext(os.path.basename(source))[0]
    path = os.path.join(directory, f"{stem}_{size / 1e6:g}MB.txt")
    copies, rest = divmod(size, source_size)
    with open(source, "rb") as src:
        tail = src.read(rest)
        if rest and len(tail) == rest:
            end = tail.rfind(EOT.encode() + b"\n")
            end = end + len(EOT) + 1 if end >= 0 else tail.rfind(b"\n") + 1
            tail = tail[:end] if end > 0 else b""
        with open(path, "wb") as out:
            for _ in range(copies):
                src.seek(0)
                shutil.copyfileobj(src, out, 1 << 24)
                if not _ends_with_document_end(source):
                    out.write(("\n" + EOT + "\n").encode())  # copies stay separate documents
            out.write(tail)
    return path


def _ends_with_document_end(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - len(EOT) - 1))
        return f.read().endswith(EOT.encode() + b"\n")


# --- one tool, in a child process ---------------------------------------------------------------


def _documents(path):
    """The corpus's documents (text between <|endoftext|> lines), streamed."""
    with open(path, encoding="utf-8", errors="replace") as f:
        buf = []
        for line in f:
            if line.startswith(EOT):
                yield "".join(buf)
                buf = []
            else:
                buf.append(line)
        if buf:
            yield "".join(buf)


def run_nbbpe(path, vocab_size, workers, pretokenizer="auto"):
    t0 = time.perf_counter()
    import nbbpe
    from nbbpe.merge import load_merge_kernels
    from nbbpe.pretokenize_kernels import count_gpt2, merge_counts

    import_s = time.perf_counter() - t0
    # One-time Numba cost: load the cached machine code (or compile it on a cold cache).
    t0 = time.perf_counter()
    merge_counts([count_gpt2(b"warm up", [EOT])])
    load_merge_kernels()
    numba_s = time.perf_counter() - t0
    timings = {}
    t0 = time.perf_counter()
    vocab, merges = nbbpe.train_bpe(path, vocab_size, [EOT], num_workers=workers,
                                    pretokenizer=pretokenizer, progress=False, timings=timings)
    train_s = time.perf_counter() - t0
    longest = max((t for i, t in vocab.items() if i >= 257), key=len)
    return dict(train_s=train_s, import_s=import_s, numba_s=numba_s, phases=timings,
                vocab=len(vocab), longest=len(longest))


def run_nbbpe_regex(path, vocab_size, workers):
    """nbbpe with the reference `regex` pre-tokenizer instead of the compiled one."""
    return run_nbbpe(path, vocab_size, workers, pretokenizer="regex")


def run_rustbpe(path, vocab_size, workers):
    import rustbpe

    t0 = time.perf_counter()
    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(_documents(path), vocab_size)
    return dict(train_s=time.perf_counter() - t0, vocab=tok.vocab_size)


def run_hf(path, vocab_size, workers):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t0 = time.perf_counter()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([path], trainer)
    return dict(train_s=time.perf_counter() - t0, vocab=tok.get_vocab_size())


def run_gigatoken(path, vocab_size, workers):
    import gigatoken

    t0 = time.perf_counter()
    vocab, merges = gigatoken.train_bpe(path, vocab_size, [EOT])
    return dict(train_s=time.perf_counter() - t0, vocab=len(vocab))


def run_python(path, vocab_size, workers):
    sys.path.insert(0, HERE)
    import python_baseline_bpe

    t0 = time.perf_counter()
    vocab, merges = python_baseline_bpe.train(path, vocab_size, [EOT], workers=workers)
    return dict(train_s=time.perf_counter() - t0, vocab=len(vocab))


RUNNERS = dict(nbbpe=run_nbbpe, nbbpe_regex=run_nbbpe_regex, rustbpe=run_rustbpe, hf=run_hf, gigatoken=run_gigatoken,
               python=run_python)


# --- the parent: run each tool in its own process and watch it -----------------------------------


def tree_memory(proc: psutil.Process) -> int:
    """Memory of a process and its children: the sum of their PSS where the OS reports it.

    PSS splits pages shared between processes (forked workers share their parent's) among them,
    so the sum is what the tree really holds; summing RSS would count shared pages repeatedly.
    """
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            info = p.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except psutil.Error:
            pass
    return total


def measure(tool, path, vocab_size, workers, timeout, extra_env=None):
    """Train with `tool` in a fresh process; `extra_env` adds to its environment (e.g.
    NUMBA_CACHE_DIR set to an empty directory, to measure nbbpe's compile time on a cold cache)."""
    cmd = [sys.executable, __file__, "--child", tool, path, "--vocab-size", str(vocab_size),
           "--workers", str(workers)]
    env = dict(os.environ, RAYON_NUM_THREADS=str(workers), TOKENIZERS_PARALLELISM="true",
               **(extra_env or {}))
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    watched = psutil.Process(child.pid)
    peak = 0
    while child.poll() is None:
        peak = max(peak, tree_memory(watched))
        if time.perf_counter() - start > timeout:
            child.kill()
            child.wait()
            return dict(tool=tool, error=f"timed out after {timeout} s")
        time.sleep(0.02)
    wall = time.perf_counter() - start
    out, err = child.communicate()
    if child.returncode != 0:
        return dict(tool=tool, error=err.strip().splitlines()[-1] if err.strip() else "failed")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(tool=tool, process_s=wall, peak_rss_mb=peak / 1e6)
    return result


def report(corpus, results, size):
    print(f"\n== {corpus}: {size / 1e6:.1f} MB ==")
    print(f"{'tool':<11} {'train s':>8} {'process s':>9} {'MB/s':>7} {'peak MB':>11}  notes")
    for r in results:
        if "error" in r:
            print(f"{r['tool']:<11} {r['error']}")
            continue
        notes = ""
        if r["tool"].startswith("nbbpe"):
            ph = r["phases"]
            notes = (f"import {r['import_s']:.2f} s, numba load/compile {r['numba_s']:.2f} s; "
                     f"pre-tokenize {ph['pretokenize']:.2f} s, intern {ph['intern']:.2f} s, "
                     f"merge {ph['merge']:.2f} s; longest token {r['longest']} B")
        print(f"{r['tool']:<11} {r['train_s']:>8.2f} {r['process_s']:>9.2f} "
              f"{size / 1e6 / r['train_s']:>7.1f} {r['peak_rss_mb']:>11.0f}  {notes}")
    for name in ("nbbpe", "nbbpe_regex"):
        ours = next((r for r in results if r["tool"] == name and "error" not in r), None)
        if ours is None:
            continue
        for r in results:
            if r["tool"].startswith("nbbpe") or "error" in r:
                continue
            print(f"{name} / {r['tool']:<9}: train time {ours['train_s'] / r['train_s']:.2f}x, "
                  f"process time {ours['process_s'] / r['process_s']:.2f}x, "
                  f"peak memory {ours['peak_rss_mb'] / r['peak_rss_mb']:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpora", nargs="+")
    parser.add_argument("--vocab-size", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tools", default=DEFAULT_TOOLS, help=f"comma-separated, of {sorted(RUNNERS)}")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per tool and corpus")
    parser.add_argument("--json", help="also write all results to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        result = RUNNERS[args.child](args.corpora[0], args.vocab_size, args.workers)
        print(json.dumps(result))
        return
    tools = args.tools.split(",")
    unknown = set(tools) - set(RUNNERS)
    if unknown:
        parser.error(f"unknown tools {sorted(unknown)}; choose from {sorted(RUNNERS)}")
    print(f"machine: {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB; "
          f"vocab {args.vocab_size}, {args.workers} workers/threads")
    everything = {}
    for corpus in args.corpora:
        results = [measure(tool, corpus, args.vocab_size, args.workers, args.timeout) for tool in tools]
        report(corpus, results, os.path.getsize(corpus))
        everything[corpus] = results
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
