"""Encoding throughput: nbbpe against tiktoken and Hugging Face `tokenizers`, same GPT-2 files.

    python scripts/bench_encode.py /work/shared/corpora/web_5M.txt
    python scripts/bench_encode.py /work/shared/corpora/web_100M.txt --repeat 1

Tools: nbbpe (compiled pre-tokenizer), nbbpe_regex (nbbpe with the `regex` pre-tokenizer),
tiktoken, gigatoken, hf. All tools encode the same pieces of the corpus (cut right after a special token, or failing
that between a non-space and a space, so the pieces encode as the whole text does), with the
corpus's `<|endoftext|>` as a special token. Reported, in MB of UTF-8 per second:

- one process: each piece goes through every tool in turn (interleaved, so machine noise hits
  all alike), best of `--repeat` passes; `regex.findall` of the GPT-2 pattern alone on the same
  pieces is the yardstick for the pre-tokenization cost;
- N processes: each tool in a pool of N forked workers (tool built and warmed up before the
  clock starts), pieces handed out one at a time; wall time until all ids are back, and the
  workers' CPU time in their encode calls (which other load on the machine disturbs less);
- ids: every tool's ids must equal nbbpe's on every piece (SHA-1 of the int32 ids per piece);
- `--stream-rss`: in a fresh process, `encode_iterable` over the open file (the whole corpus,
  not pieces): growth of peak RSS over the RSS before it started, and whether the ids equal the
  pieces' ids.

tiktoken is built offline from the GPT-2 vocab file (never downloaded). Hugging Face is built
from the same vocab/merges with its own byte-level pre-tokenizer, single-threaded
(TOKENIZERS_PARALLELISM=false); its parallelism comes from the process pool like the others.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import regex  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
EOT = "<|endoftext|>"
TOOLS = ("nbbpe", "nbbpe_regex", "tiktoken", "gigatoken", "hf")
# The package each tool needs; tiktoken, gigatoken and tokenizers are optional peers.
TOOL_MODULES = dict(nbbpe="nbbpe", nbbpe_regex="nbbpe", nbbpe_numpy="nbbpe", tiktoken="tiktoken",
                    gigatoken="gigatoken", hf="tokenizers", findall="regex")


def tool_available(name: str) -> bool:
    """Whether the tool's package can be imported here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec(TOOL_MODULES[name]) is not None


def build_tool(name: str, vocab_path: str, merges_path: str):
    """A function text -> list of ids for the named tool."""
    if name == "nbbpe":
        from nbbpe import Tokenizer

        tokenizer = Tokenizer.from_files(vocab_path, merges_path, [EOT])
        return tokenizer.encode
    if name == "nbbpe_regex":  # the reference pre-tokenizer (regex) instead of the compiled one
        from nbbpe import Tokenizer

        tokenizer = Tokenizer.from_files(vocab_path, merges_path, [EOT], pretokenizer="regex")
        return tokenizer.encode
    if name == "gigatoken":  # from the same files, exported by nbbpe as a tokenizer.json
        import tempfile

        import gigatoken

        from nbbpe import Tokenizer

        json_path = os.path.join(tempfile.mkdtemp(prefix="nbbpe-bench-"), "tokenizer.json")
        Tokenizer.from_files(vocab_path, merges_path, [EOT]).save_tokenizer_json(json_path)
        encoder = gigatoken.Tokenizer(json_path)
        return lambda text: encoder.encode(text).tolist()
    if name == "nbbpe_numpy":
        from nbbpe import Tokenizer

        tokenizer = Tokenizer.from_files(vocab_path, merges_path, [EOT])
        return lambda text: tokenizer.encode_to_numpy(text, dtype=np.int32)
    if name == "tiktoken":
        import tiktoken

        from nbbpe.pretokenize import GPT2_PATTERN
        from nbbpe.vocab_files import load_gpt2_files

        vocab, _ = load_gpt2_files(vocab_path, merges_path)
        ranks = {token: i for i, token in vocab.items() if token != EOT.encode()}
        encoding = tiktoken.Encoding(name="gpt2-offline", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                     special_tokens={EOT: 50256})
        return lambda text: encoding.encode(text, allowed_special="all")
    if name == "hf":
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        tokenizer = Tokenizer(models.BPE.from_file(vocab_path, merges_path))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
        return lambda text: tokenizer.encode(text).ids
    if name == "findall":
        from nbbpe.pretokenize import GPT2_PATTERN

        return regex.compile(GPT2_PATTERN).findall
    raise ValueError(name)


def cut_pieces(text: str, piece_chars: int) -> list[str]:
    """Pieces of about `piece_chars`, each ending right after a special token (or, if there is
    none near, between a non-space and a space)."""
    pieces = []
    start = 0
    while start < len(text):
        end = start + piece_chars
        if end >= len(text):
            pieces.append(text[start:])
            break
        cut = text.find(EOT, end)
        if cut < 0 or cut > end + piece_chars:
            match = regex.compile(r"\S\s").search(text, end)
            cut = match.start() + 1 if match else len(text)
        else:
            cut += len(EOT)
        pieces.append(text[start:cut])
        start = cut
    return pieces


def digest(ids) -> str:
    return hashlib.sha1(np.asarray(ids, dtype=np.int32).tobytes()).hexdigest()


# --- one process ----------------------------------------------------------------------------


def run_single(tools: dict, pieces: list[str], repeat: int) -> tuple[dict, dict, dict]:
    """Best total wall and CPU seconds per tool over `repeat` interleaved passes; per-piece
    digests. CPU time is less disturbed than wall time by other work on a shared machine."""
    best_wall = {name: float("inf") for name in tools}
    best_cpu = dict(best_wall)
    digests = {name: [] for name in tools if name != "findall"}
    for r in range(repeat):
        wall = dict.fromkeys(tools, 0.0)
        cpu = dict.fromkeys(tools, 0.0)
        for piece in pieces:
            for name, encode in tools.items():
                t0, c0 = time.perf_counter(), time.process_time()
                ids = encode(piece)
                wall[name] += time.perf_counter() - t0
                cpu[name] += time.process_time() - c0
                if r == 0 and name != "findall":
                    digests[name].append(digest(ids))
        for name in tools:
            best_wall[name] = min(best_wall[name], wall[name])
            best_cpu[name] = min(best_cpu[name], cpu[name])
    return best_wall, best_cpu, digests


# --- N processes ----------------------------------------------------------------------------

_pieces: list[str] = []
_encode = None


def _worker_init(name, vocab_path, merges_path, barrier):
    global _encode
    _encode = build_tool(name, vocab_path, merges_path)
    _encode("warm up: compile or load the kernels " + EOT)
    barrier.wait()


def _worker_encode(k):
    c0 = time.process_time()
    ids = _encode(_pieces[k])
    cpu = time.process_time() - c0
    return k, digest(ids), cpu


def run_pool(name: str, vocab_path: str, merges_path: str, processes: int) -> tuple[float, float, list[str]]:
    context = multiprocessing.get_context("fork")  # the workers inherit the pieces
    barrier = context.Barrier(processes + 1)
    with context.Pool(processes, _worker_init, (name, vocab_path, merges_path, barrier)) as pool:
        barrier.wait()
        t0 = time.perf_counter()
        # longest pieces first, one at a time, so the workers finish together
        order = sorted(range(len(_pieces)), key=lambda k: -len(_pieces[k]))
        results = list(pool.imap_unordered(_worker_encode, order, chunksize=1))
        seconds = time.perf_counter() - t0
    digests = [""] * len(_pieces)
    for k, d, _ in results:
        digests[k] = d
    return seconds, sum(cpu for _, _, cpu in results), digests


# --- streaming memory -------------------------------------------------------------------------


def stream_rss(path: str, vocab_path: str, merges_path: str) -> None:
    """Child mode: print peak-RSS growth of encode_iterable over the open file, and a digest."""
    import psutil

    from nbbpe import Tokenizer

    tokenizer = Tokenizer.from_files(vocab_path, merges_path, [EOT])
    tokenizer.encode("warm up " + EOT)
    _reset_peak_rss()  # the peak of loading the vocab is not streaming's
    before = psutil.Process().memory_info().rss
    sha = hashlib.sha1()
    batch = []
    count = 0
    t0 = time.perf_counter()
    with open(path, encoding="utf-8") as f:
        for i in tokenizer.encode_iterable(f):
            batch.append(i)
            if len(batch) == 1 << 16:
                sha.update(np.asarray(batch, dtype=np.int32).tobytes())
                count += len(batch)
                batch.clear()
    sha.update(np.asarray(batch, dtype=np.int32).tobytes())
    count += len(batch)
    seconds = time.perf_counter() - t0
    peak = _peak_rss()
    print(f"{(peak - before) / 1e6:.1f} {before / 1e6:.1f} {peak / 1e6:.1f} {count} {sha.hexdigest()} "
          f"{seconds:.2f}")


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def stream_check(path, vocab_path, merges_path, expected_digest, expected_count):
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), path, "--vocab", vocab_path, "--merges", merges_path,
         "--stream-child"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    growth, before, peak, count, sha, seconds = out
    size = os.path.getsize(path) / 1e6
    same = sha == expected_digest and int(count) == expected_count
    print(f"encode_iterable over the open file ({size:.1f} MB): peak RSS {float(peak):.1f} MB, "
          f"{float(before):.1f} MB before streaming -> growth {float(growth):.1f} MB; "
          f"{size / float(seconds):.2f} MB/s; {int(count):,} ids, equal to the pieces' ids: "
          f"{'yes' if same else 'NO'}")


# --- as a function (for the notebooks) ------------------------------------------------------


def measure_encoding(corpus: str, tools=TOOLS, *, vocab_path: str | None = None,
                     merges_path: str | None = None, limit_mb: float | None = None,
                     piece_kb: int = 256, processes: int = 2, repeat: int = 3) -> dict:
    """What `main` prints, as a dict: MB/s of each tool on the corpus's pieces in one process
    (best of `repeat` interleaved passes; by wall and by CPU time) and in a pool of `processes`,
    `regex.findall` alone as the yardstick, and whether each tool's ids equal nbbpe's.

    nbbpe is always measured (it is the reference for the ids); tools are built and warmed up
    before any clock starts. Default vocab: the GPT-2 files in tests/fixtures.
    """
    global _pieces
    vocab_path = vocab_path or os.path.join(FIXTURES, "gpt2_vocab.json")
    merges_path = merges_path or os.path.join(FIXTURES, "gpt2_merges.txt")
    with open(corpus, encoding="utf-8") as f:
        text = f.read() if limit_mb is None else f.read(int(limit_mb * 1e6))
    _pieces = cut_pieces(text, piece_kb * 1024)
    del text
    megabytes = sum(len(p.encode("utf-8")) for p in _pieces) / 1e6
    names = ["nbbpe"] + [n for n in tools if n != "nbbpe"]
    built = {}
    for name in ["findall"] + names:
        built[name] = build_tool(name, vocab_path, merges_path)
        built[name]("warm up: compile or load the kernels " + EOT)
    wall, cpu, digests = run_single(built, _pieces, repeat)
    reference = digests["nbbpe"]
    single = {name: {"mb_s": megabytes / wall[name], "cpu_mb_s": megabytes / cpu[name],
                     "ids_equal": digests[name] == reference} for name in names}
    pool = {}
    for name in names:
        seconds, cpu_seconds, pool_digests = run_pool(name, vocab_path, merges_path, processes)
        pool[name] = {"mb_s": megabytes / seconds, "cpu_mb_s": megabytes / cpu_seconds,
                      "ids_equal": pool_digests == reference}
    return {"corpus": os.path.basename(corpus), "megabytes": megabytes, "pieces": len(_pieces),
            "processes": processes, "repeat": repeat,
            "findall": {"mb_s": megabytes / wall["findall"], "cpu_mb_s": megabytes / cpu["findall"]},
            "single": single, "pool": pool}


# --- main -----------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus")
    parser.add_argument("--vocab", default=os.path.join(FIXTURES, "gpt2_vocab.json"))
    parser.add_argument("--merges", default=os.path.join(FIXTURES, "gpt2_merges.txt"))
    parser.add_argument("--limit-mb", type=float, default=None, help="use only the first MB of the corpus")
    parser.add_argument("--piece-kb", type=int, default=256)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="single-process passes (best is kept)")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated: nbbpe,tiktoken,hf")
    parser.add_argument("--stream-rss", action="store_true",
                        help="also measure encode_iterable's peak RSS growth over the file")
    parser.add_argument("--stream-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.stream_child:
        stream_rss(args.corpus, args.vocab, args.merges)
        return 0

    global _pieces
    with open(args.corpus, encoding="utf-8") as f:
        text = f.read() if args.limit_mb is None else f.read(int(args.limit_mb * 1e6))
    _pieces = cut_pieces(text, args.piece_kb * 1024)
    del text
    megabytes = sum(len(p.encode("utf-8")) for p in _pieces) / 1e6
    names = [n.strip() for n in args.tools.split(",") if n.strip()]
    if "nbbpe" not in names:
        names.insert(0, "nbbpe")
    print(f"corpus {args.corpus}: {megabytes:.1f} MB in {len(_pieces)} pieces; "
          f"{os.cpu_count()} CPUs; python {sys.version.split()[0]}")

    tools = {}
    for name in ["findall", "nbbpe", "nbbpe_numpy"] + [n for n in names if n != "nbbpe"]:
        t0 = time.perf_counter()
        tools[name] = build_tool(name, args.vocab, args.merges)
        t1 = time.perf_counter()
        tools[name]("warm up: compile or load the kernels " + EOT)
        t2 = time.perf_counter()
        if name != "findall":
            first = "first call (Numba compile or cache load)" if name.startswith("nbbpe") else "first call"
            print(f"  {name}: built in {t1 - t0:.2f} s, {first} {t2 - t1:.2f} s")

    wall, cpu, digests = run_single(tools, _pieces, args.repeat)
    reference = digests["nbbpe"]
    print(f"\none process (best of {args.repeat}; MB/s by wall time, and by CPU time):")
    print(f"  {'regex.findall alone':24s} {megabytes / wall['findall']:7.2f} MB/s  "
          f"({megabytes / cpu['findall']:6.2f} CPU)")
    for name in tools:
        if name == "findall":
            continue
        same = digests[name] == reference
        label = {"nbbpe": "nbbpe encode (list)", "nbbpe_numpy": "nbbpe encode_to_numpy",
                 "hf": "HF tokenizers"}.get(name, name)
        print(f"  {label:24s} {megabytes / wall[name]:7.2f} MB/s  ({megabytes / cpu[name]:6.2f} CPU)"
              f"   ids equal to nbbpe: {'yes' if same else 'NO'}")
    print(f"  nbbpe encode / regex.findall throughput: {wall['findall'] / wall['nbbpe']:.2f} by wall "
          f"time, {cpu['findall'] / cpu['nbbpe']:.2f} by CPU time")

    print(f"\n{args.processes} processes:")
    for name in names:
        seconds, cpu_seconds, pool_digests = run_pool(name, args.vocab, args.merges, args.processes)
        same = pool_digests == reference
        label = {"nbbpe": "nbbpe encode (list)", "hf": "HF tokenizers"}.get(name, name)
        print(f"  {label:24s} {megabytes / seconds:7.2f} MB/s  ({megabytes / cpu_seconds:6.2f} per CPU-second "
              f"of encoding in the workers)   ids equal to nbbpe: {'yes' if same else 'NO'}")

    if args.stream_rss:
        total = hashlib.sha1()
        count = 0
        for piece in _pieces:  # the digest of all ids in order, to compare with the stream's
            ids = tools["nbbpe_numpy"](piece)
            total.update(ids.astype(np.int32).tobytes())
            count += len(ids)
        print()
        if args.limit_mb is not None:
            print("(streaming reads the whole file; --limit-mb does not apply)")
        else:
            stream_check(args.corpus, args.vocab, args.merges, total.hexdigest(), count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
