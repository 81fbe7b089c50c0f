"""The `nbbpe` command line."""

from __future__ import annotations

import argparse
import os
import sys
import time
from importlib import resources

import psutil

SAMPLE_CORPUS = "tinystories_sample.txt"


def sample_corpus_path() -> str:
    """The small real TinyStories sample shipped in the package (CDLA-Sharing-1.0)."""
    return str(resources.files("nbbpe") / "data" / SAMPLE_CORPUS)


def _peak_rss_mb() -> float:
    """Peak resident memory of this process and its (finished) children, in MB."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024  # ru_maxrss is in KiB on Linux


def cmd_train(args: argparse.Namespace) -> int:
    from .train import train_bpe
    from .vocab_files import save_gpt2_files

    corpus = args.corpus or sample_corpus_path()
    specials = args.special_token if args.special_token is not None else ["<|endoftext|>"]
    timings: dict = {}
    start = time.perf_counter()
    vocab, merges = train_bpe(
        corpus,
        args.vocab_size,
        specials,
        num_workers=args.workers,
        progress=None if not args.quiet else False,
        timings=timings,
    )
    wall = time.perf_counter() - start
    vocab_path, merges_path = save_gpt2_files(vocab, merges, args.out)
    longest = max(vocab.values(), key=len)
    size = os.path.getsize(corpus)
    print(f"corpus          {corpus} ({size / 1e6:.1f} MB)")
    print(f"vocab           {len(vocab)} ids, {len(merges)} merges, specials {specials}")
    print(f"wall time       {wall:.2f} s (pre-tokenize {timings['pretokenize']:.2f} s, "
          f"merge {timings['merge']:.2f} s)")
    print(f"peak RSS        {_peak_rss_mb():.0f} MB (this process: "
          f"{psutil.Process().memory_info().rss / 1e6:.0f} MB now)")
    print(f"longest token   {len(longest)} bytes: {longest.decode('utf-8', errors='replace')!r}")
    print(f"saved           {vocab_path}, {merges_path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nbbpe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a byte-level BPE tokenizer on a text file")
    train.add_argument("corpus", nargs="?", help="UTF-8 text file (default: the shipped TinyStories sample)")
    train.add_argument("--vocab-size", type=int, default=10_000)
    train.add_argument("--special-token", action="append",
                       help="a special token (repeatable; default: <|endoftext|>)")
    train.add_argument("--workers", type=int, default=None, help="processes (default: one per CPU)")
    train.add_argument("--out", default="out/tokenizer", help="directory for vocab.json and merges.txt")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(run=cmd_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (OSError, ValueError, TypeError) as exc:
        print(f"nbbpe {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
