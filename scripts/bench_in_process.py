"""One thread, one call per document: nbbpe and its peers alternated inside one process.

    python scripts/bench_in_process.py [CORPUS ...] [--tools nbbpe,gigatoken,fastokens]
        [--rounds 7] [--cpu 1] [--api one|batch] [--json out.json]

This machine changes speed from one minute to the next (a tool's speed in `bench_encode.py`'s
fresh processes ranges over ±30% within a run), so ratios taken between processes minutes apart
are noisy. Here each round builds every tool afresh, in turn, in this one process pinned to one
CPU, and times a pass over the corpus's documents with a cold cache (one call per document, as
`bench_encode.py`'s 1-thread runs call them), then a second, warm, pass; the tools' order
alternates from round to round. nbbpe's ratio to each peer is taken within each round, seconds
apart, and reported as its median (and range) over the rounds, beside each tool's MB/s. Every
tool's ids are checked against the first tool's.

With `--api batch`, each pass is instead one call of the tool's batch API on all the documents
(built for one thread; the process is pinned to one CPU whatever the tool's own pool does):
what the tools' compiled code costs without a call from Python per document. With `--api
whole`, one call of the one-text API on the documents joined by line breaks into one str, made
anew for each pass (a tool that keeps a str's UTF-8 in the str, as CPython's
`PyUnicode_AsUTF8AndSize` does, finds none from an earlier pass): a long text, as a user who
reads a file into one str has it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import bench_peers  # noqa: E402
from bench_encode import default_corpora, documents, per_document  # noqa: E402
from encode_breakdown import show, spread  # noqa: E402


API_NAMES = {"one": "a call per document", "batch": "one batch call",
             "whole": "one call on them joined into one str"}


def one_round(tools: list[str], docs: list[str], api: str = "one") -> dict:
    """{tool: (cold seconds, warm seconds, each document's ids)} for one pass each, tools in
    the order given; a pass is a call per document (`api` "one"), one batch call ("batch") or
    one call on the documents joined into one str ("whole": its ids are the one document's)."""
    result = {}
    for name in tools:
        encoder = bench_peers.build(name, "gpt2", 1)
        for doc in bench_peers.WARM_UP:  # load (or compile) what the first call needs
            encoder.one(doc)
        encoder.warmed_up()
        if api == "whole":
            timed = []
            for _ in range(2):  # cold, then warm, each on a str made anew
                text = "\n".join(docs)
                t0 = time.perf_counter()
                ids = [encoder.one(text)]
                timed.append(time.perf_counter() - t0)
            cold, warm = timed
        elif api == "batch":
            encoder.batch(bench_peers.WARM_UP)
            t0 = time.perf_counter()
            ids = list(per_document(encoder.batch(docs), len(docs)))
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            encoder.batch(docs)
            warm = time.perf_counter() - t0
        else:
            t0 = time.perf_counter()
            ids = [encoder.one(doc) for doc in docs]
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            for doc in docs:
                encoder.one(doc)
            warm = time.perf_counter() - t0
        result[name] = (cold, warm, ids)
    return result


def measure(path: str, tools: list[str], rounds: int, api: str = "one") -> dict:
    docs = [doc.decode() for doc in documents(path)]
    megabytes = sum(len(doc.encode()) for doc in docs) / 1e6
    if api == "whole":  # and the line breaks joining them
        megabytes += (len(docs) - 1) / 1e6
    runs = []
    exact = {name: True for name in tools}
    for k in range(rounds):
        order = tools if k % 2 == 0 else tools[::-1]
        result = one_round(order, docs, api)
        reference = result[tools[0]][2]
        for name in tools:
            exact[name] &= all(np.array_equal(np.asarray(a), np.asarray(b))
                               for a, b in zip(result[name][2], reference))
        runs.append({name: {"cold_s": result[name][0], "warm_s": result[name][1]} for name in tools})
    rows = {}
    for name in tools:
        row = {"exact": exact[name]}
        for kind in ("cold", "warm"):
            speeds = [megabytes / run[name][f"{kind}_s"] for run in runs]
            row[f"{kind}_mb_s"] = spread(speeds)
            if name != "nbbpe" and "nbbpe" in tools:
                row[f"nbbpe_ratio_{kind}"] = spread(
                    [run[name][f"{kind}_s"] / run["nbbpe"][f"{kind}_s"] for run in runs])
        rows[name] = row
    return {"corpus": path, "megabytes": megabytes, "documents": len(docs), "api": api,
            "rounds": runs, "tools": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpora", nargs="*")
    parser.add_argument("--tools", default="nbbpe,gigatoken,fastokens")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cpu", type=int, default=None, help="pin to this CPU (default: the last)")
    parser.add_argument("--api", choices=("one", "batch", "whole"), default="one",
                        help="a call per document (default), one batch call on all of them, or "
                             "one call on them joined into one str")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    tools = [name for name in args.tools.split(",")
             if bench_peers.tool_available(name) or name == "nbbpe"]
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[-1] if args.cpu is None else args.cpu})
    results = []
    for path in args.corpora or default_corpora():
        result = measure(path, tools, args.rounds, args.api)
        results.append(result)
        print(f"{os.path.basename(path)}: {result['megabytes']:.2f} MB in {result['documents']:,} "
              f"documents, GPT-2's files, 1 thread, "
              f"{API_NAMES[args.api]}, {args.rounds} rounds")
        print("  tool        cold MB/s              warm MB/s              nbbpe / tool cold   "
              "nbbpe / tool warm   ids")
        for name, row in result["tools"].items():
            ratios = ("", "") if name == "nbbpe" else (show(row["nbbpe_ratio_cold"], 3),
                                                       show(row["nbbpe_ratio_warm"], 3))
            print(f"  {name:11s} {show(row['cold_mb_s'], 1):22s} {show(row['warm_mb_s'], 1):22s} "
                  f"{ratios[0]:19s} {ratios[1]:19s} {'exact' if row['exact'] else 'DIFFER'}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
