"""CS336 assignment 1, train_bpe_tinystories: a 10K-vocab byte-level BPE on TinyStories.

    python scripts/fetch_data.py tinystories          # data/TinyStoriesV2-GPT4-train.txt (2.1 GB)
    python scripts/train_tinystories.py               # -> out/tinystories_10k/

Reports the wall time (with the pre-tokenization / merge split, i.e. where the time goes), the
peak memory (psutil, PSS summed over the process tree) and the longest token; saves the tokenizer
(`Tokenizer.load(out)` reads it back; `nbbpe encode --tokenizer out/...` uses it) and the report
as `train_report.json` beside it. `--corpus` trains on any other file, e.g. the small sample
shipped in the package (`--corpus sample`) where the dataset is not downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from nbbpe.cli import EOT, sample_corpus_path, train_and_report

DATASET = "TinyStories"
CORPUS = os.path.join("data", "TinyStoriesV2-GPT4-train.txt")
VOCAB_SIZE = 10_000
OUT = os.path.join("out", "tinystories_10k")


def run(argv: list[str] | None, *, dataset: str, corpus: str, vocab_size: int, out: str) -> int:
    parser = argparse.ArgumentParser(description=f"Train a {vocab_size:,}-token BPE on {dataset}.")
    parser.add_argument("--corpus", default=corpus,
                        help="text file, or 'sample' for the TinyStories sample shipped in nbbpe "
                             "(default: %(default)s)")
    parser.add_argument("--vocab-size", type=int, default=vocab_size)
    parser.add_argument("--special-token", action="append", help=f"default: {EOT}")
    parser.add_argument("--out", default=out, help="tokenizer directory (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=None, help="threads (default: one per CPU)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    path = sample_corpus_path() if args.corpus == "sample" else args.corpus
    if not os.path.exists(path):
        print(f"{path} not found: download {dataset} with scripts/fetch_data.py, or pass --corpus",
              file=sys.stderr)
        return 2
    report = train_and_report(path, args.vocab_size, args.special_token or [EOT], args.out,
                              num_workers=args.workers, progress=False if args.quiet else None)
    longest = report.pop("longest_token")
    report.update(dataset=dataset, longest_token=longest.decode("utf-8", errors="replace"),
                  longest_token_hex=longest.hex(), longest_token_bytes=len(longest))
    report_path = os.path.join(args.out, "train_report.json")
    with open(report_path, "w", encoding="utf-8") as f:
        json.dump(report, f, ensure_ascii=False, indent=1)
    print(f"report          {report_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(argv, dataset=DATASET, corpus=CORPUS, vocab_size=VOCAB_SIZE, out=OUT)


if __name__ == "__main__":
    sys.exit(main())
