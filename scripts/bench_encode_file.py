"""Encoding a large corpus to token ids: nbbpe's `encode_file` against gigatoken's `encode_files`.

    python scripts/bench_encode_file.py                       # /tmp/scale_1G.txt, built if absent
    python scripts/bench_encode_file.py CORPUS [--max-bytes 200M] [--workers 1 2] [--repeat 3]
        [--pattern gpt2|cl100k|o200k] [--tools nbbpe gigatoken] [--json out.json]

The default corpus, about 1 GB with a few million unique pre-tokens, is built (once) with
`python ../shared/tools/make_scale_corpus.py /tmp/scale_1G.txt 10 ../shared/corpora/web_100M.txt`;
`--max-bytes` takes only its first documents (a copy cut after an `<|endoftext|>`, in --out).

Both tools get the same files: GPT-2's tests/fixtures/gpt2_vocab.json + gpt2_merges.txt (gigatoken
through the tokenizer.json Hugging Face writes from them), or the shared cl100k_base / o200k_base
`.tiktoken` rank files (see scripts/bench_peers.py); `<|endoftext|>` separates documents.

- nbbpe: `encode_file(tokenizer, corpus, out.bin, num_workers=N)`: the whole job on N threads
  (planning, reading, encoding, writing the token file, `<|endoftext|>` encoded as its id);
- gigatoken: `Tokenizer.encode_files(TextFileSource([corpus], separator="<|endoftext|>"))` with
  RAYON_NUM_THREADS=N: every document's ids, held in memory as an awkward array (the separators
  are not encoded, empty documents are skipped); writing them to disk afterwards is not timed.

Every (tool, workers) run is a fresh process: the previous round's output is removed, the
tokenizer is built and warmed up on a short string (loading nbbpe's compiled kernels), both timed
apart, then only the encoding call is timed. Tools alternate, their order rotated each round;
`--repeat` rounds give the median and range of MB/s (corpus bytes / seconds of the call). Also
per run: MB per CPU-second of the process (all threads) and CPU/wall, the load average, and
memory during the call: the peak of the PSS summed over the process tree
(`nbbpe.cli.PeakMemory`, sampled every 50 ms; pages shared between processes counted once) and
the PSS before the call (interpreter, libraries, tokenizer).

Ids: after the runs, the last round's token files are compared in chunks (memory-mapped, never
both whole in memory): nbbpe's ids with its separator id taken out must equal gigatoken's ids of
the documents end to end, and nbbpe's separators must fall exactly at gigatoken's document
boundaries. The issue's targets are printed with the results: nbbpe >= 1.2x gigatoken's
encode_files, with peak memory <= 1 GiB. The machine may be shared: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import bench_peers  # noqa: E402
from bench_encode import parse_bytes  # noqa: E402

ROOT = os.path.dirname(HERE)
EOT = "<|endoftext|>"
DEFAULT_CORPUS = "/tmp/scale_1G.txt"
SCALE_TOOL = [os.path.join(os.path.dirname(ROOT), "shared", "tools", "make_scale_corpus.py"),
              "/work/shared/tools/make_scale_corpus.py"]
SCALE_INPUTS = [os.path.join(os.path.dirname(ROOT), "shared", "corpora", "web_100M.txt"),
                "/work/shared/corpora/web_100M.txt"]
TOOLS = ("nbbpe", "gigatoken")
TARGET_RATIO = 1.2
TARGET_MEMORY = 2**30
CHUNK = 1 << 24  # ids per comparison step


# --- one run, in a fresh process ---------------------------------------------------------------


def build(tool: str, pattern: str):
    """The tool's tokenizer for `pattern`, from the local files, and the id of `<|endoftext|>`."""
    if tool == "nbbpe":
        from nbbpe import Tokenizer, patterns

        if pattern == "gpt2":
            return Tokenizer.from_files(bench_peers.GPT2_VOCAB, bench_peers.GPT2_MERGES, [EOT]), 50256
        eot_id = bench_peers.openai_spec(pattern)["special_tokens"][EOT]
        spelled = patterns.CL100K_PATTERN if pattern == "cl100k" else patterns.O200K_PATTERN
        return Tokenizer.from_tiktoken_file(bench_peers.tiktoken_file(pattern), spelled, {EOT: eot_id}), eot_id
    import gigatoken

    if pattern == "gpt2":
        with bench_peers.gpt2_tokenizer_json() as path, open(path, encoding="utf-8") as f:
            return gigatoken.Tokenizer.from_json(f.read()), 50256
    tok = gigatoken.Tokenizer.from_tiktoken(bench_peers.tiktoken_file(pattern), pretokenizer=pattern,
                                            special_tokens={})
    return tok, bench_peers.openai_spec(pattern)["special_tokens"][EOT]


def run_case(tool: str, corpus: str, workers: int, pattern: str, out: str) -> dict:
    import numpy as np
    import psutil

    from nbbpe.cli import PeakMemory
    from nbbpe.token_files import SIDECAR_SUFFIX

    # The previous round's output goes first: replacing a file of 1 GB frees its pages, ~0.2 s
    # of one thread spent in the final rename, which is not encoding (gigatoken writes untimed).
    for stale in (out, out + SIDECAR_SUFFIX, out + ".offsets"):
        if os.path.exists(stale):
            os.remove(stale)
    load_average = os.getloadavg()[0]
    t0 = time.perf_counter()
    tokenizer, eot_id = build(tool, pattern)
    t1 = time.perf_counter()
    tokenizer.encode("Warm-up: load the kernels, 123 ünïcödé")
    t2 = time.perf_counter()
    base_pss = psutil.Process().memory_full_info().pss
    c0 = time.process_time()
    with PeakMemory() as memory:
        start = time.perf_counter()
        if tool == "nbbpe":
            from nbbpe import encode_file

            result = encode_file(tokenizer, corpus, out, num_workers=workers, progress=False)
            tokens, documents = result.num_tokens, None
        else:
            import gigatoken

            ids = tokenizer.encode_files(gigatoken.TextFileSource([corpus], separator=EOT))
        seconds = time.perf_counter() - start
    cpu = time.process_time() - c0
    if tool == "gigatoken":  # to disk for the comparison, after the clock
        layout = ids.layout
        flat = np.asarray(layout.content.data)
        offsets = np.asarray(layout.offsets.data, dtype=np.int64)
        flat.tofile(out)
        offsets.tofile(out + ".offsets")
        tokens, documents = len(flat), len(offsets) - 1
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": tokens, "documents": documents,
            "build_s": t1 - t0, "warmup_s": t2 - t1, "base_pss": base_pss, "peak_pss": memory.peak_pss,
            "max_rss": memory.max_rss, "load_average": load_average, "eot_id": eot_id, "ids": out}


# --- the ids ---------------------------------------------------------------------------------


def compare_ids(nbbpe_path: str, gigatoken_path: str, eot_id: int) -> str:
    """'equal', or where nbbpe's token file and gigatoken's ids first differ (see the docstring)."""
    import numpy as np

    from nbbpe import open_token_file

    ours = open_token_file(nbbpe_path)
    theirs = np.memmap(gigatoken_path, dtype=np.uint32, mode="r") if os.path.getsize(gigatoken_path) \
        else np.zeros(0, dtype=np.uint32)
    offsets = np.fromfile(gigatoken_path + ".offsets", dtype=np.int64)
    at = 0  # ids of `theirs` matched so far
    boundaries = []  # where nbbpe's separators fall in its ids without them
    for begin in range(0, len(ours), CHUNK):
        chunk = np.asarray(ours[begin:begin + CHUNK])
        separator = chunk == eot_id
        kept = chunk[~separator].astype(np.uint32)
        other = np.asarray(theirs[at:at + len(kept)])
        if not np.array_equal(kept, other):
            differ = np.flatnonzero(kept[:len(other)] != other)
            k = int(differ[0]) if len(differ) else len(other)
            return (f"DIFFER: nbbpe's id {at + k:,} (separators left out) is {int(kept[k])}, "
                    f"gigatoken's {int(other[k]) if k < len(other) else 'missing'}")
        where = np.flatnonzero(separator)
        boundaries.append(at + where - np.arange(len(where)))
        at += len(kept)
    if at != len(theirs):
        return f"DIFFER: nbbpe has {at:,} ids besides its separators, gigatoken {len(theirs):,}"
    ours_cut = np.unique(np.concatenate([[0, at], *boundaries]))
    theirs_cut = np.unique(np.concatenate([[0, at], offsets]))
    if not np.array_equal(ours_cut, theirs_cut):
        return (f"DIFFER at the document boundaries: nbbpe's separators at {len(ours_cut):,} places, "
                f"gigatoken's documents end at {len(theirs_cut):,}")
    return "equal"


# --- the parent -------------------------------------------------------------------------------


def prepare_corpus(path: str, max_bytes: int | None, out: str) -> str:
    """The corpus to use: built if it is the default and absent; cut to `max_bytes` if asked."""
    if not os.path.exists(path):
        tool = next((t for t in SCALE_TOOL if os.path.exists(t)), None)
        source = next((s for s in SCALE_INPUTS if os.path.exists(s)), None)
        if path != DEFAULT_CORPUS or tool is None or source is None:
            raise SystemExit(f"{path} not found")
        print(f"building {path}: make_scale_corpus.py {path} 10 {source}", flush=True)
        subprocess.run([sys.executable, tool, path, "10", source], check=True)
    if max_bytes is None or os.path.getsize(path) <= max_bytes:
        return path
    cut_path = os.path.join(out, f"{os.path.splitext(os.path.basename(path))[0]}_{max_bytes}.txt")
    if not (os.path.exists(cut_path) and os.path.getmtime(cut_path) >= os.path.getmtime(path)):
        with open(path, "rb") as f:
            data = f.read(max_bytes)
        end = data.rfind(EOT.encode())
        data = data[:end + len(EOT)] if end > 0 else data[:data.rfind(b"\n") + 1]
        with open(cut_path + ".partial", "wb") as f:
            f.write(data)
        os.replace(cut_path + ".partial", cut_path)
    return cut_path


def spawn(tool: str, corpus: str, workers: int, pattern: str, out: str) -> dict:
    env = dict(os.environ, RAYON_NUM_THREADS=str(workers), NUMBA_NUM_THREADS=str(workers))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), corpus, "--pattern", pattern,
                           "--case", tool, str(workers), out], env=env, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]}
    return json.loads(lines[-1])


def summarize(runs: list[dict], size: int) -> list[dict]:
    rows = []
    for key in dict.fromkeys((r["tool"], r["workers"]) for r in runs):
        done = [r for r in runs if (r["tool"], r["workers"]) == key and "seconds" in r]
        errors = [r["error"] for r in runs if (r["tool"], r["workers"]) == key and "error" in r]
        row = {"tool": key[0], "workers": key[1], "runs": len(done), "errors": errors}
        if done:
            rates = [size / 1e6 / r["seconds"] for r in done]
            row |= {"mb_s": statistics.median(rates), "min_mb_s": min(rates), "max_mb_s": max(rates),
                    "cpu_mb_s": statistics.median(size / 1e6 / r["cpu_seconds"] for r in done),
                    "cpu_per_wall": statistics.median(r["cpu_seconds"] / r["seconds"] for r in done),
                    "tokens": done[-1]["tokens"], "peak_pss": max(r["peak_pss"] for r in done),
                    "base_pss": statistics.median(r["base_pss"] for r in done),
                    "build_s": statistics.median(r["build_s"] for r in done),
                    "warmup_s": statistics.median(r["warmup_s"] for r in done),
                    "load": (min(r["load_average"] for r in done), max(r["load_average"] for r in done))}
        rows.append(row)
    return rows


def report(rows: list[dict], ids: dict) -> None:
    print(f"\n{'tool':<10}{'workers':>8}{'MB/s':>8} {'(min-max)':<14}{'MB/CPU-s':>9}{'CPU/wall':>9}"
          f"{'tokens':>14}{'peak PSS':>10}{'base':>7}{'build':>7}{'warm-up':>8}{'load':>10}  ids")
    for r in rows:
        if "mb_s" not in r:
            print(f"{r['tool']:<10}{r['workers']:>8}  FAILED: {'; '.join(sorted(set(r['errors'])))}")
            continue
        spread = f"({r['min_mb_s']:.1f}-{r['max_mb_s']:.1f})"
        load = f"{r['load'][0]:.1f}-{r['load'][1]:.1f}"
        print(f"{r['tool']:<10}{r['workers']:>8}{r['mb_s']:>8.1f} {spread:<14}{r['cpu_mb_s']:>9.1f}"
              f"{r['cpu_per_wall']:>9.2f}{r['tokens']:>14,}{r['peak_pss'] / 2**20:>7.0f}MiB"
              f"{r['base_pss'] / 2**20:>4.0f}MiB{r['build_s']:>6.2f}s{r['warmup_s']:>7.2f}s{load:>10}"
              f"  {ids.get(r['workers'], '-') if r['tool'] == 'nbbpe' else ''}")
        if r["errors"]:
            print(f"{'':<18}also failed in {len(r['errors'])} run(s): {r['errors'][0]}")
    for r in rows:
        peer = next((p for p in rows if p["tool"] == "gigatoken" and p["workers"] == r["workers"]
                     and "mb_s" in p), None)
        if r["tool"] != "nbbpe" or "mb_s" not in r:
            continue
        memory = (f"peak memory {r['peak_pss'] / 2**30:.2f} GiB "
                  f"({'within' if r['peak_pss'] <= TARGET_MEMORY else 'ABOVE'} the 1 GiB target)")
        if peer is None:
            print(f"nbbpe, {r['workers']} workers: {memory}")
            continue
        ratio = r["mb_s"] / peer["mb_s"]
        print(f"nbbpe / gigatoken, {r['workers']} workers: {ratio:.2f}x by median MB/s "
              f"(runs {r['min_mb_s'] / peer['max_mb_s']:.2f}-{r['max_mb_s'] / peer['min_mb_s']:.2f}x; "
              f"target >= {TARGET_RATIO}x: {'met' if ratio >= TARGET_RATIO else 'NOT met'}), "
              f"{r['cpu_mb_s'] / peer['cpu_mb_s']:.2f}x by MB per CPU-second; {memory}; "
              f"gigatoken peak {peer['peak_pss'] / 2**30:.2f} GiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("corpus", nargs="?", default=DEFAULT_CORPUS)
    parser.add_argument("--max-bytes", type=parse_bytes, help="only the documents in the first N bytes (200M)")
    parser.add_argument("--pattern", default="gpt2", choices=bench_peers.ENCODINGS)
    parser.add_argument("--workers", type=int, nargs="+", default=[os.cpu_count() or 1],
                        help="threads for each tool (default: one per CPU)")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per tool and worker count")
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--out", default=os.path.join(ROOT, "out", "bench_encode_file"),
                        help="directory for the token files (and a cut corpus)")
    parser.add_argument("--keep", action="store_true", help="keep the token files written")
    parser.add_argument("--json", help="also write the settings, runs and summary here")
    parser.add_argument("--case", nargs=3, help=argparse.SUPPRESS)  # internal: TOOL WORKERS OUT, one run
    args = parser.parse_args(argv)

    if args.case:
        tool, workers, out = args.case
        print(json.dumps(run_case(tool, args.corpus, int(workers), args.pattern, out)))
        return 0

    import psutil

    os.makedirs(args.out, exist_ok=True)
    corpus = prepare_corpus(args.corpus, args.max_bytes, args.out)
    size = os.path.getsize(corpus)
    print(f"corpus: {corpus} ({size / 1e6:.1f} MB); pattern {args.pattern}; workers {args.workers}; "
          f"{args.repeat} rounds; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    runs = []
    for round_ in range(args.repeat):
        for workers in args.workers:
            k = round_ % len(args.tools)
            for tool in args.tools[k:] + args.tools[:k]:
                out = os.path.join(args.out, f"{tool}_{args.pattern}_{workers}.bin")
                run = {"tool": tool, "workers": workers, "round": round_}
                run |= spawn(tool, corpus, workers, args.pattern, out)
                runs.append(run)
                rate = f"{size / 1e6 / run['seconds']:.1f} MB/s, peak PSS {run['peak_pss'] / 2**20:.0f} MiB" \
                    if "seconds" in run else f"FAILED: {run['error']}"
                print(f"  round {round_ + 1}/{args.repeat}, {workers} workers, {tool}: {rate}", flush=True)

    ids = {}
    for workers in args.workers:
        last = {r["tool"]: r for r in runs if r["workers"] == workers and "seconds" in r}
        if "nbbpe" in last and "gigatoken" in last:
            ids[workers] = compare_ids(last["nbbpe"]["ids"], last["gigatoken"]["ids"], last["nbbpe"]["eot_id"])
    rows = summarize(runs, size)
    report(rows, ids)
    print(f"load average after the runs: {os.getloadavg()[0]:.1f}; "
          f"memory available: {psutil.virtual_memory().available / 2**30:.1f} GiB")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"settings": vars(args) | {"corpus": corpus, "bytes": size}, "runs": runs,
                       "rows": rows, "ids": ids}, f, indent=1)
    if not args.keep:
        for r in runs:
            for path in (r.get("ids"), (r.get("ids") or "") + ".json", (r.get("ids") or "") + ".offsets"):
                if path and os.path.exists(path):
                    os.remove(path)
    return 0 if all(v == "equal" for v in ids.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
