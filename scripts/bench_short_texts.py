"""The cost of one call on a short text: nbbpe's `encode_to_numpy` against the peers'
one-text calls.

    python scripts/bench_short_texts.py [--pattern gpt2|cl100k|o200k] [--tools nbbpe,gigatoken,...]
        [--repeat 3] [--calls 20000] [--story-file FILE] [--json out.json]

Encoding text one short document at a time (chat messages, queries, the TinyStories documents of
843 bytes on average) costs each tool a fixed price per call besides the encoding: crossing from
Python into compiled code, handing over the text, making the result. Per tool and text, the same
text is encoded `--calls` times in a row (its pre-tokens are in every tool's cache after the first
call, so this is the call's price plus a warm encode), 5 times; the best of those 5 is the run's
figure, in µs per call. Texts: 3 bytes ("Hi!"), 9 bytes ("Hello you"), and the first 843 bytes of
tinystories_real.txt without its `<|endoftext|>` separators (cut at a character).

Every (tool, round) is a fresh process pinned to one CPU, the tools alternated, their order rotated
each round; the median and range over `--repeat` rounds are reported. Each tool is built as
scripts/bench_peers.py builds it (the calls of `bench_encode.py`'s 1-thread runs), and its ids are
checked against tiktoken's.
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

ROOT = os.path.dirname(HERE)
CORPORA = [os.path.join(os.path.dirname(ROOT), "shared", "corpora"), "/work/shared/corpora"]
DEFAULT_TOOLS = ("nbbpe", "gigatoken", "fastokens", "tiktoken")


def default_story_file() -> str:
    for directory in CORPORA:
        path = os.path.join(directory, "tinystories_real.txt")
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"tinystories_real.txt is in none of {CORPORA}")


def texts(story_file: str) -> dict[str, str]:
    """The texts each call encodes, by label: two tiny ones and the first 843 bytes of
    `story_file` (its `<|endoftext|>` separators taken out: documents are plain text)."""
    with open(story_file, encoding="utf-8") as f:
        text = f.read(8000).replace(bench_peers.EOT, "")
    story = text.encode()[:843].decode(errors="ignore")
    return {"3 B": "Hi!", "9 B": "Hello you", f"{len(story.encode())} B": story}


def run_child(spec: dict) -> dict:
    """Build the tool, time its one-text call on each text; µs per call, best of 5."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {spec["cpu"]})
    encoder = bench_peers.build(spec["tool"], spec["encoding"], 1)
    for doc in bench_peers.WARM_UP:  # load (or compile) what the first call needs
        encoder.one(doc)
    encoder.warmed_up()
    one = encoder.one
    result = {"api": encoder.one_api, "us_per_call": {}, "ids": {}}
    for label, text in texts(spec["story_file"]).items():
        ids = one(text)
        result["ids"][label] = [int(i) for i in ids]
        for _ in range(1000):
            one(text)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(spec["calls"]):
                one(text)
            best = min(best, (time.perf_counter() - t0) / spec["calls"])
        result["us_per_call"][label] = best * 1e6
    return result


def measure(tools, encoding: str, repeat: int, calls: int, story_file: str) -> dict:
    runs: dict[str, list[dict]] = {tool: [] for tool in tools}
    for round_ in range(repeat):
        order = tools[round_ % len(tools):] + tools[: round_ % len(tools)]
        for tool in order:
            spec = {"tool": tool, "encoding": encoding, "calls": calls, "cpu": 0,
                    "story_file": story_file}
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                                   json.dumps(spec)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{tool} failed:\n{proc.stderr[-3000:]}")
            run = json.loads(proc.stdout.strip().splitlines()[-1])
            runs[tool].append(run)
            print(f"  round {round_ + 1}/{repeat}, {tool}: " + ", ".join(
                f"{label} {us:.2f} µs" for label, us in run["us_per_call"].items()), flush=True)
    return runs


def report(runs: dict, encoding: str) -> list[dict]:
    reference = runs.get("tiktoken", [None])[0]
    labels = list(next(iter(runs.values()))[0]["us_per_call"])
    rows = []
    print(f"\n{encoding}: µs per call, median (min-max) of {len(next(iter(runs.values())))} "
          "fresh processes, each the best of 5 x --calls calls; pinned to one CPU")
    print(f"  {'tool':<11}" + "".join(f"{label:>22}" for label in labels) + "  ids")
    for tool, tool_runs in runs.items():
        cells = []
        row = {"tool": tool, "api": tool_runs[0]["api"]}
        for label in labels:
            values = [r["us_per_call"][label] for r in tool_runs]
            row[label] = {"median": statistics.median(values), "min": min(values),
                          "max": max(values)}
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        exact = reference is None or all(r["ids"] == reference["ids"] for r in tool_runs)
        row["exact"] = exact
        rows.append(row)
        print(f"  {tool:<11}" + "".join(f"{c:>22}" for c in cells) +
              f"  {'exact' if exact else 'DIFFER'}")
    print("\nCalls:")
    for row in rows:
        print(f"  {row['tool']:<11}{row['api']}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", "--encoding", dest="encoding", default="gpt2",
                        choices=bench_peers.ENCODINGS)
    parser.add_argument("--tools", default=",".join(DEFAULT_TOOLS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--story-file", help="the long text is its first 843 bytes "
                        "(default: the shared tinystories_real.txt)")
    parser.add_argument("--json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0
    tools = [t for t in args.tools.split(",") if t]
    if "tiktoken" not in tools:
        tools.append("tiktoken")  # the reference ids
    unknown = [t for t in tools if t not in bench_peers.BUILDERS]
    if unknown:
        parser.error(f"unknown tools {unknown}; choose from {sorted(bench_peers.BUILDERS)}")
    missing = [t for t in tools if not bench_peers.tool_available(t)]
    if missing:
        parser.error(f"not installed: {missing} (pip install -e '.[bench]')")
    runs = measure(tools, args.encoding, args.repeat, args.calls,
                   args.story_file or default_story_file())
    rows = report(runs, args.encoding)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"encoding": args.encoding, "calls": args.calls, "runs": runs, "rows": rows},
                      f, indent=1)
        print(f"numbers written to {args.json}")
    return 0 if all(row["exact"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
