"""Random batches on threads against tiktoken, at nbbpe's real sizes: an exactness soak test.

    python scripts/soak_batches.py [CORPUS ...] [--pattern gpt2|cl100k|o200k] [--seconds 60]
        [--seed 0]

Each batch holds 1 to 500 texts. A text is either a slice of a corpus or a run of pieces
chosen to stress the scanners and the cuts between groups. The slices' lengths are drawn around
50, 2,000 or 100,000 characters. The pieces include special tokens (whole and in part), lone
surrogates, CR LF, NBSP, U+2028, combining marks, other scripts' digits and runs of spaces.
Three batches in ten also hold a slice of 200K to 1.5M characters, so that the batch goes on
threads and a text is cut between groups.

Each batch is encoded by `encode_batch_to_numpy` on 1, 2 or 3 threads. Every text's ids must be
tiktoken's `encode(text, allowed_special="all")`, and about one text in twenty is checked
through `Tokenizer.encode` too. The test suite runs these paths with smaller thresholds
(conftest) and hypothesis text; this runs them at the sizes users meet, for as long as asked.

Corpora: the shared ones by default, else the sample shipped in the package. It exits with 1
at the first difference and prints the text.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_encode  # noqa: E402
import bench_peers  # noqa: E402
import notebook_support  # noqa: E402

PIECES = ("a", " ", "  ", "\n", "\t", "\r\n", "é", "中", "🙂", "'s", "'", "1", "123", "\u00a0",
          "\u2028", "ǅ", "ΣΑΣ", "ŉ", "\u0301", "A\u0301b", "١٢٣", "<|endoftext", "|>", "\ud800",
          "\udfff", "x" * 50, " " * 40)


def build(pattern: str):
    """(nbbpe Tokenizer, tiktoken Encoding) for `pattern`, both from local files, with the same
    special tokens."""
    import tiktoken

    from nbbpe import Tokenizer, patterns

    reference = tiktoken.Encoding(**bench_peers.openai_spec(pattern))
    if pattern == "gpt2":
        tok = Tokenizer.from_files(bench_peers.GPT2_VOCAB, bench_peers.GPT2_MERGES, [bench_peers.EOT])
    else:
        regex = patterns.CL100K_PATTERN if pattern == "cl100k" else patterns.O200K_PATTERN
        tok = Tokenizer.from_tiktoken_file(bench_peers.tiktoken_file(pattern), regex,
                                           dict(reference._special_tokens))
    return tok, reference


def random_batch(rng: random.Random, corpora: list[str], specials: list[str]) -> list[str]:
    def text() -> str:
        if rng.random() < 0.5:
            corpus = rng.choice(corpora)
            start = rng.randrange(len(corpus))
            return corpus[start : start + int(rng.expovariate(1 / rng.choice((50, 2000, 100_000))))]
        pieces = PIECES + tuple(specials)
        return "".join(rng.choice(pieces) for _ in range(rng.randrange(300)))

    batch = [text() for _ in range(rng.choice((1, 2, 5, 50, 500)))]
    if rng.random() < 0.3:  # one long text: the batch goes on threads, and it is cut
        corpus = rng.choice(corpora)
        start = rng.randrange(len(corpus))
        batch.insert(rng.randrange(len(batch) + 1),
                     corpus[start : start + rng.randrange(200_000, 1_500_000)])
    return batch


def soak(tok, reference, corpora: list[str], seconds: float, seed: int) -> tuple[int, str | None]:
    """(batches checked, None), or (batches before it, a description of the first difference)."""
    rng = random.Random(seed)
    specials = sorted(reference.special_tokens_set)
    deadline = time.monotonic() + seconds
    batches = 0
    while time.monotonic() < deadline:
        batch = random_batch(rng, corpora, specials)
        threads = rng.choice((1, 2, 3))
        ids, offsets = tok.encode_batch_to_numpy(batch, num_threads=threads)
        if len(offsets) != len(batch) + 1:
            return batches, f"{len(offsets)} offsets for {len(batch)} texts ({threads} threads)"
        for k, text in enumerate(batch):
            want = reference.encode(text, allowed_special="all")
            if ids[offsets[k] : offsets[k + 1]].tolist() != want:
                return batches, f"text {k} of {len(batch)}, {threads} threads: {text[:300]!r}"
            if rng.random() < 0.05 and tok.encode(text) != want:
                return batches, f"encode of text {k}: {text[:300]!r}"
        batches += 1
    return batches, None


def default_corpora() -> list[str]:
    """The benchmarks' shared corpora (`bench_encode.default_corpora`), else the shipped sample."""
    if notebook_support.shared_corpora_dir() is not None:
        return bench_encode.default_corpora()
    from nbbpe.cli import sample_corpus_path

    return [sample_corpus_path()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpora", nargs="*", help="text files (default: the shared corpora)")
    parser.add_argument("--pattern", default="gpt2", choices=bench_peers.ENCODINGS)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = args.corpora or default_corpora()
    corpora = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            corpora.append(f.read())
    tok, reference = build(args.pattern)
    batches, difference = soak(tok, reference, corpora, args.seconds, args.seed)
    if difference is not None:
        print(f"DIFFERENT from tiktoken after {batches} batches (seed {args.seed}): {difference}")
        return 1
    print(f"{batches} batches, every text tiktoken's ids ({args.pattern}, seed {args.seed}, "
          f"{args.seconds:g} s, corpora: {', '.join(map(os.path.basename, paths))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
