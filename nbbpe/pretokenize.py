"""Pre-tokenization and counting: a source's documents -> unique pre-tokens with their counts.

Special tokens are cut out of each document first (never counted, and no pre-token crosses one
or a document boundary); the stretches between them are split with the pattern. The reference
semantics are those of the `regex` module running the pattern over each stretch (`PreTokenizer`);
for the patterns a compiled scanner implements, `pretokenize_kernels.PretokenCounter` counts in
one compiled pass, and for any other pattern `RegexPretokenCounter` does it with `regex`.

`count_pretokens_in_source` plans units of work (`sources.py`) and counts them on an executor:
the local threads (`workers.LocalExecutor`) or a Dask cluster (`distributed.DaskExecutor`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .corpus import DEFAULT_CHUNK_BYTES, check_errors_policy, decoded_documents
from .patterns import (GPT2_PATTERN, compile_pattern, scanner_family, special_token_regex,
                       validate_special_tokens)

PRETOKENIZERS = ("auto", "compiled", "regex")


class PreTokenizer:
    """Splits text into pre-tokens with the `regex` module (the reference implementation)."""

    def __init__(self, pattern: str = GPT2_PATTERN, special_tokens: Sequence[str] = ()):
        self.pattern = pattern
        self.special_tokens = list(special_tokens)
        self._compiled = compile_pattern(pattern)
        self._specials = special_token_regex(self.special_tokens)

    def segments(self, text: str) -> list[str]:
        """The stretches of text between special tokens (the special tokens themselves dropped)."""
        if self._specials is None:
            return [text]
        return self._specials.split(text)

    def pretokens(self, text: str) -> list[str]:
        """All pre-tokens of `text`, in order, special tokens left out."""
        out: list[str] = []
        for segment in self.segments(text):
            out.extend(self._compiled.findall(segment, concurrent=True))
        return out

    def count_into(self, counts: Counter, text: str) -> None:
        """Add the pre-token counts of `text` to `counts` (a Counter of str)."""
        for segment in self.segments(text):
            # concurrent=True: regex releases the GIL while matching, so threads run in parallel
            counts.update(self._compiled.findall(segment, concurrent=True))


# --- counting pre-tokens ------------------------------------------------------------------------


class RegexPretokenCounter:
    """Counts pre-tokens of any pattern with `regex`: the reference path.

    Same interface as the compiled `pretokenize_kernels.PretokenCounter`: `add` batches of UTF-8
    documents, then take `result()`, the unique pre-tokens with their counts as flat arrays.
    """

    def __init__(self, pattern: str, special_tokens: Sequence[str] = (), errors: str = "strict"):
        check_errors_policy(errors)
        self.errors = errors
        self._pretokenizer = PreTokenizer(pattern, special_tokens)
        self._counts: Counter = Counter()

    def add(self, buf, doc_ends=None, *, place=None, offset_base: int | None = None) -> None:
        buf = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
        if place is None:
            def place(offset):
                return f"buffer byte {offset}"
        # decoding checks the UTF-8: no kernel to compile on this path (see sources.SMALL_SOURCE)
        for text in decoded_documents(buf, doc_ends, self.errors, place, offset_base):
            self._pretokenizer.count_into(self._counts, text)

    def result(self):
        from .pretokenize_kernels import PretokenCounts

        return PretokenCounts.from_dict({word.encode("utf-8"): count
                                         for word, count in self._counts.items()})


def pretokenizer_family(pattern: str, pretokenizer: str = "auto") -> str | None:
    """The compiled scanner family `pretokenizer` ("auto", "compiled", "regex") means for
    `pattern`, or None for the `regex` path."""
    if pretokenizer not in PRETOKENIZERS:
        raise ValueError(f"pretokenizer must be one of {PRETOKENIZERS}, got {pretokenizer!r}")
    family = scanner_family(pattern)
    if pretokenizer == "compiled" and family is None:
        raise ValueError("no compiled pre-tokenizer implements this pattern; it implements "
                         "GPT-2's, cl100k's and o200k's (nbbpe.GPT2_PATTERN, CL100K_PATTERN, "
                         "O200K_PATTERN); use pretokenizer='regex' or 'auto'")
    return None if pretokenizer == "regex" else family


def counting_compiles(pattern: str, pretokenizer: str) -> bool:
    """Whether counting with `pretokenizer` compiles a kernel (a first run of the compiled path)."""
    family = pretokenizer_family(pattern, pretokenizer)
    if family is None:
        return False
    from .pretokenize_kernels import counter_is_compiled

    return not counter_is_compiled(family)


def source_pretokenizer(files, pattern: str, pretokenizer: str, executor=None) -> str:
    """The pre-tokenizer to count `files` (from `sources.resolve_source`) with: "regex" for
    "auto" on a small local source when the compiled counter would be compiled for it (see
    `sources.SMALL_SOURCE`), else `pretokenizer`. Both count the same."""
    from .sources import small_local_source

    family = pretokenizer_family(pattern, pretokenizer)
    if pretokenizer != "auto" or family is None or not small_local_source(files, executor):
        return pretokenizer
    return "regex" if counting_compiles(pattern, pretokenizer) else pretokenizer


def make_pretoken_counter(pattern: str, special_tokens: Sequence[str], errors: str,
                          pretokenizer: str = "auto"):
    """A counter for `pattern`: compiled where a scanner implements it ("auto"), else `regex`."""
    family = pretokenizer_family(pattern, pretokenizer)
    if family is not None:
        from .pretokenize_kernels import PretokenCounter

        return PretokenCounter(family, special_tokens, errors)
    compile_pattern(pattern)
    return RegexPretokenCounter(pattern, special_tokens, errors)


def check_counting(pattern: str, special_tokens: Sequence[str], errors: str,
                   pretokenizer: str) -> None:
    """Raise for arguments counting would refuse (the error policy, the pre-tokenizer, the
    pattern, the special tokens), before any source is read; without importing the kernels."""
    check_errors_policy(errors)
    pretokenizer_family(pattern, pretokenizer)
    compile_pattern(pattern)
    validate_special_tokens(special_tokens)


class UnitCounter:
    """A worker's state when counting: one table of unique pre-tokens for all the units (or
    batches) it is given, so its size is bounded by the unique pre-tokens, not the corpus."""

    def __init__(self, counter_args: tuple, errors: str, chunk_bytes: int):
        self.counter = make_pretoken_counter(*counter_args)
        self.errors = errors
        self.chunk_bytes = chunk_bytes

    def add(self, unit) -> int:
        """Count a unit of work (or one batch); return its bytes, for progress."""
        from .sources import Batch, read_unit

        batches = [unit] if isinstance(unit, Batch) else read_unit(
            unit, chunk_bytes=self.chunk_bytes, errors=self.errors)
        done = 0
        for batch in batches:
            base = batch.where.first if batch.where.kind == "byte" else None
            self.counter.add(batch.data, batch.doc_ends, place=batch.place, offset_base=base)
            done += len(batch.data)
        return done

    def finish(self):
        return self.counter.result()


def count_pretokens_in_source(
    source,
    special_tokens: Sequence[str],
    *,
    pattern: str = GPT2_PATTERN,
    pretokenizer: str = "auto",
    executor=None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    errors: str = "strict",
    progress: bool = False,
    text_field: str = "text",
    text_column: str = "text",
    meanwhile: Callable[[], object] | None = None,
):
    """Count every pre-token of a source (see `sources.resolve_source`), special tokens cut out.

    Returns a `PretokenCounts` table (unique pre-tokens as UTF-8 bytes, with counts). `executor`
    runs the units (default: the local threads). `meanwhile`, if given, is called once in
    another thread while the workers count (e.g. to load compiled kernels needed next), after
    the counting kernel, if any, is loaded here.
    "auto" counts a small source with `regex` on a first run (`source_pretokenizer`).
    """
    from .sources import plan_units, resolve_source

    check_counting(pattern, special_tokens, errors, pretokenizer)  # before any work
    files = resolve_source(source, text_field=text_field, text_column=text_column)
    pretokenizer = source_pretokenizer(files, pattern, pretokenizer, executor)
    counter_args = (pattern, list(special_tokens), errors, pretokenizer)
    units = plan_units(files, chunk_bytes=chunk_bytes, special_tokens=special_tokens,
                       pattern=pattern)
    total = sum(file.size for file in files)
    return count_items(units, counter_args, executor=executor, errors=errors,
                       chunk_bytes=chunk_bytes, progress=progress, total=total,
                       meanwhile=meanwhile)


def count_pretokens_in_texts(texts: Iterable[str], special_tokens: Sequence[str], *,
                             pattern: str = GPT2_PATTERN, pretokenizer: str = "auto",
                             executor=None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                             errors: str = "strict", progress: bool = False,
                             meanwhile: Callable[[], object] | None = None):
    """Count every pre-token of an iterable of str, each a document (read once, lazily)."""
    from .sources import iter_text_batches

    check_counting(pattern, special_tokens, errors, pretokenizer)
    counter_args = (pattern, list(special_tokens), errors, pretokenizer)
    batches = iter_text_batches(texts, batch_bytes=chunk_bytes, errors=errors)
    return count_items(batches, counter_args, executor=executor, errors=errors,
                       chunk_bytes=chunk_bytes, progress=progress, total=None,
                       meanwhile=meanwhile)


def count_items(items, counter_args, *, executor, errors, chunk_bytes, progress, total, meanwhile):
    """Count units of work or batches on `executor` (the first error in source order is the
    one raised: see `workers.LocalExecutor`)."""
    # tqdm here, not at `import nbbpe` (~30 ms), and before any thread starts: an import in one
    # thread while another loads kernels failed once ("dictionary changed size during
    # iteration", in a benchmark's training, not reproduced since)
    from tqdm import tqdm

    from .pretokenize_kernels import merge_counts
    from .workers import LocalExecutor

    executor = LocalExecutor() if executor is None else executor
    if (pretokenizer_family(counter_args[0], counter_args[3]) is not None
            and not getattr(executor, "remote", False)):  # a cluster's workers load their own
        _load_counting_kernel_here(counter_args)
    helper = None
    if meanwhile is not None:
        helper = threading.Thread(target=meanwhile, name="nbbpe-meanwhile", daemon=True)
        helper.start()
    with tqdm(total=total, unit="B", unit_scale=True, desc="pre-tokenize",
              disable=not progress) as bar:
        counts = executor.accumulate(_UnitCounterFactory(counter_args, errors, chunk_bytes),
                                     items, merge_counts, progress=bar.update)
    if helper is not None:
        helper.join()
    return counts


def _load_counting_kernel_here(counter_args) -> None:
    """Load the counting kernel, and Numba's modules with it, before the counting threads start
    (and `meanwhile` beside them). Loading kernels imports modules that register types with the
    `typeof` dispatch every kernel call goes through, and Python's `singledispatch` is not safe
    against that: a thread's kernel call while another thread loaded the merge kernels is the
    likely cause of two failures with "dictionary changed size during iteration" (a CLI
    training, a benchmark's). Once the counting kernel is loaded, loading the merge kernels
    imported no module and registered no type (checked), and took 0.02 s. A warm `nbbpe train`
    of the shipped sample takes ~0.1 s more (the two loads no longer overlap: medians 1.31
    against 1.20 s and 1.43 against 1.33 s, two sets of 6 and 10 alternated runs)."""
    make_pretoken_counter(*counter_args).add(b"load the kernel")


class _UnitCounterFactory:
    """`UnitCounter(...)` as a picklable callable (Dask sends it to other machines)."""

    def __init__(self, counter_args: tuple, errors: str, chunk_bytes: int):
        self.args = (counter_args, errors, chunk_bytes)

    def __call__(self) -> UnitCounter:
        return UnitCounter(*self.args)
