"""Train with nbbpe and its peers on the same corpus, side by side in one run, per pattern.

    python scripts/bench_train.py CORPUS [CORPUS ...] --vocab-size 10000 [--workers 2]
        [--pattern gpt2 cl100k o200k] [--repeat 3]
        [--tools nbbpe,nbbpe_regex,rustbpe,hf,gigatoken] [--json results.json]

Every measurement is one training in its own fresh process. For each this records the training
call's wall time and CPU time (all threads, and child processes: less disturbed by other load
than wall time), the whole process's wall and CPU time (start-up and imports included), the peak
memory of the process and its children together (sum of PSS, sampled with psutil every 20 ms),
and for nbbpe the one-time Numba cost (loading the cached kernels, or compiling them on a cold
cache: a training on a tiny file first, timed apart) and its phases (pretokenize, intern,
merge). The `--repeat` rounds alternate the tools (their order rotated each round) and the
patterns; the report gives the median and range (min-max) of the training time per tool and
pattern, then the ratios nbbpe / peer, and nbbpe's time with each pattern over its own time
with GPT-2's (the target: cl100k's or o200k's pattern at most 1.3x GPT-2's on the same corpus),
by median and per round, by wall time and by CPU time. Table columns: `train s` (median, with
the range), `CPU s` (of the training call), `process s` and `its CPU` (the whole process), MB/s
(of the training call), `peak MB`. The machines are shared and noisy: compare the ratios from
one run, not absolute times.

Patterns (`--pattern`, `nbbpe.patterns`): gpt2 (GPT-2's, the CS336 one), cl100k, o200k. The
tools that take a pattern get the same one: nbbpe (`pattern=`), rustbpe
(`train_from_iterator(..., pattern=)`, documents streamed from the file) and Hugging Face
`tokenizers` (GPT-2's: its ByteLevel pre-tokenizer, whose built-in regex is GPT-2's; the others:
`Split(Regex(pattern), "isolated")` then ByteLevel without its regex; Oniguruma reads
`\\p{N}{1,3}+` as a repetition, not a possessive, so cl100k's is given as `\\p{N}{1,3}`, which
splits alike). gigatoken's `train_bpe` has no pattern argument (GPT-2's only), nor has `python`
(a plain regex + multiprocessing trainer, scripts/python_baseline_bpe.py: slow, opt-in): both
run with gpt2 only. nbbpe_regex is nbbpe with the reference `regex` pre-tokenizer instead of the
compiled scanner. None but nbbpe and `python` give the CS336 merges, so only times are compared.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
EOT = "<|endoftext|>"
DEFAULT_TOOLS = "nbbpe,nbbpe_regex,rustbpe,hf,gigatoken"
PATTERNS = ("gpt2", "cl100k", "o200k")
TARGET_PATTERN_RATIO = 1.3
# The package each tool needs; the peers are optional (the `bench` extra).
TOOL_MODULES = dict(nbbpe="nbbpe", nbbpe_regex="nbbpe", rustbpe="rustbpe", hf="tokenizers",
                    gigatoken="gigatoken", python="regex")
GPT2_ONLY = ("gigatoken", "python")  # no way to give them another pattern


def tool_available(tool: str) -> bool:
    """Whether the tool's package can be imported here (without importing it)."""
    return importlib.util.find_spec(TOOL_MODULES[tool]) is not None


def supports(tool: str, pattern: str) -> bool:
    return pattern == "gpt2" or tool not in GPT2_ONLY


def pattern_string(pattern: str) -> str:
    from nbbpe import patterns

    return {"gpt2": patterns.GPT2_PATTERN, "cl100k": patterns.CL100K_PATTERN,
            "o200k": patterns.O200K_PATTERN}[pattern]


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


class Clock:
    """Wall and CPU seconds of a `with` block; CPU: this process's threads and its children that
    ended (user + system)."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), self._cpu()
        return self

    def __exit__(self, *exc_info):
        self.wall, self.cpu = time.perf_counter() - self.wall, self._cpu() - self.cpu

    @staticmethod
    def _cpu() -> float:
        return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                     resource.getrusage(resource.RUSAGE_CHILDREN)))


WARM_UP_TEXT = ("Warm-up: load the compiled kernels, 123 ünïcödé 🙂 it's here.\n" * 40 + EOT + "\n") * 4


def run_nbbpe(path, vocab_size, workers, pattern, pretokenizer="auto"):
    t0 = time.perf_counter()
    import nbbpe

    import_s = time.perf_counter() - t0
    # One-time Numba cost: a training on a tiny file loads the cached machine code of this
    # pattern's counting kernel and of the merge kernels (or compiles them on a cold cache).
    # "compiled", not "auto": on a cold cache "auto" counts a file this small with `regex`, and
    # the kernel would then compile in the timed training.
    with tempfile.TemporaryDirectory() as directory:
        tiny = os.path.join(directory, "warm_up.txt")
        with open(tiny, "w", encoding="utf-8") as f:
            f.write(WARM_UP_TEXT)
        t0 = time.perf_counter()
        nbbpe.train_bpe(tiny, 300, [EOT], num_workers=workers, pattern=pattern_string(pattern),
                        pretokenizer="compiled" if pretokenizer == "auto" else pretokenizer,
                        progress=False)
        numba_s = time.perf_counter() - t0
    timings = {}
    with Clock() as clock:
        vocab, merges = nbbpe.train_bpe(path, vocab_size, [EOT], num_workers=workers, pattern=pattern_string(pattern),
                                        pretokenizer=pretokenizer, progress=False, timings=timings)
    longest = max((t for i, t in vocab.items() if i >= 257), key=len)
    return dict(train_s=clock.wall, train_cpu_s=clock.cpu, import_s=import_s, numba_s=numba_s, phases=timings,
                vocab=len(vocab), longest=len(longest))


def run_nbbpe_regex(path, vocab_size, workers, pattern):
    """nbbpe with the reference `regex` pre-tokenizer instead of the compiled one."""
    return run_nbbpe(path, vocab_size, workers, pattern, pretokenizer="regex")


def run_rustbpe(path, vocab_size, workers, pattern):
    import rustbpe

    with Clock() as clock:
        tok = rustbpe.Tokenizer()
        tok.train_from_iterator(_documents(path), vocab_size, pattern=pattern_string(pattern))
    return dict(train_s=clock.wall, train_cpu_s=clock.cpu, vocab=tok.vocab_size)


def hf_pre_tokenizer(pattern):
    from tokenizers import Regex, pre_tokenizers

    if pattern == "gpt2":  # its built-in regex is GPT-2's
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    onig = pattern_string(pattern).replace(r"\p{N}{1,3}+", r"\p{N}{1,3}")  # see the docstring
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(onig), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def run_hf(path, vocab_size, workers, pattern):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    with Clock() as clock:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = hf_pre_tokenizer(pattern)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train([path], trainer)
    return dict(train_s=clock.wall, train_cpu_s=clock.cpu, vocab=tok.get_vocab_size())


def run_gigatoken(path, vocab_size, workers, pattern):
    import gigatoken

    with Clock() as clock:
        vocab, merges = gigatoken.train_bpe(path, vocab_size, [EOT])
    return dict(train_s=clock.wall, train_cpu_s=clock.cpu, vocab=len(vocab))


def run_python(path, vocab_size, workers, pattern):
    sys.path.insert(0, HERE)
    import python_baseline_bpe

    with Clock() as clock:
        vocab, merges = python_baseline_bpe.train(path, vocab_size, [EOT], workers=workers)
    return dict(train_s=clock.wall, train_cpu_s=clock.cpu, vocab=len(vocab))


RUNNERS = dict(nbbpe=run_nbbpe, nbbpe_regex=run_nbbpe_regex, rustbpe=run_rustbpe, hf=run_hf,
               gigatoken=run_gigatoken, python=run_python)


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


def measure(tool, path, vocab_size, workers, timeout, extra_env=None, pattern="gpt2"):
    """Train with `tool` in a fresh process; the run's numbers (or `error`). `extra_env` adds to
    its environment (e.g. NUMBA_CACHE_DIR set to an empty directory, to measure nbbpe's compile
    time on a cold cache)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", tool, path, "--vocab-size", str(vocab_size),
           "--workers", str(workers), "--pattern", pattern]
    env = dict(os.environ, RAYON_NUM_THREADS=str(workers), TOKENIZERS_PARALLELISM="true",
               **(extra_env or {}))
    load_average = os.getloadavg()[0]
    before = _children_cpu()
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    watched = psutil.Process(child.pid)
    peak = 0
    while child.poll() is None:
        peak = max(peak, tree_memory(watched))
        if time.perf_counter() - start > timeout:
            child.kill()
            child.wait()
            return dict(tool=tool, pattern=pattern, error=f"timed out after {timeout} s")
        time.sleep(0.02)
    wall = time.perf_counter() - start
    out, err = child.communicate()
    cpu = _children_cpu() - before
    if child.returncode != 0:
        return dict(tool=tool, pattern=pattern,
                    error=err.strip().splitlines()[-1] if err.strip() else "failed")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(tool=tool, pattern=pattern, process_s=wall, process_cpu_s=cpu, peak_rss_mb=peak / 1e6,
                  load_average=load_average)
    return result


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished children of this process, all threads."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_all(corpus, tools, patterns, vocab_size, workers, repeat, timeout, log=print):
    """Every (round, pattern, tool) in its own process, tools rotated each round; all the runs
    (each with its `round`). Tools that cannot take a pattern are left out for it."""
    runs = []
    for round_ in range(repeat):
        for pattern in patterns:
            k = round_ % len(tools)
            for tool in tools[k:] + tools[:k]:
                if not supports(tool, pattern):
                    continue
                run = measure(tool, corpus, vocab_size, workers, timeout, pattern=pattern)
                run["round"] = round_
                runs.append(run)
                log(f"  round {round_ + 1}/{repeat}, {pattern}, {tool}: "
                    + (f"train {run['train_s']:.2f} s, process {run['process_s']:.2f} s, "
                       f"peak {run['peak_rss_mb']:.0f} MB" if "error" not in run else f"FAILED: {run['error']}"))
    return runs


def summarize(runs):
    """One row per (pattern, tool), in order of first run: the medians of the times (train_s,
    process_s, and for nbbpe import_s, numba_s and each phase), min_train_s and max_train_s, the
    largest peak memory, the load averages seen; `errors` if any run failed."""
    rows = []
    for pattern, tool in dict.fromkeys((r["pattern"], r["tool"]) for r in runs):
        group = [r for r in runs if (r["pattern"], r["tool"]) == (pattern, tool)]
        done = [r for r in group if "error" not in r]
        row = dict(tool=tool, pattern=pattern, runs=len(done))
        errors = [r["error"] for r in group if "error" in r]
        if errors:
            row["errors"] = errors
        if not done:
            row["error"] = errors[0]
            rows.append(row)
            continue
        times = [r["train_s"] for r in done]
        row.update(train_s=statistics.median(times), min_train_s=min(times), max_train_s=max(times),
                   train_cpu_s=statistics.median(r["train_cpu_s"] for r in done),
                   process_s=statistics.median(r["process_s"] for r in done),
                   process_cpu_s=statistics.median(r["process_cpu_s"] for r in done),
                   peak_rss_mb=max(r["peak_rss_mb"] for r in done), vocab=done[0]["vocab"],
                   load_average=[min(r["load_average"] for r in done), max(r["load_average"] for r in done)])
        if "phases" in done[0]:
            row.update(import_s=statistics.median(r["import_s"] for r in done),
                       numba_s=statistics.median(r["numba_s"] for r in done), longest=done[0]["longest"],
                       phases={key: statistics.median(r["phases"][key] for r in done) for key in done[0]["phases"]})
        rows.append(row)
    return rows


def pattern_ratios(runs, tool="nbbpe", key="train_s"):
    """{pattern: (ratio of the median training time to GPT-2's, [the ratio in each round])} for
    `tool`; `key` "train_s" (wall) or "train_cpu_s" (CPU)."""
    by = {(r["pattern"], r["round"]): r[key] for r in runs if r["tool"] == tool and "error" not in r}
    out = {}
    for pattern in dict.fromkeys(p for p, _ in by):
        if pattern == "gpt2":
            continue
        rounds = sorted(k for p, k in by if p == pattern and ("gpt2", k) in by)
        if not rounds:
            continue
        median = statistics.median(by[pattern, k] for k in rounds) / statistics.median(by["gpt2", k] for k in rounds)
        out[pattern] = (median, [by[pattern, k] / by["gpt2", k] for k in rounds])
    return out


def report(corpus, rows, size, runs=None):
    """The table of `rows` (summary rows, or single runs), the ratios nbbpe / peer per pattern,
    and with `runs`, nbbpe's time per pattern over its GPT-2 time."""
    print(f"\n== {corpus}: {size / 1e6:.1f} MB ==")
    print(f"{'pattern':<8}{'tool':<12}{'train s':>8} {'(min-max)':<14}{'CPU s':>6}{'process s':>10}{'its CPU':>8}"
          f"{'MB/s':>7}{'peak MB':>8}  notes")
    for r in rows:
        pattern = r.get("pattern", "gpt2")
        if "error" in r:
            print(f"{pattern:<8}{r['tool']:<12}FAILED: {r['error']}")
            continue
        spread = f"({r['min_train_s']:.2f}-{r['max_train_s']:.2f})" if "min_train_s" in r else ""
        notes = ""
        if r["tool"].startswith("nbbpe"):
            ph = r["phases"]
            notes = (f"import {r['import_s']:.2f} s, numba load/compile {r['numba_s']:.2f} s; "
                     f"pre-tokenize {ph['pretokenize']:.2f} s, intern {ph['intern']:.2f} s, "
                     f"merge {ph['merge']:.2f} s; longest token {r['longest']} B")
        if r.get("errors"):
            notes += f" [{len(r['errors'])} run(s) failed: {r['errors'][0]}]"
        print(f"{pattern:<8}{r['tool']:<12}{r['train_s']:>8.2f} {spread:<14}{r['train_cpu_s']:>6.2f}"
              f"{r['process_s']:>10.2f}"
              f"{r.get('process_cpu_s', float('nan')):>8.2f}{size / 1e6 / r['train_s']:>7.1f}"
              f"{r['peak_rss_mb']:>8.0f}  {notes}")
    done = [r for r in rows if "error" not in r]
    for name in ("nbbpe", "nbbpe_regex"):
        for ours in (r for r in done if r["tool"] == name):
            pattern = ours.get("pattern", "gpt2")
            for r in done:
                if r["tool"].startswith("nbbpe") or r.get("pattern", "gpt2") != pattern:
                    continue
                print(f"{pattern:<7} {name} / {r['tool']:<9}: train time {ours['train_s'] / r['train_s']:.2f}x, "
                      f"process time {ours['process_s'] / r['process_s']:.2f}x, "
                      f"peak memory {ours['peak_rss_mb'] / r['peak_rss_mb']:.2f}x")
    if runs:
        for tool in ("nbbpe", "nbbpe_regex"):
            by_cpu = pattern_ratios(runs, tool, "train_cpu_s")
            for pattern, (median, per_round) in pattern_ratios(runs, tool).items():
                target = (f"; target <= {TARGET_PATTERN_RATIO}x: "
                          f"{'met' if median <= TARGET_PATTERN_RATIO else 'NOT met'}") if tool == "nbbpe" else ""
                print(f"{tool} training time, {pattern} / gpt2: {median:.2f}x by median "
                      f"(per round {', '.join(f'{x:.2f}' for x in per_round)}){target}; "
                      f"by CPU time {by_cpu[pattern][0]:.2f}x "
                      f"(per round {', '.join(f'{x:.2f}' for x in by_cpu[pattern][1])})")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("corpora", nargs="+")
    parser.add_argument("--vocab-size", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pattern", nargs="+", default=["gpt2"], choices=PATTERNS,
                        help="pre-tokenization patterns (default gpt2; give gpt2 too for nbbpe's ratios)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds: fresh processes per tool and pattern")
    parser.add_argument("--tools", default=DEFAULT_TOOLS, help=f"comma-separated, of {sorted(RUNNERS)}")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per tool and corpus")
    parser.add_argument("--json", help="also write all runs and summaries to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        result = RUNNERS[args.child](args.corpora[0], args.vocab_size, args.workers, args.pattern[0])
        print(json.dumps(result))
        return 0
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = set(tools) - set(RUNNERS)
    if unknown:
        parser.error(f"unknown tools {sorted(unknown)}; choose from {sorted(RUNNERS)}")
    missing = [t for t in tools if not tool_available(t)]
    if missing:
        print(f"left out, not installed: {', '.join(missing)}")
    tools = [t for t in tools if t not in missing]
    print(f"machine: {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
          f"load average {os.getloadavg()[0]:.1f}; vocab {args.vocab_size}, {args.workers} workers/threads; "
          f"patterns {', '.join(args.pattern)}; {args.repeat} rounds")
    for tool in tools:
        other = [p for p in args.pattern if not supports(tool, p)]
        if other:
            print(f"{tool}: no pattern argument, gpt2 only (left out for {', '.join(other)})")
    everything = {}
    for corpus in args.corpora:
        runs = measure_all(corpus, tools, args.pattern, args.vocab_size, args.workers, args.repeat, args.timeout)
        rows = summarize(runs)
        report(corpus, rows, os.path.getsize(corpus), runs)
        everything[corpus] = {"runs": runs, "rows": rows, "pattern_ratios": pattern_ratios(runs),
                              "pattern_cpu_ratios": pattern_ratios(runs, key="train_cpu_s")}
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
