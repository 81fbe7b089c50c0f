"""Pre-tokenization: cut out special tokens, split text into pre-tokens, count them.

This is the stage where training and encoding spend most of their time. The reference semantics
are those of the `regex` module running the GPT-2 pattern over each stretch of text between
special tokens; every faster path in nbbpe is checked against this one.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import regex
from tqdm import tqdm

from .corpus import (
    DEFAULT_CHUNK_BYTES,
    InvalidUTF8Error,
    check_corpus_path,
    check_errors_policy,
    chunk_boundaries,
    decode_utf8,
    first_invalid_utf8_error,
    read_range,
)
from .workers import WorkerPool, default_num_workers

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


class _ChunkCounter:
    """A worker's handler: counts the pre-tokens of each chunk (a byte range of the file) into
    one table for all its chunks, whose size is bounded by the number of unique pre-tokens, not
    by the corpus size; `finish` sends it back once, as flat arrays."""

    def __init__(self, path: str, counter_args: tuple):
        self.path = path
        self.counter = make_pretoken_counter(*counter_args)

    def __call__(self, byte_range: tuple[int, int]) -> int:
        start, end = byte_range
        self.counter.add(read_range(self.path, start, end), source=self.path, offset=start)
        return end - start

    def finish(self):
        return self.counter.result()


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

    def progress_bar():
        return tqdm(total=size, unit="B", unit_scale=True, desc="pre-tokenize", disable=not progress)

    if num_workers == 1:
        with progress_bar() as bar:
            for start, end in ranges:
                counter.add(read_range(path, start, end), source=path, offset=start)
                bar.update(end - start)
        if meanwhile is not None:
            meanwhile()
        return counter.result()
    # Load the counting kernels here, once, before forking: else each worker loads them.
    # (This counter served to check the arguments; the workers count with their own.)
    counter.add(b"warm up")
    return _count_in_workers(path, counter_args, ranges, num_workers, progress_bar, meanwhile)


def _count_in_workers(path, counter_args, ranges, num_workers, progress_bar, meanwhile):
    from .pretokenize_kernels import merge_counts

    with WorkerPool(_ChunkCounter, (path, counter_args), num_workers,
                    what=f"counting the pre-tokens of {path!r}") as pool, \
            progress_bar() as bar:  # after the fork: the bar's monitor thread must not be forked
        helper = None
        if meanwhile is not None:  # started after the forks: a forked thread could hold a lock
            helper = threading.Thread(target=meanwhile, name="nbbpe-meanwhile", daemon=True)
            helper.start()
        for index, byte_range in enumerate(ranges):
            pool.submit(index, byte_range)
        try:
            for _ in ranges:
                bar.update(pool.next_result()[1])
        except InvalidUTF8Error as error:
            raise first_invalid_utf8_error(path, ranges, error) from None
        tables = pool.finish()
        if helper is not None:
            helper.join()
    return merge_counts(tables)
