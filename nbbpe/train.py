"""Training: a corpus (a source, or an iterable of str) -> (vocab, merges), with the exact CS336
semantics: count the pre-tokens (pretokenize.py), intern them (intern.py), learn the merges
(merge.py)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextlib import contextmanager, nullcontext

from .corpus import DEFAULT_CHUNK_BYTES
from .intern import intern_words
from .merge_python import merges_in_python_for
from .patterns import GPT2_PATTERN, validate_special_tokens
from .pretokenize import (check_counting, count_pretokens_in_source, count_pretokens_in_texts,
                          counting_compiles, source_pretokenizer)
from .sources import resolve_source


Vocab = dict[int, bytes]
Merges = list[tuple[bytes, bytes]]


def train_bpe(
    source,
    vocab_size: int,
    special_tokens: Iterable[str] | None = None,
    *,
    num_workers: int | None = None,
    client=None,
    pattern: str = GPT2_PATTERN,
    pretokenizer: str = "auto",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    errors: str = "strict",
    text_field: str = "text",
    text_column: str = "text",
    progress: bool | None = None,
    timings: dict | None = None,
) -> tuple[Vocab, Merges]:
    """Train a byte-level BPE tokenizer on a corpus.

    `source` is a text file, or any source `nbbpe.sources` reads: a directory, a glob, a list,
    JSONL (`text_field`), Parquet (`text_column`), compressed files. Each JSONL line, Parquet row
    and file is a document; a document boundary is as hard as a special token.

    Returns `vocab` (id -> bytes: ids 0-255 are the single bytes, then the special tokens in the
    order given, then one id per merge in order of creation) and `merges` (the (left, right)
    byte pairs in order of creation). Special tokens are cut out of the text before
    pre-tokenization, so they never take part in counts and no merge crosses them. Each round
    merges the most frequent pair, ties going to the greatest (left bytes, right bytes).

    Options: `num_workers` threads count units of about `chunk_bytes` (default: one per CPU);
    `client`, a `distributed.Client`, counts on a Dask cluster instead (the merges run here);
    `pattern` is the pre-tokenization regex (GPT-2's by default; cl100k's and o200k's are
    compiled too); `pretokenizer` is "auto" (a compiled scanner where one implements the
    pattern, `regex` otherwise), "compiled" or "regex" (the reference path, for any pattern);
    `errors` is the policy for invalid UTF-8 ("strict" raises naming the place, "replace" reads
    it as U+FFFD); `progress` shows progress bars (default: when stderr is a terminal);
    `timings`, if given a dict, receives the seconds spent in each phase. The result does not
    depend on the number of workers, the chunk size or the cluster.
    """
    specials, num_merges, progress = _check_training(vocab_size, special_tokens, progress)
    t0 = time.perf_counter()
    executor = _executor(num_workers, client)
    check_counting(pattern, specials, errors, pretokenizer)  # before the source is looked at
    files = resolve_source(source, text_field=text_field, text_column=text_column)
    # a small first run compiles nothing: counted with `regex`, its merges learned in Python
    in_python = merges_in_python_for(files, executor, pretokenizer)
    pretokenizer = source_pretokenizer(files, pattern, pretokenizer, executor)
    with _merge_kernels_meanwhile(in_python) as (meanwhile, compile_helpers):
        compile_helpers(counting_compiles(pattern, pretokenizer))
        counts = count_pretokens_in_source(
            files, specials, pattern=pattern, pretokenizer=pretokenizer, executor=executor,
            chunk_bytes=chunk_bytes, errors=errors, progress=progress, meanwhile=meanwhile,
        )
    return _learn(counts, specials, num_merges, progress, timings, t0, in_python)


def train_bpe_from_iterator(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: Iterable[str] | None = None,
    *,
    num_workers: int | None = None,
    client=None,
    pattern: str = GPT2_PATTERN,
    pretokenizer: str = "auto",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    errors: str = "strict",
    progress: bool | None = None,
    timings: dict | None = None,
) -> tuple[Vocab, Merges]:
    """`train_bpe` on an iterable of str, each a document (e.g. a generator over a dataset).

    It is read once, lazily, in batches of about `chunk_bytes` counted in parallel, so memory
    stays bounded; the merges are those of a text file holding the documents joined by a
    special token. Lone surrogates in a string follow `errors` ("replace": U+FFFD).
    """
    specials, num_merges, progress = _check_training(vocab_size, special_tokens, progress)
    t0 = time.perf_counter()
    check_counting(pattern, specials, errors, pretokenizer)  # before the first text is read
    with _merge_kernels_meanwhile() as (meanwhile, compile_helpers):
        compile_helpers(counting_compiles(pattern, pretokenizer))
        counts = count_pretokens_in_texts(
            texts, specials, pattern=pattern, pretokenizer=pretokenizer,
            executor=_executor(num_workers, client), chunk_bytes=chunk_bytes, errors=errors,
            progress=progress, meanwhile=meanwhile,
        )
    return _learn(counts, specials, num_merges, progress, timings, t0)


@contextmanager
def _merge_kernels_meanwhile(in_python: bool = False):
    """While counting: (meanwhile, compile_helpers). The merge kernels are loaded from the cache
    in a thread (`meanwhile`, given to the counting), or, on a first run, compiled in another
    process started at once (then `meanwhile` is None), this one compiling some of their
    helpers first: `compile_helpers(counting_compiles)`, more of them if it compiles no
    counting kernel (`merge.compile_helpers`). Neither `in_python` (`merge_python`)."""
    if in_python:
        yield None, _nothing_to_compile
        return
    from .kernel_cache import cached, compile_elsewhere
    from .merge import compile_helpers, learn_merges, load_merge_kernels

    if cached(learn_merges):
        yield load_merge_kernels, _nothing_to_compile
        return
    with compile_elsewhere("from nbbpe.merge import load_merge_kernels; load_merge_kernels()"):
        yield None, lambda counting_compiles: compile_helpers(all_of_them=not counting_compiles)


def _nothing_to_compile(counting_compiles: bool) -> None:
    pass


def _check_training(vocab_size, special_tokens, progress):
    specials = validate_special_tokens(special_tokens)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    smallest = 256 + len(specials)
    if vocab_size < smallest:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: the 256 byte tokens and "
            f"{len(specials)} special token(s) alone need {smallest}"
        )
    return specials, vocab_size - smallest, _stderr_is_terminal() if progress is None else progress


def _executor(num_workers, client):
    """Where the counting runs: a Dask cluster if `client` is given, else local threads.

    `client` is a `distributed.Client`, a scheduler address, or an executor already made (e.g.
    `nbbpe.distributed.DaskExecutor(client, retries=5)`), used as it is."""
    if client is not None:
        if num_workers is not None:
            raise ValueError("give num_workers or client, not both (the cluster has its workers)")
        if hasattr(client, "accumulate") and hasattr(client, "map"):
            return client
        from .distributed import DaskExecutor

        return DaskExecutor(client)
    from .workers import LocalExecutor

    return LocalExecutor(num_workers)


def _learn(counts, specials, num_merges, progress, timings, t0, in_python=False):
    """The merge loop on counted pre-tokens (`in_python`: `merge_python`'s), and the vocab and
    merges it makes."""
    from tqdm import tqdm  # here, not at `import nbbpe` (~30 ms); no other thread runs now

    t1 = time.perf_counter()
    words = intern_words(counts)
    del counts
    t2 = time.perf_counter()
    with tqdm(total=num_merges, unit="merge", desc="merge", disable=not progress) as bar:
        if in_python:
            from .merge_python import TooMuchWork, learn_merges_in_python

            try:
                left, right = learn_merges_in_python(words.tokens, words.offsets, words.counts,
                                                     num_merges)
            except TooMuchWork:  # the kernel does it, compiled now, here
                from .kernel_cache import announce_compiling

                announce_compiling()
                in_python = False
        if not in_python:
            from .merge import merge_progress, merges_with_progress

            with (merge_progress(lambda done: bar.update(done - bar.n)) if progress
                  else nullcontext()):
                left, right = merges_with_progress(words.tokens, words.offsets, words.counts,
                                                   num_merges)
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
