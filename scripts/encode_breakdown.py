"""Where nbbpe's encoding time goes: finding pre-tokens, looking them up, merging new ones.

    python scripts/encode_breakdown.py [CORPUS ...] [--pattern gpt2 cl100k o200k] [--repeat 3]
        [--json out.json]

For each corpus (by default the three shared ones: web_5M.txt, multi_1M.txt,
tinystories_real.txt; its documents are the text between `<|endoftext|>` lines) and encoding,
on one thread, `--repeat` times with a freshly built tokenizer (GPT-2's files, or the cl100k_base
/ o200k_base rank files, as in bench_encode.py):

- scan: the family's compiled scanner alone finding every pre-token of the documents (the
  `<family>_spans` kernel, as bench_pretok.py times it);
- cold: `Tokenizer.encode_utf8` of all the documents in one call, the cache empty but for the
  vocab (every new pre-token is merged once), after a call on as many one-byte pre-tokens (which
  pages in the output buffer, so page faults are not counted as merging);
- warm: the same call again (every pre-token is found in the cache);
- learned: how many pre-tokens the cold call merged (the entries the cache gained), and
  learned_warm, how many the warm call did (0: it only looked up), and whether both gave the
  same ids;
- two at once: the CPU time of the warm call made by two threads at the same time (each on its
  own thread state, sharing the cache), over its CPU time made alone. 1.00 means two threads
  cost each other nothing; above it, each call waits on what the other uses too (the caches,
  the memory). Thread CPU time, not wall time: a machine that is slower for a moment, or a
  thread not scheduled, does not count. Medians of 5 alternations of the two in each round.

- alone: the merge loop alone (`_merge_rounds`, or `_merge_leftmost` for rank files) on each
  new pre-token once, back to back, outside the pass: its bytes to ids in parts as the pass
  merges them (`encode.merge_in_parts`), nothing looked up or stored but in the part cache,
  empty at the start of each pass, as in a fresh tokenizer. The pre-tokens are those
  of the corpus that are not tokens and that the scanner, given one alone, finds whole (nearly
  all), and their ids are checked against `encode_utf8`'s. Then the same by length (2-16,
  17-32, 33-64, 65-256 bytes): how many, and their share of the time.

Derived, as medians over the repeats (ranges in brackets): lookups = warm - scan (looking the
pre-tokens up and writing their ids out), merging = cold - warm, and merging / learned, what a
new pre-token costs in the pass, next to what merging one costs alone (the gap is what the pass
adds: the miss and the store).
PERFORMANCE.md quotes these figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_peers  # noqa: E402
from bench_encode import default_corpora, documents  # noqa: E402

from numba import njit  # noqa: E402

from nbbpe import Tokenizer, encode, patterns  # noqa: E402
from nbbpe.encode_tables import entries_in  # noqa: E402
from nbbpe.scanners import cl100k, gpt2, o200k  # noqa: E402

SPANS = {"gpt2": (gpt2.gpt2_spans, gpt2.class_table), "cl100k": (cl100k.cl100k_spans, cl100k.class_table),
         "o200k": (o200k.o200k_spans, o200k.class_table)}


def tokenizer(encoding: str) -> Tokenizer:
    if encoding == "gpt2":
        return Tokenizer.from_files(bench_peers.GPT2_VOCAB, bench_peers.GPT2_MERGES, [bench_peers.EOT])
    pattern = patterns.CL100K_PATTERN if encoding == "cl100k" else patterns.O200K_PATTERN
    return Tokenizer.from_tiktoken_file(bench_peers.tiktoken_file(encoding), pattern)


def packed(pieces: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(the pieces end to end as uint8, int64 offsets): piece k is buf[offsets[k]:offsets[k+1]]."""
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in pieces], out=offsets[1:])
    return np.frombuffer(b"".join(pieces), dtype=np.uint8), offsets


class NewPretokens:
    """The distinct pre-tokens of `data` (documents ending at `ends`) of 2 to `_HEAP_ABOVE`
    bytes that are not tokens, and that the scanner finds whole when given one alone (so that
    `encode_utf8` of each, as a document, is the reference for merging it): bytes `buf`, piece k
    at buf[offsets[k]:offsets[k + 1]]."""

    def __init__(self, encoding: str, tok: Tokenizer, data: bytes, ends: np.ndarray,
                 starts: np.ndarray, stops: np.ndarray):
        buf = np.frombuffer(data, dtype=np.uint8)
        spans, class_table = SPANS[encoding]
        doc_starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        found = spans(buf, class_table(), doc_starts, ends, starts, stops)
        tokens = set(tok.vocab.values())
        pieces = {data[a:b] for a, b in zip(starts[:found].tolist(), stops[:found].tolist())
                  if 2 <= b - a <= encode._HEAP_ABOVE}
        pieces = sorted(pieces - tokens)
        joined, offsets = packed(pieces)
        found = spans(joined, class_table(), offsets[:-1], offsets[1:], starts, stops)
        per_piece = np.bincount(np.searchsorted(offsets, starts[:found], side="right") - 1,
                                minlength=len(pieces))
        whole = [p for p, n in zip(pieces, per_piece.tolist()) if n == 1]
        self.buf, self.offsets = packed(whole)
        self.count = len(whole)
        self.ids = tok.encode_utf8(self.buf, self.offsets[1:], dtype=np.int32)[0]


@njit(_nrt=False)  # as the encode kernels: no reference counting of `ranks`' arrays per piece
def merge_each(buf, offsets, ranks, merge, out, scratch, parts):
    """Merge each piece buf[offsets[k]:offsets[k + 1]] from its bytes as the pass merges a new
    pre-token (`encode.merge_in_parts`, with the part cache `parts`, emptied first), its ids
    written to `out` one piece after the other; return how many ids in all."""
    parts[:] = 0
    w = 0
    for k in range(offsets.shape[0] - 1):
        w += encode.merge_in_parts(merge, buf, offsets[k], offsets[k + 1], out, w, ranks, scratch,
                                   parts)
    return w


LENGTHS = ((2, 16), (17, 32), (33, 64), (65, encode._HEAP_ABOVE))  # bytes, for `by_length`


def merge_alone(tok: Tokenizer, buf: np.ndarray, offsets: np.ndarray) -> tuple[float, np.ndarray]:
    """(seconds to merge every piece buf[offsets[k]:offsets[k + 1]] once with `tok`'s merge loop,
    their ids). One untimed call first: compiled, and the tables in the caches as the timed call
    finds them after its first pieces."""
    ranks = tok._get_engine().ranks
    merge = encode._merge_rounds if ranks.mode == encode.MERGES else encode._merge_leftmost
    out = np.empty(len(buf) + 1 + encode.SPARE_IDS, dtype=np.int32)
    scratch = np.empty(encode._heap_space.py_func(encode._HEAP_ABOVE), dtype=np.int64)
    parts = np.zeros(encode.PART_CACHE_ITEMS, dtype=np.int64)
    merge_each(buf, offsets, ranks, merge, out, scratch, parts)
    t0 = time.perf_counter()
    n = merge_each(buf, offsets, ranks, merge, out, scratch, parts)
    return time.perf_counter() - t0, out[:n]


def by_length(tok: Tokenizer, new: NewPretokens) -> dict:
    """For each range of `LENGTHS`: how many of `new` are that long, and the seconds the merge
    loop takes on them alone (the loop's cost grows with the square of the length)."""
    lengths = np.diff(new.offsets)
    result = {}
    for lo, hi in LENGTHS:
        pick = np.flatnonzero((lengths >= lo) & (lengths <= hi))
        pieces = [new.buf[new.offsets[k] : new.offsets[k + 1]].tobytes() for k in pick.tolist()]
        seconds = 0.0
        if pieces:
            seconds, _ = merge_alone(tok, *packed(pieces))
        result[f"{lo}-{hi}"] = {"pretokens": len(pieces), "seconds": seconds}
    return result


def measure(encoding: str, data: bytes, ends: np.ndarray, starts: np.ndarray,
            stops: np.ndarray, new: NewPretokens) -> dict:
    """One round: scan, cold and warm seconds and pre-tokens learned, with a fresh tokenizer,
    and the merge loop alone on `new`; `starts` and `stops` hold one item per byte, paged in."""
    buf = np.frombuffer(data, dtype=np.uint8)
    spans, class_table = SPANS[encoding]
    doc_starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    spans(buf, class_table(), doc_starts[:1], ends[:1], starts, stops)  # loaded, not timed
    t0 = time.perf_counter()
    found = spans(buf, class_table(), doc_starts, ends, starts, stops)
    scan = time.perf_counter() - t0

    tok = tokenizer(encoding)
    # Build the tables, load the kernels, and page in the output buffer the calls below reuse,
    # with one-byte pre-tokens only (none is learned), so the cold call's time is no page faults.
    tok.encode_utf8(b"a1" * (len(buf) // 2 + 1))
    cache = tok._get_engine().cache
    before = entries_in(cache.table)
    t0 = time.perf_counter()
    cold_ids = tok.encode_utf8(buf, ends)
    cold = time.perf_counter() - t0
    if cache.table.fill[2]:  # it reached `cache_size` and started again: "learned" would be wrong
        raise SystemExit(f"the cache was emptied while encoding {encoding}: use a smaller corpus")
    learned = entries_in(cache.table) - before  # a grown table keeps its entries
    t0 = time.perf_counter()
    warm_ids = tok.encode_utf8(buf, ends)
    warm = time.perf_counter() - t0
    # What makes warm - scan the lookups alone: the warm call merged nothing new, same ids.
    learned_warm = entries_in(cache.table) - before - learned
    alone, together, both_ids = cpu_alone_and_two_at_once(tok, buf, ends)
    merge_s, ids_alone = merge_alone(tok, new.buf, new.offsets)
    return {"scan_s": scan, "cold_s": cold, "warm_s": warm, "learned": learned,
            "merge_alone_s": merge_s, "merged_alone": new.count,
            "same_ids_alone": bool(np.array_equal(ids_alone, new.ids)),
            "merge_alone_by_length": by_length(tok, new),
            "learned_warm": learned_warm, "same_ids": all(map(np.array_equal, cold_ids, warm_ids)),
            "pretokens": int(found), "cpu_alone_s": alone, "cpu_two_at_once_s": together,
            "same_ids_two_at_once": all(all(map(np.array_equal, ids, warm_ids))
                                        for ids in both_ids)}


def cpu_alone_and_two_at_once(tok: Tokenizer, buf: np.ndarray, ends: np.ndarray, pairs: int = 5):
    """(CPU seconds of a warm `encode_utf8(buf, ends)` on one thread alone, the CPU seconds of
    the same call made by two threads at once, the ids each of the two gave): medians of
    `pairs` alternations of the two (a single pair moved from 0.69 to 1.72x between rounds,
    and from 1.09 to 1.63 within one run on web_5M; medians of 5 gave 0.95-1.03 on web_5M and
    0.94-0.96 on TinyStories, 3 rounds each, on 2026-11-29). Each thread has made the call
    once before (its thread state and output buffer exist, paged in)."""
    def call(start: threading.Barrier | None):
        if start is not None:
            start.wait()  # both begin together
        t0 = time.thread_time()
        ids = tok.encode_utf8(buf, ends)
        return time.thread_time() - t0, ids

    alone, together = [], []
    with ThreadPoolExecutor(2) as pool:
        for _ in range(2):  # untimed: each thread's first call
            warm_up = threading.Barrier(2)
            [f.result() for f in [pool.submit(call, warm_up) for _ in range(2)]]
        for _ in range(pairs):
            alone.append(pool.submit(call, None).result()[0])
            start = threading.Barrier(2)
            both = [f.result() for f in [pool.submit(call, start) for _ in range(2)]]
            together.append(statistics.mean(t for t, _ in both))
    return statistics.median(alone), statistics.median(together), [ids for _, ids in both]


def spread(values: list[float]) -> dict:
    """Median, min and max of `values`, as the JSON and `show` hold them."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(rounds: list[dict]) -> dict:
    per = {
        "scan_ms": [r["scan_s"] * 1e3 for r in rounds],
        "lookups_ms": [(r["warm_s"] - r["scan_s"]) * 1e3 for r in rounds],
        "merging_ms": [(r["cold_s"] - r["warm_s"]) * 1e3 for r in rounds],
        "cold_ms": [r["cold_s"] * 1e3 for r in rounds],
        "us_per_merged": [(r["cold_s"] - r["warm_s"]) * 1e6 / max(r["learned"], 1) for r in rounds],
        "us_per_merged_alone": [r["merge_alone_s"] * 1e6 / max(r["merged_alone"], 1)
                                for r in rounds],
        "ns_per_pretoken_warm": [r["warm_s"] * 1e9 / max(r["pretokens"], 1) for r in rounds],
        "two_at_once": [r["cpu_two_at_once_s"] / r["cpu_alone_s"] for r in rounds],
    }
    out = {name: spread(values) for name, values in per.items()}
    out["alone_by_length"] = {
        span: {"pretokens": rounds[0]["merge_alone_by_length"][span]["pretokens"],
               "share": spread([r["merge_alone_by_length"][span]["seconds"]
                                / sum(v["seconds"] for v in r["merge_alone_by_length"].values())
                                for r in rounds])}
        for span in rounds[0]["merge_alone_by_length"]}
    out["learned"] = rounds[0]["learned"]
    out["pretokens"] = rounds[0]["pretokens"]
    return out


def show(value: dict, digits: int = 1) -> str:
    return f"{value['median']:.{digits}f} ({value['min']:.{digits}f}-{value['max']:.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpora", nargs="*", default=None)
    parser.add_argument("--pattern", nargs="+", default=["gpt2", "cl100k", "o200k"],
                        choices=["gpt2", "cl100k", "o200k"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    corpora = args.corpora or default_corpora()
    results: dict = {}
    print("encoding   corpus                 scan ms         lookups ms      merging ms      "
          "cold ms         us/merged      us/merged alone  ns/pre-token warm  two at once        "
          "learned")
    for path in corpora:
        docs = list(documents(path))
        data = b"".join(docs)
        ends = np.cumsum([len(d) for d in docs], dtype=np.int64)
        starts = np.ones(len(data) + 1, dtype=np.int64)
        stops = np.ones(len(data) + 1, dtype=np.int64)
        for encoding in args.pattern:
            new = NewPretokens(encoding, tokenizer(encoding), data, ends, starts, stops)
            rounds = [measure(encoding, data, ends, starts, stops, new)
                      for _ in range(args.repeat)]
            row = summarize(rounds)
            results.setdefault(path, {})[encoding] = {"rounds": rounds, **row}
            print(f"{encoding:10s} {os.path.basename(path):22s} {show(row['scan_ms']):15s} "
                  f"{show(row['lookups_ms']):15s} {show(row['merging_ms']):15s} "
                  f"{show(row['cold_ms']):15s} {show(row['us_per_merged'], 2):14s} "
                  f"{show(row['us_per_merged_alone'], 2):16s} "
                  f"{show(row['ns_per_pretoken_warm']):18s} {show(row['two_at_once'], 2):18s} "
                  f"{row['learned']:,}")
            print("           merged alone, by length: " + ", ".join(
                f"{span} bytes {v['pretokens']:,} ({show(v['share'], 2)} of the time)"
                for span, v in row["alone_by_length"].items()))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
