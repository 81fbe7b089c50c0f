"""Where a 2-thread batch's time goes, and what bounds it: diagnostics for `encode_batch`.

    python scripts/batch_threads.py [CORPUS ...] [--what timeline,bound,ceiling,halves,idle,steady,faults]
        [--runs 8] [--sleep 2] [--batches 15] [--split 0.5] [--json out.json]

Every run is a fresh process, as in bench_encode.py: GPT-2's files, the tool built and warmed up
(a small batch, or one call per warm-up text), the corpus's documents read (its `<|endoftext|>`
lines cut it), then timed at once. Default corpora: the shared web_5M, multi_1M, TinyStories.

- timeline: one `encode_batch_to_numpy(docs, num_threads=2)`, each thread's groups timed (the
  tokenizer's `_encode_pieces` and `_encode_cut_pieces` wrapped): when the first group started,
  each thread's time in its groups (wall and thread CPU), its time between and after them (handing
  ids over, waiting for the GIL, not scheduled), and how many 2 MB page faults and compaction
  stalls `/proc/vmstat` counted meanwhile (the whole system's). Per run, then medians.
- bound: an upper bound for a batch with no Python between its groups. The documents' UTF-8 is
  made beforehand and cut, at a place where a cut cannot change the ids, into two halves of about
  equal bytes; each half is one `encode_utf8` call on a thread of its own (the threads' states
  made and buffers written beforehand), both released together: the wall time from the first
  start to the last end, and each half's. Against one call per document on one thread, pinned,
  in the same number of fresh processes, alternated. The halves' ids, joined, must equal one
  call per document's (the run fails otherwise). Also each half's page faults (its thread's).
- ceiling: what a batch of one kernel call per thread could take at best, against one call per
  document on one thread (alternated fresh processes). The two parts of the UTF-8 of `bound`,
  cut at `--split` of the characters (0.5: halves), each one `encode_utf8` call on a thread of its
  own into that thread's output buffer, every page of which was written beforehand (no page
  fault, no copy), then its ids cast into one fresh uint16 result (small pages, as a batch's),
  the second part's at its first byte's place (an upper bound: the same number of fresh pages);
  both released together. No planning, no Python between calls, no hand-off: the wall time from
  the first start to the last end. Also each part's time, kernel time and page faults, and
  "balanced": the mean of the two parts' times, what an even split would take were time linear
  in the cut. The ids, joined, must equal one call per document's (the run fails otherwise).
- halves: the same two halves one after the other, each alone on a thread of its own, the
  second on the first one's CPU or on the other CPU (alternated fresh processes): each half's
  time and page faults. What a fresh process pays once, whichever thread runs first, the
  second half does not pay, on either CPU; two halves at once (bound) each pay it.
- idle: one call per document on one thread, pinned, right after reading the documents and after
  `--sleep` seconds of sleep, for nbbpe and gigatoken (if installed), alternated: on this
  project's VM, memory not touched for a while is slower to touch again, for every tool.
- steady: `--batches` 2-thread batches of the corpus one after another in one process, as a user
  encoding batch after batch runs them: the first (cold caches, as the bench times it), and the
  median of the others (every pre-token in the cache, the memory warm); and the page faults of
  each (the process's minor faults: fresh memory's pages, as the ids are written into a result
  that did not get memory an earlier one let go of). Then as many passes of one call per
  document on one thread, warm too (the median of all but the first; the documents' strs are
  the same, so a text that is not ASCII has its UTF-8 kept in it by CPython after the first),
  and the batches' speed-up over them.
- faults: one pass over the documents as bench_encode.py times it, in alternated fresh processes:
  one call per document on one thread, pinned (the ids kept, as the bench keeps them), one batch
  with num_threads=1, pinned, and one with num_threads=2: milliseconds, and the process's minor
  page faults during the pass (fresh memory's pages: the ids of one call per document may take
  memory malloc got back from the documents' bytes, a batch's result is a block of its own).

Linux only (CPU pinning, /proc/vmstat). PERFORMANCE.md quotes these figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_peers  # noqa: E402
from bench_encode import default_corpora, documents  # noqa: E402

WHATS = ("timeline", "bound", "ceiling", "halves", "idle", "steady", "faults")
FAULT_KINDS = {"doc": "one call per document, one thread", "batch1": "one batch, num_threads=1",
               "batch2": "one batch, num_threads=2"}
_VMSTAT = ("thp_fault_alloc", "compact_stall")


def vmstat() -> dict:
    counts = {}
    with open("/proc/vmstat") as f:
        for line in f:
            name, value = line.split()
            if name in _VMSTAT:
                counts[name] = int(value)
    return counts


def build(tool: str, threads: int):
    """A fresh tool, warmed up as bench_encode.py warms it for `threads`; for nbbpe also the
    `Tokenizer`."""
    encoder = bench_peers.build(tool, "gpt2", threads)
    # nbbpe's one-text call is the Tokenizer's bound method until the warm-up replaces it
    tokenizer = encoder.one.__self__ if tool == "nbbpe" else None
    if threads == 1:
        for text in bench_peers.WARM_UP:
            encoder.one(text)
    else:
        encoder.batch(bench_peers.WARM_UP)
    encoder.warmed_up()
    return encoder, tokenizer


def per_document(tool: str, corpus: str, sleep: float = 0.0) -> dict:
    os.sched_setaffinity(0, {0})
    encoder, _ = build(tool, 1)
    docs = [d.decode() for d in documents(corpus)]
    if sleep:
        time.sleep(sleep)
    return {"ms": one_call_per_document_ms(encoder.one, docs)}


def one_call_per_document_ms(one, docs) -> float:
    """Milliseconds for one(doc) of each document in turn."""
    t0 = time.perf_counter()
    for doc in docs:
        one(doc)
    return (time.perf_counter() - t0) * 1e3


def timeline(corpus: str) -> dict:
    """One 2-thread batch with each thread's groups timed."""
    from nbbpe import tokenizer as tokenizer_module

    os.sched_setaffinity(0, {0, 1})
    encoder, tok = build("nbbpe", 2)
    docs = [d.decode() for d in documents(corpus)]
    groups: dict[int, list] = {}

    def timed(method):
        def call(self, pieces, dtype):
            t0, c0 = time.perf_counter(), time.thread_time()
            result = method(self, pieces, dtype)
            groups.setdefault(threading.get_ident(), []).append(
                (t0, time.perf_counter(), time.thread_time() - c0))
            return result
        return call

    cls = tokenizer_module.Tokenizer
    for name in ("_encode_pieces", "_encode_cut_pieces"):
        setattr(tok, name, timed(getattr(cls, name)).__get__(tok))
    main = threading.get_ident()
    before = vmstat()
    t0 = time.perf_counter()
    tok.encode_batch_to_numpy(docs, num_threads=2)
    t1 = time.perf_counter()
    after = vmstat()
    threads = {}
    for ident, spans in groups.items():
        inside = sum(end - start for start, end, _ in spans)
        threads["calling" if ident == main else "pool"] = {
            "groups": len(spans),
            "first_ms": (spans[0][0] - t0) * 1e3,
            "in_groups_ms": inside * 1e3,
            "cpu_in_groups_ms": sum(cpu for _, _, cpu in spans) * 1e3,
            "outside_groups_ms": ((t1 - spans[0][0]) - inside) * 1e3,
            "done_ms": (spans[-1][1] - t0) * 1e3}
    return {"ms": (t1 - t0) * 1e3, "threads": threads,
            "vmstat": {k: after[k] - before[k] for k in before}}


def halves_of(tok, docs: list[str], split: float = 0.5) -> list[tuple]:
    """The documents' UTF-8 in two parts, the first of about `split` of the characters (0.5:
    halves), each (bytes, where its documents end) for `encode_utf8`: the document that holds the
    cut is cut where its ids cannot change."""
    from nbbpe.corpus import safe_text_cut

    goal = int(sum(map(len, docs)) * split)
    halves: list[list[str]] = [[], []]
    seen = 0
    for doc in docs:
        if not halves[1] and seen + len(doc) > goal:
            at = safe_text_cut(doc, goal - seen, tok.special_tokens, pattern=tok.pattern)
            at = len(doc) if at is None else at
            halves[0].append(doc[:at])
            halves[1].append(doc[at:])
        else:
            halves[1 if halves[1] else 0].append(doc)
        seen += len(doc)
    made = []
    for half in halves:
        data = [text.encode() for text in half]
        made.append((b"".join(data), np.cumsum([len(d) for d in data], dtype=np.int64)))
    return made


def tokenizer_and_halves(corpus: str, split: float = 0.5) -> tuple:
    """(nbbpe's Tokenizer, built and warmed up for 2 threads, the corpus's documents, their
    `halves_of`), this process on both CPUs."""
    os.sched_setaffinity(0, {0, 1})
    _, tok = build("nbbpe", 2)
    docs = [d.decode() for d in documents(corpus)]
    return tok, docs, halves_of(tok, docs, split)


def ready_thread(tok, cpu: int, out_items: int = 0) -> None:
    """This thread on `cpu`, with its state made and its group buffers written (its output
    buffer for at least `out_items` ids, every page of it)."""
    os.sched_setaffinity(0, {cpu})
    tok.encode_utf8(b"warm", None)
    state = tok._thread_state()
    state.ready_for_groups()
    if out_items:
        state.output(out_items)[:] = 0


def encode_half(tok, half: tuple, dtype=np.int32, into=None) -> tuple:
    """(ids, start, end of the call, end of the copy, page faults) of one `encode_utf8` call on
    a half (`halves_of`) in this thread, its ids as `dtype` (None: a view of the thread's output
    buffer), then copied to the front of `into`, if given: perf_counter times, and this
    thread's own minor faults over both."""
    import resource

    f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    t0 = time.perf_counter()
    ids = tok.encode_utf8(*half, dtype=dtype)[0]
    t1 = time.perf_counter()
    if into is not None:
        into[: len(ids)] = ids
    t2 = time.perf_counter()
    return ids, t0, t1, t2, resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0


def at_once(tok, run, out_items=(0, 0)) -> list:
    """[run(0), run(1)], each on a thread of its own made ready on CPU k (`ready_thread`, with
    `out_items[k]`), both released together."""
    start = threading.Barrier(2)
    results = [None, None]

    def part(k):
        ready_thread(tok, k, out_items[k])
        start.wait()
        results[k] = run(k)

    workers = [threading.Thread(target=part, args=(k,)) for k in (0, 1)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return results


def check_ids(tok, docs: list[str], parts: list, what: str) -> None:
    """Fail unless the ids of `parts`, joined, are one call per document's."""
    whole = np.concatenate([tok.encode_to_numpy(doc, np.int32) for doc in docs])
    if not np.array_equal(np.concatenate(parts), whole):
        raise AssertionError(f"the {what}' ids differ from one call per document's")


def bound(corpus: str) -> dict:
    """Two halves of the corpus's UTF-8, one `encode_utf8` call each, on two threads at once."""
    tok, docs, made = tokenizer_and_halves(corpus)
    done = at_once(tok, lambda k: encode_half(tok, made[k]))
    check_ids(tok, docs, [ids for ids, *_ in done], "halves")
    return {"ms": (max(t1 for _, _, t1, _, _ in done) - min(t0 for _, t0, *_ in done)) * 1e3,
            "halves_ms": [(t1 - t0) * 1e3 for _, t0, t1, _, _ in done],
            "halves_bytes": [len(made[k][0]) for k in (0, 1)],
            "halves_faults": [f for *_, f in done]}


def ceiling(corpus: str, split: float = 0.5) -> dict:
    """Two parts of the corpus's UTF-8 (`halves_of` at `split`), each one `encode_utf8` call into
    its thread's output buffer, written beforehand, then cast into one fresh uint16 result; both
    on two threads at once."""
    from nbbpe.tokenizer import _small_page_block

    tok, docs, made = tokenizer_and_halves(corpus, split)
    places = (0, len(made[0][0]))  # the second part's at its first byte's: an id a byte at most
    result = _small_page_block(2 * sum(len(data) for data, _ in made)).view(np.uint16)
    # each part's ids a view of its thread's output buffer (dtype None), every page written
    done = at_once(tok, lambda k: encode_half(tok, made[k], None, result[places[k]:]),
                   out_items=[len(data) + 1 for data, _ in made])
    counts = [len(ids) for ids, *_ in done]
    check_ids(tok, docs, [result[places[k] : places[k] + counts[k]] for k in (0, 1)], "parts")
    halves_ms = [(t2 - t0) * 1e3 for _, t0, _, t2, _ in done]
    return {"ms": (max(t2 for *_, t2, _ in done) - min(t0 for _, t0, *_ in done)) * 1e3,
            "halves_ms": halves_ms, "balanced_ms": sum(halves_ms) / 2,
            "kernel_ms": [(t1 - t0) * 1e3 for _, t0, t1, _, _ in done],
            "halves_bytes": [len(data) for data, _ in made],
            "halves_faults": [f for *_, f in done], "ids": sum(counts)}


def halves_in_turn(corpus: str, cpus: tuple[int, int]) -> dict:
    """The two halves of `bound` one after the other, each alone on a thread of its own pinned
    to its CPU of `cpus`: what each took and the page faults in it (its thread's own)."""
    tok, _, made = tokenizer_and_halves(corpus)
    ms, faulted = [0.0, 0.0], [0, 0]

    def half(k):
        ready_thread(tok, cpus[k])
        _, t0, t1, _, faulted[k] = encode_half(tok, made[k])
        ms[k] = (t1 - t0) * 1e3

    for k in (0, 1):
        worker = threading.Thread(target=half, args=(k,))
        worker.start()
        worker.join()
    return {"ms": sum(ms), "halves_ms": ms, "halves_faults": faulted}


def steady(corpus: str, batches: int) -> dict:
    """`batches` 2-thread batches of the corpus's documents, one after another."""
    import resource

    os.sched_setaffinity(0, {0, 1})
    _, tok = build("nbbpe", 2)
    docs = [d.decode() for d in documents(corpus)]
    times, faults = [], []
    for _ in range(batches):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        ids, offsets = tok.encode_batch_to_numpy(docs, num_threads=2)
        times.append((time.perf_counter() - t0) * 1e3)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        del ids, offsets  # let go of, as a user who writes each batch's ids out does
    # then one call per document on this one thread, as often
    passes = [one_call_per_document_ms(tok.encode_to_numpy, docs) for _ in range(batches)]
    return {"ms": times[0], "first_ms": times[0], "steady_ms": statistics.median(times[1:]),
            "batches": batches, "first_faults": faults[0],
            "steady_faults": statistics.median(faults[1:]),
            "one_thread_ms": statistics.median(passes[1:])}


def faults(kind: str, corpus: str) -> dict:
    """One pass of `kind` (`FAULT_KINDS`) over the documents, and the minor page faults in it."""
    import resource

    threads = 2 if kind == "batch2" else 1
    os.sched_setaffinity(0, {0, 1} if threads == 2 else {0})
    encoder, tok = build("nbbpe", threads)
    docs = [d.decode() for d in documents(corpus)]
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    if kind == "doc":
        kept = [encoder.one(doc) for doc in docs]
    else:
        kept = tok.encode_batch_to_numpy(docs, num_threads=threads)
    ms = (time.perf_counter() - t0) * 1e3
    faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    ids = sum(map(len, kept)) if kind == "doc" else len(kept[0])
    itemsize = kept[0].itemsize if len(kept) else 0  # (a document's ids, or the batch's)
    return {"ms": ms, "faults": faulted, "ids": ids, "itemsize": itemsize}


def run_child(spec: dict) -> dict:
    what = spec["what"]
    if what == "faults":
        return faults(spec["kind"], spec["corpus"])
    if what == "timeline":
        return timeline(spec["corpus"])
    if what == "bound":
        return bound(spec["corpus"])
    if what == "ceiling":
        return ceiling(spec["corpus"], spec["split"])
    if what == "halves":
        return halves_in_turn(spec["corpus"], tuple(spec["cpus"]))
    if what == "steady":
        return steady(spec["corpus"], spec["batches"])
    return per_document(spec["tool"], spec["corpus"], spec.get("sleep", 0.0))


def spawn(spec: dict) -> dict:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                          capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"run {spec} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(lines[-1])


def _range(values) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _label(kind: str, tool: str, slept: float, variant) -> str:
    """What a measurement's line of the report calls it."""
    if kind == "faults":
        return FAULT_KINDS[variant]
    if kind == "halves":
        second = "both on CPU 0" if variant == (0, 0) else "the second on CPU 1"
        return f"the halves in turn, {second}, in all"
    if kind == "ceiling":
        return f"two parts at once, the first {variant:g} of the text, into one result"
    return {"timeline": "2-thread batch", "bound": "two halves at once",
            "steady": "2-thread batches one after another, the first"}.get(
        kind, f"{tool}, one call per document" + (f", after {slept:g} s of sleep" if slept else ""))


def measure(corpora, whats, runs: int, sleep: float, log=print, batches: int = 15,
            split: float = 0.5) -> list[dict]:
    results = []
    have_gigatoken = bench_peers.tool_available("gigatoken")
    for corpus in corpora:
        name = os.path.basename(corpus)
        for what in whats:
            if what == "timeline":
                specs = [[dict(what="timeline", corpus=corpus)]] * runs
            elif what == "bound":
                specs = [[dict(what="bound", corpus=corpus), dict(what="doc", tool="nbbpe", corpus=corpus)]] * runs
            elif what == "ceiling":
                specs = [[dict(what="ceiling", corpus=corpus, split=split),
                          dict(what="doc", tool="nbbpe", corpus=corpus)]] * runs
            elif what == "halves":
                specs = [[dict(what="halves", corpus=corpus, cpus=cpus) for cpus in ((0, 0), (0, 1))]] * runs
            elif what == "steady":
                specs = [[dict(what="steady", corpus=corpus, batches=max(2, batches))]] * runs
            elif what == "faults":
                specs = [[dict(what="faults", kind=kind, corpus=corpus) for kind in FAULT_KINDS]] * runs
            else:
                tools = ["nbbpe"] + (["gigatoken"] if have_gigatoken else [])
                specs = [[dict(what="doc", tool=t, corpus=corpus, sleep=s) for t in tools for s in (0.0, sleep)]] * runs
            done: dict[tuple, list] = {}
            for round_, specs_of_round in enumerate(specs):
                order = specs_of_round if round_ % 2 == 0 else specs_of_round[::-1]
                for spec in order:
                    result = spawn(spec)
                    results.append(dict(spec, round=round_, **result))
                    key = (spec["what"], spec.get("tool", "nbbpe"), spec.get("sleep", 0.0),
                           spec.get("kind") or spec.get("split") or tuple(spec.get("cpus", ())))
                    done.setdefault(key, []).append(result)
            log(f"{name} {what} ({runs} fresh processes each):")
            for (kind, tool, slept, variant), got in done.items():
                log(f"  {_label(kind, tool, slept, variant)}: {_range([g['ms'] for g in got])} ms")
                if kind == "faults":
                    log(f"    minor page faults: {_range([g['faults'] for g in got])}")
                if kind == "timeline":
                    for role in ("calling", "pool"):
                        rows = [g["threads"][role] for g in got if role in g["threads"]]
                        if rows:
                            log(f"    {role} thread: first group at {_range([r['first_ms'] for r in rows])} ms, "
                                f"in groups {_range([r['in_groups_ms'] for r in rows])} "
                                f"(CPU {_range([r['cpu_in_groups_ms'] for r in rows])}), "
                                f"outside them {_range([r['outside_groups_ms'] for r in rows])}")
                    stalls = sum(g["vmstat"].get("compact_stall", 0) for g in got)
                    huge = sum(g["vmstat"].get("thp_fault_alloc", 0) for g in got)
                    log(f"    during the batches: {stalls} compaction stalls, {huge} 2 MB page faults (system-wide)")
                if kind == "steady":
                    log(f"    the others, median: {_range([g['steady_ms'] for g in got])} ms; page faults: "
                        f"the first {_range([g['first_faults'] for g in got])}, the others "
                        f"{_range([g['steady_faults'] for g in got])}")
                    log(f"    one call per document on one thread, warm: "
                        f"{_range([g['one_thread_ms'] for g in got])} ms; the batches' speed-up "
                        f"{_range([g['one_thread_ms'] / g['steady_ms'] for g in got])}")
                if kind == "halves":
                    for k, which in enumerate(("first", "second")):
                        log(f"    the {which} half: {_range([g['halves_ms'][k] for g in got])} ms, "
                            f"{_range([g['halves_faults'][k] for g in got])} page faults")
                if kind == "ceiling":
                    log("    parts: " + ", ".join(f"{a:.2f} and {b:.2f}" for a, b in (g["halves_ms"] for g in got))
                        + f" ms; balanced {_range([g['balanced_ms'] for g in got])} ms")
                    log(f"    a part's kernel call {_range([t for g in got for t in g['kernel_ms']])} ms, "
                        f"page faults {_range([f for g in got for f in g['halves_faults']])}")
                    alone = done.get(("doc", "nbbpe", 0.0, ()), [])
                    if len(alone) == len(got):  # the rounds' one call per document, by round
                        log(f"    one call per document over it, by round: {_range([a['ms'] / g['ms'] for a, g in zip(alone, got)])}; "
                            f"medians: {statistics.median(a['ms'] for a in alone) / statistics.median(g['ms'] for g in got):.3f}, "
                            f"balanced {statistics.median(a['ms'] for a in alone) / statistics.median(g['balanced_ms'] for g in got):.3f}")
                if kind == "bound":
                    log("    halves: " + ", ".join(f"{a:.2f} and {b:.2f}" for a, b in (g["halves_ms"] for g in got)) + " ms")
                    log(f"    page faults of a half: {_range([f for g in got for f in g['halves_faults']])}")
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpora", nargs="*")
    parser.add_argument("--what", default=",".join(WHATS), help=f"comma-separated, of {','.join(WHATS)}")
    parser.add_argument("--runs", type=int, default=8, help="fresh processes per measurement")
    parser.add_argument("--sleep", type=float, default=2.0, help="idle: seconds of sleep before timing")
    parser.add_argument("--batches", type=int, default=15, help="steady: batches per process")
    parser.add_argument("--split", type=float, default=0.5,
                        help="ceiling: the first part's share of the characters")
    parser.add_argument("--json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0
    whats = [w.strip() for w in args.what.split(",") if w.strip()]
    unknown = [w for w in whats if w not in WHATS]
    if unknown:
        parser.error(f"unknown --what {unknown}; known: {', '.join(WHATS)}")
    if not 0 < args.split < 1:
        parser.error(f"--split must be between 0 and 1, got {args.split}")
    results = measure(args.corpora or default_corpora(), whats, args.runs, args.sleep,
                      batches=args.batches, split=args.split)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
