"""The `nbbpe` command line: train a tokenizer, encode a corpus into token files, inspect.

    nbbpe train [SOURCE ...] --vocab-size 10000 --special-token '<|endoftext|>' --out out/tokenizer
    nbbpe encode --tokenizer out/tokenizer [SOURCE ...] [-o OUT.bin]
    nbbpe info [out/tokenizer]

A SOURCE is a text file, a JSONL or Parquet file (compressed: .gz, .bz2, .xz, .zst), a directory,
a glob or an fsspec URL. Without a SOURCE, `train` and `encode` use the small real TinyStories
sample shipped in the package, so `nbbpe train && nbbpe encode` works on a fresh machine with no
download. `--scheduler tcp://host:8786` runs the work on a Dask cluster instead of local threads.
Progress bars go to stderr when it is a terminal (`--quiet` turns them off).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import threading
import time
import traceback
from importlib import resources

import psutil

SAMPLE_CORPUS = "tinystories_sample.txt"
DEFAULT_TOKENIZER_DIR = os.path.join("out", "tokenizer")
EOT = "<|endoftext|>"


def sample_corpus_path() -> str:
    """The small real TinyStories sample shipped in the package (CDLA-Sharing-1.0)."""
    return str(resources.files("nbbpe") / "data" / SAMPLE_CORPUS)


# --- measuring ----------------------------------------------------------------------------------


# Sampling holds this lock, and forking waits for it: a worker is never forked while the sampler
# thread is inside psutil (holding a lock the child would inherit locked).
_SAMPLING = threading.Lock()
os.register_at_fork(before=_SAMPLING.acquire, after_in_parent=_SAMPLING.release,
                    after_in_child=_SAMPLING.release)


class PeakMemory:
    """Peak memory of this process and its children while in the `with` block.

    Sampled with psutil every `interval` seconds: `peak_pss` is the largest sum of PSS over the
    process tree (pages shared by forked workers counted once in all), `peak_rss` the largest sum
    of RSS (shared pages counted in every process). `max_rss` is the kernel's exact peak RSS of
    any single process (this one or a finished child), which sampling cannot miss.
    """

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak_pss = 0
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="nbbpe-peak-memory", daemon=True)

    def _sample(self) -> None:
        pss = rss = 0
        with _SAMPLING:
            me = psutil.Process()
            for proc in [me, *me.children(recursive=True)]:
                try:
                    info = proc.memory_full_info()
                except (psutil.Error, OSError):
                    continue  # ended meanwhile
                pss += getattr(info, "pss", info.rss)
                rss += info.rss
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_rss = max(self.peak_rss, rss)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PeakMemory:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def max_rss(self) -> int:
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        return max(own, children) * 1024  # ru_maxrss is in KiB on Linux

    def summary(self) -> str:
        return (f"{self.peak_pss / 1e6:.0f} MB PSS summed over processes "
                f"({self.peak_rss / 1e6:.0f} MB RSS summed; largest single process "
                f"{self.max_rss / 1e6:.0f} MB RSS)")


def _show_token(token: bytes) -> str:
    return repr(token.decode("utf-8", errors="replace"))


# --- sources and the cluster --------------------------------------------------------------------


PATTERNS = ("gpt2", "cl100k", "o200k")
_COMPRESSION = (".gz", ".bz2", ".xz", ".zst", ".zstd")
_FORMATS = (".txt", ".text", ".jsonl", ".json", ".ndjson", ".parquet", ".pq")


def pattern_of(name: str) -> str:
    """The pre-tokenization pattern `--pattern` names: gpt2, cl100k, o200k, or a regex."""
    from .patterns import CL100K_PATTERN, GPT2_PATTERN, O200K_PATTERN, compile_pattern

    named = {"gpt2": GPT2_PATTERN, "cl100k": CL100K_PATTERN, "o200k": O200K_PATTERN}
    if name.lower() in named:
        return named[name.lower()]
    try:
        compile_pattern(name)
    except Exception as exc:  # regex.error, or capturing groups
        raise ValueError(f"--pattern {name!r} is neither one of {', '.join(PATTERNS)} nor a "
                         f"usable regex: {exc}") from None
    return name


def _show_source(source) -> str:
    return source if isinstance(source, str) else ", ".join(source)


class _Cluster:
    """`with _Cluster(address) as client:` a `distributed.Client` connected to `address`
    (None: no cluster, local threads), closed at the end."""

    def __init__(self, address: str | None, timeout: float, print_=print):
        self.address, self.timeout, self.print_ = address, timeout, print_
        self.client = None

    def __enter__(self):
        if self.address is None:
            return None
        from .distributed import DaskExecutor, connect

        self.client = connect(self.address, timeout=self.timeout)
        try:
            threads = DaskExecutor(self.client, wait_for_workers=self.timeout).num_workers
        except BaseException:
            self.client.close()
            raise
        workers = len(self.client.nthreads())
        self.print_(f"scheduler       {self.address} ({workers} worker(s), {threads} thread(s))")
        return self.client

    def __exit__(self, *exc_info) -> None:
        if self.client is not None:
            self.client.close()


# --- train --------------------------------------------------------------------------------------


def train_and_report(corpus, vocab_size: int, special_tokens: list[str], out: str, *,
                     num_workers: int | None = None, progress: bool | None = None,
                     print_=print, client=None, pattern: str | None = None,
                     errors: str = "strict", text_field: str = "text", text_column: str = "text",
                     chunk_bytes: int | None = None) -> dict:
    """Train on `corpus` (any source: a file, files, a directory, a glob...), save the tokenizer
    into `out` (`Tokenizer.load` reads it back), and report wall time, peak memory and the
    longest token. `client` (a `distributed.Client`) trains on a Dask cluster. Returns what was
    reported."""
    from .patterns import GPT2_PATTERN
    from .sources import resolve_source
    from .tokenizer import Tokenizer
    from .train import train_bpe

    pattern = GPT2_PATTERN if pattern is None else pattern
    size = sum(f.size for f in resolve_source(corpus, text_field=text_field,
                                              text_column=text_column))
    print_(f"corpus          {_show_source(corpus)} ({size / 1e6:.1f} MB)")
    timings: dict = {}
    options = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
    start = time.perf_counter()
    with PeakMemory() as memory:
        vocab, merges = train_bpe(corpus, vocab_size, special_tokens, num_workers=num_workers,
                                  client=client, pattern=pattern, errors=errors,
                                  text_field=text_field, text_column=text_column,
                                  progress=progress, timings=timings, **options)
    wall = time.perf_counter() - start
    paths = Tokenizer(vocab, merges, special_tokens, pattern=pattern).save(out)
    learned = [vocab[i] for i in range(256 + len(special_tokens), len(vocab))]  # not the specials
    longest = max(learned, key=len, default=b"")
    print_(f"vocab           {len(vocab)} ids, {len(merges)} merges, special tokens {special_tokens}")
    print_(f"wall time       {wall:.2f} s (pre-tokenize {timings['pretokenize']:.2f} s, "
           f"merge {timings['merge']:.2f} s)")
    print_(f"peak memory     {memory.summary()}")
    print_(f"longest token   {len(longest)} bytes: {_show_token(longest)}")
    print_(f"saved           {', '.join(paths)}")
    return {"corpus": corpus, "corpus_bytes": size, "vocab_size": len(vocab), "merges": len(merges),
            "wall_seconds": wall, "timings": timings, "peak_pss": memory.peak_pss,
            "peak_rss": memory.peak_rss, "max_rss": memory.max_rss, "longest_token": longest,
            "saved": paths}


def cmd_train(args: argparse.Namespace) -> int:
    specials = args.special_token if args.special_token is not None else [EOT]
    sources = args.sources or [sample_corpus_path()]
    pattern = pattern_of(args.pattern)
    with _Cluster(args.scheduler, args.connect_timeout) as client:
        train_and_report(sources[0] if len(sources) == 1 else sources, args.vocab_size, specials,
                         args.out, num_workers=args.workers, client=client,
                         pattern=pattern, errors=args.errors,
                         text_field=args.text_field, text_column=args.text_column,
                         chunk_bytes=_chunk_bytes(args), progress=False if args.quiet else None)
    return 0


# --- encode -------------------------------------------------------------------------------------


def load_tokenizer_dir(directory: str, special_tokens: list[str] | None = None):
    """The tokenizer saved in `directory` by `nbbpe train` / `Tokenizer.save`, or, if there is
    only a GPT-2 style vocab.json + merges.txt, that one with `special_tokens`."""
    from .tokenizer import Tokenizer
    from .vocab_files import CONFIG_FILE

    if not os.path.isdir(directory):
        raise FileNotFoundError(f"tokenizer directory not found: {directory!r} "
                                "(`nbbpe train --out DIR` writes one)")
    if os.path.exists(os.path.join(directory, CONFIG_FILE)):
        if special_tokens is not None:
            raise ValueError(f"{directory!r} is a saved tokenizer whose {CONFIG_FILE} sets the "
                             "special tokens; --special-token is only for plain vocab.json + merges.txt")
        return Tokenizer.load(directory)
    vocab_path = os.path.join(directory, "vocab.json")
    merges_path = os.path.join(directory, "merges.txt")
    if os.path.exists(vocab_path) and os.path.exists(merges_path):
        return Tokenizer.from_files(vocab_path, merges_path, special_tokens or [])
    raise FileNotFoundError(f"no tokenizer in {directory!r}: expected {CONFIG_FILE}, vocab.json and "
                            "merges.txt (`nbbpe train --out DIR` writes them)")


def default_output_path(corpus: str, shards: bool = False) -> str:
    """out/<name of the source>.bin (for shards: the directory out/<name>), the name without
    its format and compression suffixes."""
    name = os.path.basename(corpus.rstrip("/" + os.sep)) or "tokens"
    lower = name.lower()
    for suffixes in (_COMPRESSION, _FORMATS):
        for suffix in suffixes:
            if lower.endswith(suffix) and len(name) > len(suffix):
                name, lower = name[: -len(suffix)], lower[: -len(suffix)]
                break
    return os.path.join("out", name if shards else f"{name}.bin")


def _is_earlier_output(path: str) -> bool:
    """Whether `path`, the second of two SOURCEs, is rather the output of the older form
    `nbbpe encode CORPUS OUT`: a path that does not exist yet, or what `encode` wrote there."""
    from .token_files import FORMAT, INDEX_FILE, sidecar_path

    if "://" in path or any(c in path for c in "*?["):
        return False
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        return True
    if os.path.isdir(path):
        return os.path.exists(os.path.join(path, INDEX_FILE))
    try:
        with open(sidecar_path(path), encoding="utf-8") as f:
            return json.load(f).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def encode_sources_and_output(paths: list[str], output: str | None, shards: bool):
    """(sources, output path) from `encode`'s positional arguments and -o."""
    if output is None and len(paths) == 2 and _is_earlier_output(paths[1]):
        paths, output = paths[:1], paths[1]  # the older form: nbbpe encode CORPUS OUT
    sources = paths or [sample_corpus_path()]
    if output is None:
        if len(sources) > 1 or "://" in sources[0] or (
                not os.path.exists(os.path.expanduser(sources[0]))
                and any(c in sources[0] for c in "*?[")):
            raise ValueError("give the output with -o OUT when encoding several sources, a glob "
                             "or a URL")
        output = default_output_path(sources[0], shards)
    return (sources[0] if len(sources) == 1 else sources), output


def cmd_encode(args: argparse.Namespace) -> int:
    from .token_files import encode_file

    corpus, output = encode_sources_and_output(args.sources, args.output,
                                               args.shard_bytes is not None)
    tokenizer = load_tokenizer_dir(args.tokenizer, args.special_token)
    separator = None if args.separator.lower() == "none" else args.separator
    with _Cluster(args.scheduler, args.connect_timeout) as client:
        start = time.perf_counter()
        with PeakMemory() as memory:
            result = encode_file(tokenizer, corpus, output, num_workers=args.workers,
                                 client=client, dtype=None if args.dtype == "auto" else args.dtype,
                                 chunk_bytes=_chunk_bytes(args), errors=args.errors,
                                 separator=separator, shard_bytes=args.shard_bytes,
                                 text_field=args.text_field, text_column=args.text_column,
                                 progress=False if args.quiet else None)
        wall = time.perf_counter() - start
    size = result.source_bytes
    print(f"corpus          {_show_source(corpus)} ({size / 1e6:.1f} MB)")
    print(f"tokenizer       {args.tokenizer} ({tokenizer.n_vocab} ids, "
          f"sha256 {result.tokenizer_sha256[:16]}…)")
    print(f"tokens          {result.num_tokens:,} {result.dtype} "
          f"({size / max(result.num_tokens, 1):.2f} bytes/token)"
          + (f" in {len(result.shards)} shards" if result.shards else ""))
    print(f"wall time       {wall:.2f} s: {size / wall / 1e6:.1f} MB/s, "
          f"{result.num_tokens / wall / 1e6:.2f} M tokens/s")
    print(f"peak memory     {memory.summary()}")
    print(f"saved           {result.path} (and {result.sidecar_path})")
    return 0


# --- info ---------------------------------------------------------------------------------------


def cmd_info(args: argparse.Namespace) -> int:
    from .corpus import check_corpus_path, read_range
    from .patterns import CL100K_PATTERN, GPT2_PATTERN, O200K_PATTERN
    from .token_files import tokenizer_sha256

    tokenizer = load_tokenizer_dir(args.tokenizer, args.special_token)
    pattern = {GPT2_PATTERN: "GPT-2", CL100K_PATTERN: "cl100k", O200K_PATTERN: "o200k"}.get(tokenizer.pattern, tokenizer.pattern)
    print(f"tokenizer       {args.tokenizer}")
    print(f"vocab           {tokenizer.n_vocab} ids, {len(tokenizer.merges)} merges, "
          f"special tokens {tokenizer.special_tokens}")
    print(f"pattern         {pattern}")
    print(f"sha256          {tokenizer_sha256(tokenizer)}")
    specials = {t.encode("utf-8") for t in tokenizer.special_tokens}
    ordinary = [t for t in tokenizer.vocab.values() if t not in specials]
    longest = sorted(ordinary, key=lambda t: (-len(t), t))[: args.top]
    print("longest tokens  " + ", ".join(f"{_show_token(t)} ({len(t)} B)" for t in longest))

    sample = args.sample or sample_corpus_path()
    size = min(check_corpus_path(sample), args.sample_bytes)
    text = read_range(sample, 0, size).decode("utf-8", errors="ignore")  # a cut last character
    start = time.perf_counter()
    ids = tokenizer.encode_to_numpy(text)
    seconds = time.perf_counter() - start
    used = len(text.encode("utf-8"))
    print(f"compression     {used / max(len(ids), 1):.2f} bytes/token on the first "
          f"{used / 1e6:.2f} MB of {sample} ({len(ids):,} tokens, {used / seconds / 1e6:.1f} MB/s "
          "on one process, first call included)")
    return 0


# --- the parser ---------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _byte_size(text: str) -> int:
    """A number of bytes: 1000000, 64M, 1.5G, 512K (powers of 1024)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    clean = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        value = float(clean[:-1]) * units[clean[-1]] if clean[-1:] in units else float(clean)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} (e.g. 1000000, 64M, 1G)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return int(value)


def _chunk_bytes(args: argparse.Namespace) -> int:
    return max(1, int(args.chunk_mb * (1 << 20)))


def _add_source_options(command: argparse.ArgumentParser, verb: str) -> None:
    command.add_argument("sources", nargs="*", metavar="SOURCE",
                         help="text, JSONL or Parquet files (also .gz/.bz2/.xz/.zst), directories, "
                              "globs or fsspec URLs (default: the shipped TinyStories sample)")
    command.add_argument("--errors", choices=["strict", "replace"], default="strict",
                         help="invalid UTF-8: raise naming the place (strict, the default) or "
                              "read it as U+FFFD (replace)")
    command.add_argument("--text-field", default="text",
                         help="the field of each JSONL line that holds the text (default: %(default)s)")
    command.add_argument("--text-column", default="text",
                         help="the Parquet column that holds the text (default: %(default)s)")
    command.add_argument("--chunk-mb", type=float, default=2.0,
                         help="MB of text per unit of work (default: 2)")
    command.add_argument("--workers", type=_positive_int, default=None,
                         help="threads (default: one per CPU)")
    command.add_argument("--scheduler", metavar="ADDRESS",
                         help=f"{verb} on the Dask cluster of this scheduler (e.g. "
                              "tcp://host:8786) instead of local threads; every worker must "
                              "read the sources at the same paths (a shared filesystem, or URLs)")
    command.add_argument("--connect-timeout", type=float, default=10.0, metavar="SECONDS",
                         help="how long to try to reach the scheduler, and to wait for a "
                              "first worker (default: %(default)g)")
    command.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nbbpe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a byte-level BPE tokenizer on a corpus")
    train.add_argument("--vocab-size", type=int, default=10_000)
    train.add_argument("--special-token", action="append",
                       help=f"a special token (repeatable; default: {EOT})")
    train.add_argument("--pattern", default="gpt2", metavar="gpt2|cl100k|o200k|REGEX",
                       help="the pre-tokenization pattern (default: GPT-2's)")
    train.add_argument("--out", default=DEFAULT_TOKENIZER_DIR,
                       help="directory for vocab.json, merges.txt and nbbpe.json (default: %(default)s)")
    _add_source_options(train, "train")
    train.set_defaults(run=cmd_train)

    encode = sub.add_parser("encode", help="encode a corpus into a flat token file (np.memmap-able)")
    encode.add_argument("-o", "--output",
                        help="token file to write, or with --shard-bytes the shard directory "
                             "(default: out/<source name>.bin, or out/<source name>); "
                             "`nbbpe encode CORPUS OUT` still works")
    encode.add_argument("--tokenizer", default=DEFAULT_TOKENIZER_DIR,
                        help="directory written by `nbbpe train` (default: %(default)s)")
    encode.add_argument("--special-token", action="append",
                        help="special token, only for a directory with just vocab.json + merges.txt")
    encode.add_argument("--dtype", choices=["auto", "uint16", "uint32", "int32", "int64"], default="auto",
                        help="id type (default: uint16 if the vocab has at most 65,536 ids, else uint32)")
    encode.add_argument("--separator", default="auto",
                        help="the special token put after each JSONL/Parquet document: auto "
                             f"({EOT} if the tokenizer has it), none, or a special token")
    encode.add_argument("--shard-bytes", type=_byte_size, default=None, metavar="SIZE",
                        help="write a directory of shards of about SIZE bytes of input each "
                             "(e.g. 256M) with an index.json, instead of one file")
    _add_source_options(encode, "encode")
    encode.set_defaults(run=cmd_encode)

    info = sub.add_parser("info", help="vocab size, longest tokens and compression of a tokenizer")
    info.add_argument("tokenizer", nargs="?", default=DEFAULT_TOKENIZER_DIR,
                      help="directory written by `nbbpe train` (default: %(default)s)")
    info.add_argument("--special-token", action="append",
                      help="special token, only for a directory with just vocab.json + merges.txt")
    info.add_argument("--sample", help="text to measure compression on (default: the shipped sample)")
    info.add_argument("--sample-bytes", type=_positive_int, default=1 << 20,
                      help="how much of it (default: 1 MiB)")
    info.add_argument("--top", type=_positive_int, default=5, help="how many longest tokens to show")
    info.set_defaults(run=cmd_info)
    return parser


# The library's messages name its keyword arguments; on the command line, name the options.
_OPTION_NAMES = [("errors='replace'", "--errors replace"), ("text_field=", "--text-field"),
                 ("text_column=", "--text-column"), ("pass shard_bytes", "pass --shard-bytes"),
                 ("give num_workers or client, not both", "give --workers or --scheduler, not both"),
                 ("pretokenizer='regex' or 'auto'", "a pattern it implements")]


def command_line_message(exc: BaseException) -> str:
    message = str(exc)
    for keyword, option in _OPTION_NAMES:
        message = message.replace(keyword, option)
    return message


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "scheduler", None) and getattr(args, "workers", None):
        print(f"nbbpe {args.command}: error: give --workers or --scheduler, not both (the "
              "cluster has its workers)", file=sys.stderr)
        return 2
    try:
        return args.run(args)
    except (OSError, ValueError, TypeError, RuntimeError, ImportError) as exc:
        if os.environ.get("NBBPE_TRACEBACK"):  # where it came from, to report a bug
            traceback.print_exc()
        print(f"nbbpe {args.command}: error: {command_line_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"nbbpe {args.command}: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """The `nbbpe` command: `main`, then exit without collecting garbage. The process ends
    next, and collecting the objects Numba made while loading or compiling kernels took
    ~0.2 s of every command (files are closed by then; nothing is left to finalize)."""
    status = main()
    gc.freeze()
    sys.exit(status)


if __name__ == "__main__":
    run()
