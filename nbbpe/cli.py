"""The `nbbpe` command line: train a tokenizer, encode a text file into a token file, inspect.

    nbbpe train [CORPUS] --vocab-size 10000 --special-token '<|endoftext|>' --out out/tokenizer
    nbbpe encode --tokenizer out/tokenizer [CORPUS] [OUT.bin]
    nbbpe info [out/tokenizer]

Without CORPUS, `train` and `encode` use the small real TinyStories sample shipped in the package,
so `nbbpe train && nbbpe encode` works on a fresh machine with no download. Progress bars go to
stderr when it is a terminal (`--quiet` turns them off).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
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


# --- train --------------------------------------------------------------------------------------


def train_and_report(corpus: str, vocab_size: int, special_tokens: list[str], out: str, *,
                     num_workers: int | None = None, progress: bool | None = None,
                     print_=print) -> dict:
    """Train on `corpus`, save the tokenizer into `out` (`Tokenizer.load` reads it back), and
    report wall time, peak memory and the longest token. Returns what was reported."""
    from .corpus import check_corpus_path
    from .tokenizer import Tokenizer
    from .train import train_bpe

    size = check_corpus_path(corpus)
    print_(f"corpus          {corpus} ({size / 1e6:.1f} MB)")
    timings: dict = {}
    start = time.perf_counter()
    with PeakMemory() as memory:
        vocab, merges = train_bpe(corpus, vocab_size, special_tokens, num_workers=num_workers,
                                  progress=progress, timings=timings)
    wall = time.perf_counter() - start
    paths = Tokenizer(vocab, merges, special_tokens).save(out)
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
    train_and_report(args.corpus or sample_corpus_path(), args.vocab_size, specials, args.out,
                     num_workers=args.workers, progress=False if args.quiet else None)
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


def default_output_path(corpus: str) -> str:
    stem = os.path.splitext(os.path.basename(corpus))[0]
    return os.path.join("out", f"{stem}.bin")


def cmd_encode(args: argparse.Namespace) -> int:
    from .token_files import encode_file

    corpus = args.corpus or sample_corpus_path()
    output = args.output or default_output_path(corpus)
    tokenizer = load_tokenizer_dir(args.tokenizer, args.special_token)
    start = time.perf_counter()
    with PeakMemory() as memory:
        result = encode_file(tokenizer, corpus, output, num_workers=args.workers,
                             dtype=None if args.dtype == "auto" else args.dtype,
                             chunk_bytes=int(args.chunk_mb * (1 << 20)), errors=args.errors,
                             progress=False if args.quiet else None)
    wall = time.perf_counter() - start
    size = result.source_bytes
    print(f"corpus          {corpus} ({size / 1e6:.1f} MB)")
    print(f"tokenizer       {args.tokenizer} ({tokenizer.n_vocab} ids, "
          f"sha256 {result.tokenizer_sha256[:16]}…)")
    print(f"tokens          {result.num_tokens:,} {result.dtype} "
          f"({size / max(result.num_tokens, 1):.2f} bytes/token)")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nbbpe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a byte-level BPE tokenizer on a text file")
    train.add_argument("corpus", nargs="?", help="UTF-8 text file (default: the shipped TinyStories sample)")
    train.add_argument("--vocab-size", type=int, default=10_000)
    train.add_argument("--special-token", action="append",
                       help=f"a special token (repeatable; default: {EOT})")
    train.add_argument("--workers", type=_positive_int, default=None, help="processes (default: one per CPU)")
    train.add_argument("--out", default=DEFAULT_TOKENIZER_DIR,
                       help="directory for vocab.json, merges.txt and nbbpe.json (default: %(default)s)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(run=cmd_train)

    encode = sub.add_parser("encode", help="encode a text file into a flat token file (np.memmap-able)")
    encode.add_argument("corpus", nargs="?", help="UTF-8 text file (default: the shipped TinyStories sample)")
    encode.add_argument("output", nargs="?", help="token file to write (default: out/<corpus name>.bin)")
    encode.add_argument("--tokenizer", default=DEFAULT_TOKENIZER_DIR,
                        help="directory written by `nbbpe train` (default: %(default)s)")
    encode.add_argument("--special-token", action="append",
                        help="special token, only for a directory with just vocab.json + merges.txt")
    encode.add_argument("--workers", type=_positive_int, default=None, help="processes (default: one per CPU)")
    encode.add_argument("--dtype", choices=["auto", "uint16", "uint32", "int32", "int64"], default="auto",
                        help="id type (default: uint16 if the vocab has at most 65,536 ids, else uint32)")
    encode.add_argument("--chunk-mb", type=float, default=2.0, help="MB of text per task (default: 2)")
    encode.add_argument("--errors", choices=["strict", "replace"], default="strict",
                        help="invalid UTF-8: raise (strict, the default) or read as U+FFFD (replace)")
    encode.add_argument("--quiet", action="store_true", help="no progress bar")
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (OSError, ValueError, TypeError, RuntimeError) as exc:
        print(f"nbbpe {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"nbbpe {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
