"""Variants of the GPT-2 encode loop against the loop as it is, in one process, in paired rounds.

    python scripts/encode_variants.py [CORPUS ...] [--variants NAME ...] [--rounds 20]
        [--json out.json]

A variant is the source of the loop's functions (`FUNCTIONS`) with some lines replaced, compiled
beside an unchanged copy (`baseline`, compiled the same way, not loaded from the cache); one that
needs more of the thread's scratch space says how much (`scratch_extra`). Every round encodes the
corpus's documents in one `encode_utf8` call with each variant in turn, each paired with a pass
of baseline made just before or after it (the order alternating):
cold (the cache started again from the vocab table, the thread's part cache emptied, as in a fresh
tokenizer), then warm (the same call again). A ratio is a variant's time over its paired
baseline's, so the machine's slow and fast phases (a factor of two here, over seconds) cancel;
the median ratio and its range over the rounds are reported. Each variant must give baseline's
ids.

`VARIANTS` holds what was tried (PERFORMANCE.md's "What moved encoding, and what did not"
quotes the results); a new idea is a new entry. A variant whose lines are no longer in the
source says so rather than measuring something else.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# The functions a variant may change, compiled anew for each variant in this order (each one
# sees the ones before it), in a copy of nbbpe.encode's namespace.
FUNCTIONS = ("copy_short_ids", "store", "_key_and_prefetch", "_encode_new", "_encode_new_merges",
             "encode_documents")
TABLE_FUNCTIONS = ("copy_short_ids", "store")  # of nbbpe.encode_tables; the others, nbbpe.encode

_WINDOW_LOOP = """                for t in range(n):
                    j = window[t]
"""

_WINDOW_ARRAYS = """    window = scratch[:WINDOW]
    keys0 = scratch[WINDOW : 2 * WINDOW]
    keys1 = scratch[2 * WINDOW : 3 * WINDOW]
    tags = scratch[3 * WINDOW : 4 * WINDOW]
    hashes = scratch[4 * WINDOW : 5 * WINDOW]
"""

# `window_records` (a window's keys, tags and hashes in one array) and `fused_scan` (each
# pre-token keyed and its slot prefetched as the scanner finds it: kept, see
# `encode._key_and_prefetch`) patched a `_prepare_window` that is gone; git has them.
VARIANTS = {
    "baseline": {"about": "the loop as it is", "replace": {}},
    "no_prefetch": {
        "about": "no prefetch of the window's cache slots",
        "replace": {"_key_and_prefetch": [("        prefetch(cache.slots, 4 * home(cache, h))\n", ""),
                                          ("        prefetch(cache.slots, 4 * home(cache, h))\n", "")]},
    },
    "prefetch_16_ahead": {
        "about": "each slot prefetched 16 pre-tokens before its lookup, not the whole window first",
        "replace": {
            "_key_and_prefetch": [
                ("    tags[uindex(t)] = 0\n", "    tags[uindex(t)] = 0\n    hashes[uindex(t)] = 0\n"),
                ("        hashes[uindex(t)] = np.int64(h)\n        prefetch(cache.slots, 4 * home(cache, h))\n    elif",
                 "        hashes[uindex(t)] = np.int64(h)\n        if t < 16:\n"
                 "            prefetch(cache.slots, 4 * home(cache, h))\n    elif")],
            "encode_documents": [
                (_WINDOW_LOOP, _WINDOW_LOOP.replace(
                    "                    j = window[t]\n",
                    "                    ahead = min(t + 16, n - 1)\n"
                    "                    prefetch(cache.slots, 4 * home(cache, np.uint64(hashes[ahead])))\n"
                    "                    j = window[t]\n"))]},
    },
    "prefetch_nta": {
        "about": "the window's cache slots prefetched non-temporally (prefetchnta), so that the "
                 "lookups' lines do not push the merge loop's rank tables out of L2",
        "names": {"prefetch": lambda: _prefetch(0)},
        "replace": {},
    },
    "prefetch_l2": {
        "about": "the window's cache slots prefetched with locality 2 (prefetcht1)",
        "names": {"prefetch": lambda: _prefetch(2)},
        "replace": {},
    },
    "window_128": {
        "about": "windows of at most 64 pre-tokens (128 - a block), not 192",
        "replace": {"encode_documents": [("    window = scratch[:WINDOW]\n", "    window = scratch[:128]\n")]},
    },
    "window_1024": {
        "about": "windows of at most 960 pre-tokens (1024 - a block), not 192",
        "scratch_extra": 5 * 1024,  # their arrays after the thread's scratch space
        "replace": {"encode_documents": [(_WINDOW_ARRAYS, """    far = scratch.shape[0] - 5 * 1024
    window = scratch[far : far + 1024]
    keys0 = scratch[far + 1024 : far + 2048]
    keys1 = scratch[far + 2048 : far + 3072]
    tags = scratch[far + 3072 : far + 4096]
    hashes = scratch[far + 4096 : far + 5120]
""")]},
    },
    "prefetch_next_slot": {
        "about": "the slot after each home prefetched too (on the next line when the home is the "
                 "second slot of its line: 6% of web_5M's lookups of 2 to 16 bytes go on there)",
        "replace": {"_key_and_prefetch": [
            ("        prefetch(cache.slots, 4 * home(cache, h))\n",
             "        prefetch(cache.slots, 4 * home(cache, h))\n"
             "        prefetch(cache.slots, 4 * home(cache, h) + 4)\n")]},
    },
    "plain_slot_loads": {
        "about": "a slot's key and ids read with plain loads, not ordered after its meta (load_after)",
        "replace": {"copy_short_ids": [
            ("load_after(slots, 4 * s, meta)", "slots[uindex(4 * s)]"),
            ("load_after(slots, 4 * s + 1, meta)", "slots[uindex(4 * s + 1)]"),
            ("load_after(slots, 4 * s + 3, meta)", "slots[uindex(4 * s + 3)]")]},
    },
    "no_entry_count": {
        "about": "no count of the cache's entries (each thread adds its own ENTRY_BATCH at a time)",
        "replace": {"_encode_new": [("        count_entry(cache, own)\n",
                                     "        pass  # not counted\n")]},
    },
}


def _prefetch(locality: int):
    """`encode_tables.prefetch` with another locality hint (imported here: Numba loads with it)."""
    from nbbpe.encode_tables import prefetch_with_locality

    return prefetch_with_locality(locality)


def _source(function) -> str:
    """The source of a compiled function, to be compiled again: not cached (its copy in the
    cache belongs to the original)."""
    return inspect.getsource(function.py_func).replace("cache=True, ", "")


def patched_sources(variant: dict) -> dict[str, str]:
    """The sources of `FUNCTIONS` with the variant's replacements made; raises ValueError naming
    a replacement whose lines are not (or no longer) in the source."""
    from nbbpe import encode, encode_tables

    sources = {}
    for name in FUNCTIONS:
        module = encode_tables if name in TABLE_FUNCTIONS else encode
        source = _source(getattr(module, name))
        for old, new in variant["replace"].get(name, []):
            if old not in source:
                raise ValueError(f"{name} no longer holds the lines this variant replaces: {old!r}")
            source = source.replace(old, new, 1)
        sources[name] = source
    return sources


def build_kernel(variant: dict):
    """The GPT-2 MERGES encode kernel (as `encode.encode_gpt2_merges`) with the variant's
    changes, uncompiled."""
    from nbbpe import encode, encode_tables

    namespace = dict(vars(encode))
    tables = dict(vars(encode_tables))
    for name, make in variant.get("names", {}).items():  # globals the variant's lines use
        namespace[name] = tables[name] = make()
    for name, source in patched_sources(variant).items():
        into = tables if name in TABLE_FUNCTIONS else namespace
        exec(compile(source, f"<variant {name}>", "exec"), into)
        if into is tables:
            namespace[name] = tables[name]
    # the kernel itself, as written in nbbpe.encode, over the functions above
    exec(compile(_source(encode.encode_gpt2_merges), "<variant kernel>", "exec"), namespace)
    return namespace["encode_gpt2_merges"]


def compare(corpus: str, kernels: dict, rounds: int) -> dict:
    """Paired rounds of every variant's kernel in `kernels` (baseline first) on `corpus`."""
    import numpy as np

    import bench_peers
    from bench_encode import documents
    from nbbpe import Tokenizer, encode

    extra = max(VARIANTS[name].get("scratch_extra", 0) for name in kernels)
    if extra:  # each thread's scratch space, longer (the loop as it is uses its start only)
        plain = encode.new_scratch
        encode.new_scratch = lambda: np.concatenate([plain(), np.zeros(extra, dtype=np.int64)])
    tok = Tokenizer.from_files(bench_peers.GPT2_VOCAB, bench_peers.GPT2_MERGES, [bench_peers.EOT])
    tok.encode("compiled and loaded")
    tables = tok._get_engine().documents.tables
    encoders = {name: encode.DocumentEncoder(kernel, *tables, tok.n_vocab)
                for name, kernel in kernels.items()}
    names = list(kernels)
    docs = list(documents(corpus))
    buf = np.frombuffer(b"".join(docs), dtype=np.uint8)
    ends = np.cumsum([len(d) for d in docs], dtype=np.int64)
    out_ends = np.empty(len(ends), dtype=np.int64)
    state = tok._thread_state()
    cache = state.cache
    parts = slice(5 * encode.WINDOW, 5 * encode.WINDOW + encode.PART_CACHE_ITEMS)

    def cold_start():  # as a fresh tokenizer: the vocab table, no parts
        cache.table = cache._fresh()
        state.scratch[parts] = 0

    expected = None
    for name, encoder in encoders.items():  # compiled, and checked
        cold_start()
        ids = encoder.encode(buf, ends, -1, state, out_ends, np.int32)
        expected = ids if expected is None else expected
        if not np.array_equal(ids, expected):
            raise SystemExit(f"variant {name} gives other ids than baseline")
    def timed(name):  # (cold seconds, warm seconds)
        cold_start()
        t0 = time.perf_counter()
        encoders[name].encode(buf, ends, -1, state, out_ends, np.int32)
        t1 = time.perf_counter()
        encoders[name].encode(buf, ends, -1, state, out_ends, np.int32)
        return t1 - t0, time.perf_counter() - t1

    # Each variant's passes are paired with baseline's made just before or after them (the
    # order alternating), so that a ratio compares passes a few tens of milliseconds apart.
    times = {name: {"cold": [], "warm": []} for name in names}
    ratios = {name: {"cold": [], "warm": []} for name in names}
    others = names[1:] or names
    for r in range(rounds):
        for k, name in enumerate(others if r % 2 == 0 else others[::-1]):
            pair = ("baseline", name) if (r + k) % 2 == 0 else (name, "baseline")
            measured = dict(zip(pair, map(timed, pair)))
            for j, kind in enumerate(("cold", "warm")):
                for who in pair:
                    times[who][kind].append(measured[who][j])
                ratios[name][kind].append(measured[name][j] / measured["baseline"][j])
    result = {}
    for name in names:
        row = {}
        for kind in ("cold", "warm"):
            paired = ratios[name][kind] if name != "baseline" else [1.0]
            row[kind] = {"median_ms": 1e3 * statistics.median(times[name][kind]),
                         "ratio": statistics.median(paired), "ratio_range": [min(paired), max(paired)],
                         "seconds": times[name][kind]}
        result[name] = row
    return result


def main(argv: list[str] | None = None) -> int:
    from bench_encode import default_corpora

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpora", nargs="*", default=None)
    parser.add_argument("--variants", nargs="+", default=[n for n in VARIANTS if n != "baseline"],
                        choices=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    names = ["baseline"] + [n for n in args.variants if n != "baseline"]
    for name in names:
        try:
            patched_sources(VARIANTS[name])
        except ValueError as error:
            print(f"variant {name}: {error}", file=sys.stderr)
            return 2
    kernels = {name: build_kernel(VARIANTS[name]) for name in names}  # compiled on first use
    results = {}
    print("corpus                 variant              cold ms  cold / baseline       warm ms  "
          "warm / baseline")
    for corpus in args.corpora or default_corpora():
        results[corpus] = compare(corpus, kernels, args.rounds)
        for name, row in results[corpus].items():
            cold, warm = row["cold"], row["warm"]
            print(f"{os.path.basename(corpus):22s} {name:20s} {cold['median_ms']:7.2f}  "
                  f"{cold['ratio']:.3f} ({cold['ratio_range'][0]:.2f}-{cold['ratio_range'][1]:.2f})  "
                  f"{warm['median_ms']:7.2f}  "
                  f"{warm['ratio']:.3f} ({warm['ratio_range'][0]:.2f}-{warm['ratio_range'][1]:.2f})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"variants": {n: VARIANTS[n]["about"] for n in names}, "results": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
