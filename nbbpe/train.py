"""Training: corpus file -> (vocab, merges) with the exact CS336 semantics."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from tqdm import tqdm

from .corpus import DEFAULT_CHUNK_BYTES
from .intern import intern_words
from .merge import learn_merges, load_merge_kernels, merge_progress
from .pretokenize import GPT2_PATTERN, count_pretokens_in_file, validate_special_tokens

_MERGES_PER_REPORT = 64  # how often the merge kernel updates the progress bar

Vocab = dict[int, bytes]
Merges = list[tuple[bytes, bytes]]


def train_bpe(
    input_path: str | os.PathLike,
    vocab_size: int,
    special_tokens: Iterable[str] | None = None,
    *,
    num_workers: int | None = None,
    pattern: str = GPT2_PATTERN,
    pretokenizer: str = "auto",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    errors: str = "strict",
    progress: bool | None = None,
    timings: dict | None = None,
) -> tuple[Vocab, Merges]:
    """Train a byte-level BPE tokenizer on the text file at `input_path`.

    Returns `vocab` (id -> bytes: ids 0-255 are the single bytes, then the special tokens in the
    order given, then one id per merge in order of creation) and `merges` (the (left, right)
    byte pairs in order of creation). Special tokens are cut out of the text before
    pre-tokenization, so they never take part in counts and no merge crosses them. Each round
    merges the most frequent pair, ties going to the greatest (left bytes, right bytes).

    Options: `num_workers` processes pre-tokenize chunks of about `chunk_bytes` (default: one per
    CPU); `pattern` is the pre-tokenization regex (GPT-2's by default); `pretokenizer` is "auto"
    (the compiled scanner for GPT-2's pattern, `regex` for any other) or "regex" (the reference
    path, for any pattern); `errors` is the policy for
    invalid UTF-8 ("strict" raises naming the byte offset, "replace" reads it as U+FFFD);
    `progress` shows a progress bar (default: when stderr is a terminal); `timings`, if given a
    dict, receives the seconds spent in each phase.
    """
    specials = validate_special_tokens(special_tokens)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    smallest = 256 + len(specials)
    if vocab_size < smallest:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: the 256 byte tokens and "
            f"{len(specials)} special token(s) alone need {smallest}"
        )
    if progress is None:
        progress = _stderr_is_terminal()

    t0 = time.perf_counter()
    counts = count_pretokens_in_file(
        input_path,
        specials,
        pattern=pattern,
        pretokenizer=pretokenizer,
        num_workers=num_workers,
        chunk_bytes=chunk_bytes,
        errors=errors,
        progress=progress,
        meanwhile=load_merge_kernels,
    )
    t1 = time.perf_counter()
    words = intern_words(counts)
    del counts
    t2 = time.perf_counter()
    num_merges = vocab_size - smallest
    with tqdm(total=num_merges, unit="merge", desc="merge", disable=not progress) as bar:
        with merge_progress(lambda done: bar.update(done - bar.n)):
            left, right = learn_merges(words.tokens, words.offsets, words.counts, num_merges,
                                       report_every=_MERGES_PER_REPORT if progress else 0)
        bar.update(len(left) - bar.n)
    t3 = time.perf_counter()

    vocab: Vocab = {i: bytes([i]) for i in range(256)}
    for token in specials:
        vocab[len(vocab)] = token.encode("utf-8")
    token_bytes = [bytes([i]) for i in range(256)]  # by merge-kernel id: 256 + k is merge k
    merges: Merges = []
    for a, b in zip(left.tolist(), right.tolist()):
        pair = (token_bytes[a], token_bytes[b])
        merges.append(pair)
        token_bytes.append(pair[0] + pair[1])
        vocab[len(vocab)] = token_bytes[-1]
    if timings is not None:
        timings.update(pretokenize=t1 - t0, intern=t2 - t1, merge=t3 - t2,
                       total=time.perf_counter() - t0)
    return vocab, merges


def _stderr_is_terminal() -> bool:
    import sys

    return sys.stderr is not None and sys.stderr.isatty()
