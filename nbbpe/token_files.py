"""Token files: a text file encoded into one flat file of ids, for language-model training.

The output is what nanoGPT-style training reads with `np.memmap(path, dtype=..., mode="r")`:
the ids of the whole text, end to end, with no header. Beside it, `<output>.json` records how it
was made (dtype, token count, the tokenizer's hash, the source and its size).

How `encode_file` works, and why:

- the input is cut into chunks of about `chunk_bytes` at safe places (`corpus.chunk_boundaries`:
  at special tokens, i.e. document boundaries, or else between a letter or digit and a space or
  newline), where a cut cannot change any id; so the ids are those of `tokenizer.encode` on the
  whole text, whatever the number of workers or the chunk size;
- worker processes read and encode their own chunks; the parent writes the ids in file order,
  each chunk through a short-lived `np.memmap` window into a file it grows ahead of need and
  trims at the end. Workers run at most a few chunks ahead of the next one to be written, so
  memory is bounded by the chunk size, not the input size;
- the ids go to `<output>.partial`, which is renamed to `<output>` only when complete (and the
  old sidecar is removed before that rename, the new one written after it): a killed run leaves
  at most a `.partial` file, which the next run overwrites.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import json
import os
import time

import numpy as np
import psutil
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
from .tokenizer import Tokenizer
from .vocab_files import write_text_atomically
from .workers import WorkerPool, default_num_workers

SIDECAR_SUFFIX = ".json"
PARTIAL_SUFFIX = ".partial"
FORMAT = "nbbpe token file"
_GROW_BYTES = 64 << 20  # the output file is extended this much (at least) at a time


@dataclasses.dataclass(frozen=True)
class TokenFile:
    """What `encode_file` wrote: the token file, its sidecar and what they record."""

    path: str
    sidecar_path: str
    dtype: str
    num_tokens: int
    source: str
    source_bytes: int
    tokenizer_sha256: str
    seconds: float

    def sidecar(self) -> dict:
        return {
            "format": FORMAT,
            "version": 1,
            "dtype": self.dtype,
            "num_tokens": self.num_tokens,
            "tokenizer_sha256": self.tokenizer_sha256,
            "source": self.source,
            "source_bytes": self.source_bytes,
        }


def sidecar_path(output_path) -> str:
    return os.fspath(output_path) + SIDECAR_SUFFIX


def tokenizer_sha256(tokenizer: Tokenizer) -> str:
    """SHA-256 of what defines the ids: vocab, merges, special tokens and pattern.

    It depends on the tokenizer's content only, so it is the same however the tokenizer was
    loaded (GPT-2 files, pickles, `Tokenizer.load`) or built.
    """
    digest = hashlib.sha256(b"nbbpe tokenizer v1\0")

    def add_tokens(tokens: list[bytes]) -> None:  # lengths, then the bytes end to end
        digest.update(np.array([len(tokens)] + [len(t) for t in tokens], dtype="<i8").tobytes())
        digest.update(b"".join(tokens))

    ids = sorted(tokenizer.vocab)
    digest.update(np.array([len(ids)] + ids, dtype="<i8").tobytes())
    add_tokens([tokenizer.vocab[i] for i in ids])
    add_tokens([side for pair in tokenizer.merges for side in pair])
    add_tokens([json.dumps(list(tokenizer.special_tokens)).encode("utf-8"),
                tokenizer.pattern.encode("utf-8")])
    return digest.hexdigest()


def _chunk_encoder(tokenizer: Tokenizer, path: str, dtype: np.dtype, errors: str):
    """The work on one chunk (a worker's handler): read the byte range, decode it, encode it."""
    trim_heap = _HeapTrimmer()

    def encode_chunk(byte_range: tuple[int, int]) -> np.ndarray:
        start, end = byte_range
        text = decode_utf8(read_range(path, start, end), errors, source=path, offset=start)
        ids = tokenizer.encode_to_numpy(text, dtype=dtype)
        del text
        trim_heap()
        return ids

    return encode_chunk


class _HeapTrimmer:
    """Gives freed memory back to the OS once this process's RSS has grown by `slack` bytes.

    Each chunk allocates and frees buffers of a few MB (bytes, text, arrays) whose sizes vary;
    glibc's malloc keeps them in its heap, which fragments, and RSS creeps up with the input
    size (about 80 MB over 400 MB of text). `malloc_trim` hands the free pages back; calling it
    only after such growth keeps its cost (faulting the pages in again) small. A no-op where
    there is no glibc.
    """

    def __init__(self, slack: int = 32 << 20):
        self._trim = _malloc_trim()
        self._process = psutil.Process()
        self._slack = slack
        self._limit = self._process.memory_info().rss + slack

    def __call__(self) -> None:
        if self._trim is not None and self._process.memory_info().rss > self._limit:
            self._trim(0)
            self._limit = self._process.memory_info().rss + self._slack


def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


class _GrowingTokenWriter:
    """Appends ids to a file through `np.memmap` windows; the file grows ahead and is trimmed."""

    def __init__(self, path: str, dtype: np.dtype):
        self.path = path
        self.dtype = dtype
        self.num_tokens = 0
        self._file = open(path, "w+b")  # truncates what a killed run left
        self._capacity = 0  # bytes

    def append(self, ids: np.ndarray) -> None:
        if not len(ids):
            return
        start = self.num_tokens * self.dtype.itemsize
        end = start + len(ids) * self.dtype.itemsize
        if end > self._capacity:
            self._capacity = max(end, self._capacity + max(_GROW_BYTES, self._capacity // 8))
            os.ftruncate(self._file.fileno(), self._capacity)  # sparse: no data written yet
        # A window per chunk: once unmapped, its pages leave this process's RSS.
        window = np.memmap(self._file, dtype=self.dtype, mode="r+", offset=start, shape=(len(ids),))
        window[:] = ids
        del window
        self.num_tokens += len(ids)

    def finish(self) -> None:
        """Trim the file to the ids written and make it durable."""
        os.ftruncate(self._file.fileno(), self.num_tokens * self.dtype.itemsize)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def close(self) -> None:
        self._file.close()


def _check_paths(input_path, output_path) -> tuple[str, str]:
    for name, value in (("input_path", input_path), ("output_path", output_path)):
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name} must be a str or os.PathLike, got {type(value).__name__}")
    input_path, output_path = os.fspath(input_path), os.fspath(output_path)
    if os.path.isdir(output_path):
        raise IsADirectoryError(f"output path is a directory, not a file: {output_path!r}")
    if os.path.abspath(output_path) == os.path.abspath(input_path) or (
        os.path.exists(output_path) and os.path.exists(input_path)
        and os.path.samefile(input_path, output_path)
    ):
        raise ValueError(f"output path {output_path!r} is the input file; it would be overwritten")
    return input_path, output_path


def encode_file(
    tokenizer: Tokenizer,
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    *,
    num_workers: int | None = None,
    dtype=None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    errors: str = "strict",
    progress: bool | None = None,
) -> TokenFile:
    """Encode the text file at `input_path` into a flat token file at `output_path`.

    The file holds `tokenizer.encode(<whole text>)` as `dtype` (default: uint16 if the vocab has
    at most 65,536 ids, else uint32), with no header; read it with
    `np.memmap(output_path, dtype=..., mode="r")` or `open_token_file(output_path)`. A sidecar
    `<output_path>.json` records the dtype, the number of tokens, the tokenizer's hash
    (`tokenizer_sha256`) and the source's path and size.

    Options: `num_workers` processes encode chunks of about `chunk_bytes` (default: one per CPU;
    the ids do not depend on either); `errors` is the policy for invalid UTF-8 ("strict" raises
    naming the byte offset, "replace" reads it as U+FFFD); `progress` shows a progress bar with
    bytes done, MB/s and time left (default: when stderr is a terminal).

    The output appears only when complete (written as `<output_path>.partial`, then renamed);
    missing parent directories are created. Chunks are cut at special tokens or between a letter
    or digit and a space or newline: safe for GPT-2's and cl100k's patterns (a custom pattern must
    also end a pre-token there). A stretch with no such place is encoded as one chunk.
    """
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be an nbbpe Tokenizer, got {type(tokenizer).__name__}")
    input_path, output_path = _check_paths(input_path, output_path)
    size = check_corpus_path(input_path)
    check_errors_policy(errors)
    dtype = tokenizer.id_dtype(dtype)
    num_workers = default_num_workers() if num_workers is None else num_workers
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive integer, got {num_workers!r}")
    if progress is None:
        progress = _stderr_is_terminal()

    start_time = time.perf_counter()
    bounds = chunk_boundaries(input_path, chunk_bytes, tokenizer.special_tokens, size=size)
    ranges = list(zip(bounds[:-1], bounds[1:]))
    num_workers = min(num_workers, len(ranges))
    directory = os.path.dirname(os.path.abspath(output_path))
    os.makedirs(directory, exist_ok=True)
    partial = output_path + PARTIAL_SUFFIX
    writer = _GrowingTokenWriter(partial, dtype)
    try:
        with contextlib.ExitStack() as stack:
            pool = None
            if num_workers > 1:
                # Load the encoding kernels here, once, before forking: else each worker loads them.
                tokenizer.encode_to_numpy("warm up", dtype=dtype)
                pool = stack.enter_context(WorkerPool(
                    _chunk_encoder, (tokenizer, input_path, dtype, errors), num_workers,
                    what=f"encoding {input_path!r}"))
            # The bar after the fork: its monitor thread must not be running while forking.
            bar = stack.enter_context(
                tqdm(total=size, unit="B", unit_scale=True, desc="encode", disable=not progress))
            if pool is None:
                encode_chunk = _chunk_encoder(tokenizer, input_path, dtype, errors)
                for byte_range in ranges:
                    writer.append(encode_chunk(byte_range))
                    bar.update(byte_range[1] - byte_range[0])
            else:
                try:
                    _write_in_order(pool, ranges, 2 * num_workers, writer, bar)
                except InvalidUTF8Error as error:  # name the file's first, whichever came first
                    raise first_invalid_utf8_error(input_path, ranges, error) from None
        writer.finish()
    except BaseException:
        writer.close()
        _remove(partial)
        raise

    result = TokenFile(
        path=output_path,
        sidecar_path=sidecar_path(output_path),
        dtype=dtype.name,
        num_tokens=writer.num_tokens,
        source=os.path.abspath(input_path),
        source_bytes=size,
        tokenizer_sha256=tokenizer_sha256(tokenizer),
        seconds=time.perf_counter() - start_time,
    )
    # An old sidecar must never describe the new file: remove it before the file appears.
    _remove(result.sidecar_path)
    os.replace(partial, output_path)
    write_text_atomically(result.sidecar_path,
                          json.dumps(result.sidecar(), ensure_ascii=False, indent=1) + "\n")
    return result


def _write_in_order(pool: WorkerPool, ranges, ahead: int, writer, bar) -> None:
    """Hand `ranges` to the pool's workers and write their ids in file order as they come back.

    At most `ahead` chunks are handed out but not yet written: that bounds the ids held here
    while an earlier chunk is still being encoded.
    """
    done: dict[int, np.ndarray] = {}
    submitted = next_to_write = 0
    while next_to_write < len(ranges):
        while submitted < len(ranges) and submitted < next_to_write + ahead:
            pool.submit(submitted, ranges[submitted])
            submitted += 1
        index, ids = pool.next_result()
        done[index] = ids
        while next_to_write in done:
            writer.append(done.pop(next_to_write))
            start, end = ranges[next_to_write]
            bar.update(end - start)
            next_to_write += 1


def open_token_file(path: str | os.PathLike) -> np.memmap:
    """The ids of a token file written by `encode_file`, as a read-only `np.memmap`.

    The dtype comes from the sidecar, and the file's size is checked against its token count.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"token file not found: {path!r}"
                                + (" (an unfinished run left a .partial file)"
                                   if os.path.exists(path + PARTIAL_SUFFIX) else ""))
    meta = read_sidecar(path)
    dtype = np.dtype(meta["dtype"])
    expected = meta["num_tokens"] * dtype.itemsize
    actual = os.path.getsize(path)
    if actual != expected:
        raise ValueError(f"{path}: {actual:,} bytes, but its sidecar records {meta['num_tokens']:,} "
                         f"{dtype} ids ({expected:,} bytes); the file is incomplete or was changed")
    if expected == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def read_sidecar(path: str | os.PathLike) -> dict:
    """The sidecar of the token file at `path` (what `TokenFile.sidecar()` returns)."""
    meta_path = sidecar_path(path)
    if not os.path.exists(meta_path):
        raise FileNotFoundError(f"no sidecar {meta_path!r} beside the token file; it records the dtype")
    with open(meta_path, encoding="utf-8") as f:
        try:
            meta = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{meta_path}: not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{meta_path}: not an nbbpe token file sidecar")
    return meta


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _stderr_is_terminal() -> bool:
    import sys

    return sys.stderr is not None and sys.stderr.isatty()
