"""Pre-tokenization: cut out special tokens, split text into pre-tokens, count them.

This is the stage where training and encoding spend most of their time. The reference semantics
are those of the `regex` module running the GPT-2 pattern over each stretch of text between
special tokens; every faster path in nbbpe is checked against this one.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import regex
from tqdm import tqdm

from .corpus import (
    DEFAULT_CHUNK_BYTES,
    check_corpus_path,
    check_errors_policy,
    chunk_boundaries,
    decode_utf8,
    read_range,
)

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)


def validate_special_tokens(special_tokens: Iterable[str] | None) -> list[str]:
    """Return the special tokens as a list, or raise naming what is wrong with them."""
    if special_tokens is None:
        return []
    if isinstance(special_tokens, (str, bytes)):
        raise TypeError(
            "special_tokens must be a list of strings, not a single "
            f"{type(special_tokens).__name__} (did you mean [{special_tokens!r}]?)"
        )
    tokens = list(special_tokens)
    seen: set[str] = set()
    for token in tokens:
        if not isinstance(token, str):
            raise TypeError(f"special token {token!r} is a {type(token).__name__}, not a str")
        if not token:
            raise ValueError("special tokens must be non-empty strings; got ''")
        if token in seen:
            raise ValueError(f"special token {token!r} is given more than once")
        seen.add(token)
    return tokens


def special_token_regex(special_tokens: Sequence[str]) -> regex.Pattern | None:
    """A regex matching any special token, longest first where several start at one place."""
    if not special_tokens:
        return None
    by_length = sorted(special_tokens, key=len, reverse=True)
    return regex.compile("|".join(regex.escape(token) for token in by_length))


class PreTokenizer:
    """Splits text into pre-tokens with the `regex` module (the reference implementation)."""

    def __init__(self, pattern: str = GPT2_PATTERN, special_tokens: Sequence[str] = ()):
        self.pattern = pattern
        self.special_tokens = list(special_tokens)
        self._compiled = regex.compile(pattern)
        self._specials = special_token_regex(self.special_tokens)

    def segments(self, text: str) -> list[str]:
        """The stretches of text between special tokens (the special tokens themselves dropped)."""
        if self._specials is None:
            return [text]
        return self._specials.split(text)

    def pretokens(self, text: str) -> list[str]:
        """All pre-tokens of `text`, in order, special tokens left out."""
        findall = self._compiled.findall
        out: list[str] = []
        for segment in self.segments(text):
            out.extend(findall(segment))
        return out

    def count_into(self, counts: Counter, text: str) -> None:
        """Add the pre-token counts of `text` to `counts` (a Counter of str)."""
        findall = self._compiled.findall
        for segment in self.segments(text):
            counts.update(findall(segment))


# --- counting pre-tokens ------------------------------------------------------------------------

PRETOKENIZERS = ("auto", "compiled", "regex")


class RegexPretokenCounter:
    """Counts pre-tokens of any pattern with `regex` across chunks: the reference path.

    Same interface as the compiled `pretokenize_kernels.PretokenCounter`: `add` UTF-8 chunks,
    then take `result()`, the unique pre-tokens with their counts as flat arrays.
    """

    def __init__(self, pattern: str, special_tokens: Sequence[str] = (), errors: str = "strict"):
        check_errors_policy(errors)
        self.errors = errors
        self._pretokenizer = PreTokenizer(pattern, special_tokens)
        self._counts: Counter = Counter()

    def add(self, buf, *, source: str = "buffer", offset: int = 0) -> None:
        text = decode_utf8(bytes(buf), self.errors, source=source, offset=offset)
        self._pretokenizer.count_into(self._counts, text)

    def result(self):
        from .pretokenize_kernels import PretokenCounts

        words = [word.encode("utf-8") for word in self._counts]
        offsets = np.zeros(len(words) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, words), dtype=np.int64, count=len(words)), out=offsets[1:])
        return PretokenCounts(
            np.frombuffer(b"".join(words), dtype=np.uint8).copy(),
            offsets,
            np.fromiter(self._counts.values(), dtype=np.int64, count=len(words)),
        )


def uses_compiled_pretokenizer(pattern: str, pretokenizer: str = "auto") -> bool:
    """Whether `pretokenizer` ("auto", "compiled" or "regex") means the compiled scanner here.

    The compiled scanner implements GPT-2's pattern only; "auto" takes it for that pattern.
    """
    if pretokenizer not in PRETOKENIZERS:
        raise ValueError(f"pretokenizer must be one of {PRETOKENIZERS}, got {pretokenizer!r}")
    if pretokenizer == "compiled" and pattern != GPT2_PATTERN:
        raise ValueError("the compiled pre-tokenizer implements only GPT2_PATTERN; "
                         "use pretokenizer='regex' (or 'auto') for other patterns")
    return pretokenizer != "regex" and pattern == GPT2_PATTERN


def make_pretoken_counter(pattern: str, special_tokens: Sequence[str], errors: str,
                          pretokenizer: str = "auto"):
    """A counter for `pattern`: the compiled one for GPT-2's pattern ("auto"), else `regex`."""
    if uses_compiled_pretokenizer(pattern, pretokenizer):
        from .pretokenize_kernels import PretokenCounter

        return PretokenCounter(special_tokens, errors)
    return RegexPretokenCounter(pattern, special_tokens, errors)


def _count_chunks(path, counter_args, tasks, results) -> None:
    """Worker: count the pre-tokens of each chunk range taken from `tasks` until a None.

    Counts accumulate in one table per worker (its size is bounded by the number of unique
    pre-tokens, not by the corpus size) and go back once, as flat arrays.
    """
    try:
        counter = make_pretoken_counter(*counter_args)
        for start, end in iter(tasks.get, None):
            counter.add(read_range(path, start, end), source=path, offset=start)
            results.put(("progress", end - start))
        results.put(("counts", counter.result()))
    except BaseException as exc:  # report every failure; the parent raises it
        results.put(("error", exc, traceback.format_exc()))


def default_num_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def count_pretokens_in_file(
    path: str | os.PathLike,
    special_tokens: Sequence[str],
    *,
    pattern: str = GPT2_PATTERN,
    pretokenizer: str = "auto",
    num_workers: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    errors: str = "strict",
    progress: bool = False,
    meanwhile: Callable[[], object] | None = None,
):
    """Count every pre-token of the file, special tokens cut out.

    Returns a `PretokenCounts` table (unique pre-tokens as UTF-8 bytes, with counts).
    `meanwhile`, if given, is called once in a thread of this process while worker processes
    count (e.g. to load compiled kernels needed next), or after counting when there are none.
    """
    size = check_corpus_path(path)
    counter_args = (pattern, list(special_tokens), errors, pretokenizer)
    counter = make_pretoken_counter(*counter_args)  # checks the arguments before any work
    num_workers = default_num_workers() if num_workers is None else num_workers
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive integer, got {num_workers!r}")
    bounds = chunk_boundaries(path, chunk_bytes, special_tokens, size=size)
    ranges = list(zip(bounds[:-1], bounds[1:]))
    num_workers = min(num_workers, len(ranges))
    path = os.fspath(path)

    bar = tqdm(total=size, unit="B", unit_scale=True, desc="pre-tokenize", disable=not progress)
    with bar:
        if num_workers == 1:
            for start, end in ranges:
                counter.add(read_range(path, start, end), source=path, offset=start)
                bar.update(end - start)
            if meanwhile is not None:
                meanwhile()
            return counter.result()
        # Load the counting kernels here, once, before forking: else each worker loads them.
        make_pretoken_counter(*counter_args).add(b"warm up")
        return _count_in_workers(path, counter_args, ranges, num_workers, bar, meanwhile)


def _count_in_workers(path, counter_args, ranges, num_workers, bar, meanwhile):
    from .pretokenize_kernels import merge_counts

    # fork starts workers at once and shares the imported modules; elsewhere, spawn.
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    tasks = context.Queue()
    results = context.Queue()
    for task in ranges:
        tasks.put(task)
    for _ in range(num_workers):
        tasks.put(None)
    workers = [
        context.Process(target=_count_chunks, args=(path, counter_args, tasks, results), daemon=True)
        for _ in range(num_workers)
    ]
    for worker in workers:
        worker.start()
    helper = None
    if meanwhile is not None:  # started after the forks: a forked thread could hold a lock
        helper = threading.Thread(target=meanwhile, name="nbbpe-meanwhile", daemon=True)
        helper.start()
    tables = []
    try:
        while len(tables) < num_workers:
            try:
                message = results.get(timeout=0.5)
            except queue.Empty:
                dead = [w for w in workers if w.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(
                        f"a pre-tokenization worker died (exit code {dead[0].exitcode}) "
                        f"while counting {path!r}; no result was produced"
                    ) from None
                continue
            kind = message[0]
            if kind == "progress":
                bar.update(message[1])
            elif kind == "error":
                raise message[1] from RuntimeError(f"in a pre-tokenization worker:\n{message[2]}")
            else:
                tables.append(message[1])
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
            worker.join()
        if helper is not None:
            helper.join()
    return merge_counts(tables)
