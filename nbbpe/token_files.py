"""Token files: a corpus encoded into flat files of ids, for language-model training.

The output is what nanoGPT-style training reads with `np.memmap(path, dtype=..., mode="r")`:
the ids of the whole corpus, end to end, with no header. Beside it, `<output>.json` records how
it was made (dtype, token count, the tokenizer's hash, the sources and their size). With
`shard_bytes`, the ids go instead into a directory of shards (`shard_00000.bin`, ...) with an
`index.json` giving each shard's token count and the dtype.

How `encode_file` works, and why:

- the source (a text file, or anything `sources.py` reads) is planned as units of work cut at
  safe places (`corpus.chunk_boundaries`: at special tokens, i.e. document boundaries, or else,
  for the built-in patterns only, between a letter or digit and a space or newline), where a
  cut cannot change any id; so the ids are those of `tokenizer.encode` on the whole text,
  whatever the number of workers or the chunk size. Documents of JSONL, Parquet and iterators
  are each followed by a separator id;
- worker threads (or Dask workers) read and encode units; the ids are written here in source
  order, each unit's with one plain write (into the page cache, not this process's memory). At
  most a few units run ahead of the next one to be written, so memory is bounded by the unit
  size, not the corpus size;
- output goes to `<output>.partial` (shards: `<shard>.partial`), renamed only when complete;
  an old sidecar or index is removed before, the new one written after: a killed run leaves at
  most `.partial` files, which the next run overwrites.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import json
import os
import threading
import time

import numpy as np
import psutil

from .corpus import DEFAULT_CHUNK_BYTES, check_errors_policy, check_utf8, decoded_documents
from .tokenizer import Tokenizer
from .vocab_files import write_text_atomically

SIDECAR_SUFFIX = ".json"
PARTIAL_SUFFIX = ".partial"
INDEX_FILE = "index.json"
FORMAT = "nbbpe token file"
SHARDS_FORMAT = "nbbpe token shards"
DOCUMENT_SEPARATOR = "<|endoftext|>"


@dataclasses.dataclass(frozen=True)
class TokenFile:
    """What `encode_file` wrote: the token file (or shard directory), its sidecar (or index)
    and what they record."""

    path: str
    sidecar_path: str
    dtype: str
    num_tokens: int
    source: str | list[str]
    source_bytes: int
    tokenizer_sha256: str
    seconds: float
    separator: int | None = None
    shards: tuple[tuple[str, int], ...] = ()  # (file name, tokens) of each shard

    def sidecar(self) -> dict:
        meta = {
            "format": SHARDS_FORMAT if self.shards else FORMAT,
            "version": 1,
            "dtype": self.dtype,
            "num_tokens": self.num_tokens,
            "tokenizer_sha256": self.tokenizer_sha256,
            "source": self.source,
            "source_bytes": self.source_bytes,
            "document_separator": self.separator,
        }
        if self.shards:
            meta["shards"] = [{"file": name, "num_tokens": n} for name, n in self.shards]
        return meta


def sidecar_path(output_path) -> str:
    return os.fspath(output_path) + SIDECAR_SUFFIX


def tokenizer_sha256(tokenizer: Tokenizer) -> str:
    """SHA-256 of what defines the ids: vocab, merges (or the merge order of a rank file),
    special tokens and pattern.

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
    if tokenizer.merge_order == "merges":
        add_tokens([side for pair in tokenizer.merges for side in pair])
    else:
        add_tokens([b"merge order: ranks"])
    add_tokens([json.dumps(list(tokenizer.special_tokens)).encode("utf-8"),
                tokenizer.pattern.encode("utf-8")])
    return digest.hexdigest()


class UnitEncoder:
    """The work on one unit (run by a worker): read it, check its UTF-8, encode its batches."""

    def __init__(self, tokenizer: Tokenizer, dtype: np.dtype, errors: str, separator: int | None,
                 chunk_bytes: int, python=None):
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.errors = errors
        self.separator = separator
        self.chunk_bytes = chunk_bytes
        self.python = python  # an `encode_python.PythonEncoder`: encode with it, not the kernels

    def __call__(self, unit) -> np.ndarray:
        from .sources import Batch, read_unit

        batches = [unit] if isinstance(unit, Batch) else read_unit(
            unit, chunk_bytes=self.chunk_bytes, errors=self.errors)
        parts = [self.encode_batch(batch) for batch in batches]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def encode_batch(self, batch) -> np.ndarray:
        base = batch.where.first if batch.where.kind == "byte" else None
        python = self.python  # (another thread may set it to None meanwhile)
        if python is not None:
            return self._encode_in_python(python, batch, base)
        data, doc_ends = check_utf8(batch.data, self.errors, batch.place, batch.doc_ends, base)
        separator = self.separator if batch.documents else None
        tokenizer = self.tokenizer
        if tokenizer._family is not None:
            return tokenizer.encode_utf8(data, doc_ends, separator=separator, dtype=self.dtype)[0]
        text = data.tobytes()  # the regex path: one document at a time
        starts = [0, *doc_ends[:-1].tolist()]
        parts = []
        for a, b in zip(starts, doc_ends.tolist()):
            parts.append(tokenizer._encode_text(text[a:b].decode("utf-8")))
            if separator is not None:
                parts.append(np.array([separator], dtype=np.int32))
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return ids.astype(self.dtype)

    def _encode_in_python(self, python, batch, base) -> np.ndarray:
        from .encode_python import TooMuchWork

        separator = self.separator if batch.documents else None
        ids: list[int] = []
        try:
            for text in decoded_documents(batch.data, batch.doc_ends, self.errors, batch.place,
                                          base):
                ids += python.encode(text)
                if separator is not None:
                    ids.append(separator)
        except TooMuchWork:  # the kernels take over, from this batch on
            with _KERNELS_TAKING_OVER:
                if self.python is not None:
                    # loaded by one thread while the others wait, as `encode_file` does before
                    # its threads start when it encodes with the kernels from the beginning
                    # (see `pretokenize.count_items`)
                    self.tokenizer.encode("warm up")
                    self.python = None
            return self.encode_batch(batch)
        return np.array(ids, dtype=self.dtype)


_KERNELS_TAKING_OVER = threading.Lock()  # see `UnitEncoder._encode_in_python`


class _HeapTrimmer:
    """Gives freed memory back to the OS once this process's RSS has grown by `slack` bytes.

    Each unit allocates and frees buffers of a few MB (bytes, arrays) whose sizes vary; glibc's
    malloc keeps them in its heap, which fragments, and RSS creeps up with the input size.
    `malloc_trim` hands the free pages back; calling it only after such growth keeps its cost
    (faulting the pages in again) small. A no-op where there is no glibc.
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


_WRITEBACK_BYTES = 64 << 20  # the token files are flushed to disk in the background this often


class _TokenWriter:
    """Appends ids to a file with plain writes: the kernel copies them into the page cache,
    which costs a fraction of faulting in the pages of a memory-mapped window (0.8 s of the
    main thread per 300 MB of text with windows), and leaves nothing in this process's RSS.
    The file is made durable as it grows, by a thread that flushes it to disk, so that the
    fsync at the end waits only for the last part (it took 0.28 s for 300 MB at once)."""

    def __init__(self, path: str, dtype: np.dtype):
        self.path = path
        self.dtype = dtype
        self.num_tokens = 0
        self._file = open(path, "wb", buffering=0)  # truncates what a killed run left
        self._unflushed = 0  # bytes written since the last flush was asked for
        self._flush_asked = threading.Event()
        self._closing = False
        self._flusher = threading.Thread(target=self._flush_in_background, daemon=True,
                                         name="nbbpe-token-file-flush")
        self._flusher.start()

    def append(self, ids: np.ndarray) -> None:
        if not len(ids):
            return
        data = memoryview(np.ascontiguousarray(ids, dtype=self.dtype)).cast("B")
        self._unflushed += len(data)
        while data:  # a raw write may take less than all
            data = data[self._file.write(data):]
        self.num_tokens += len(ids)
        if self._unflushed >= _WRITEBACK_BYTES:
            self._unflushed = 0
            self._flush_asked.set()

    def _flush_in_background(self) -> None:
        while True:
            self._flush_asked.wait()
            self._flush_asked.clear()
            if self._closing:
                return
            try:
                os.fdatasync(self._file.fileno())  # releases the GIL while the disk works
            except (OSError, ValueError, AttributeError):  # closed, or no fdatasync: at the end
                return

    def _stop_flushing(self) -> None:
        self._closing = True
        self._flush_asked.set()
        self._flusher.join()

    def finish(self) -> None:
        """Make the file durable."""
        self._stop_flushing()
        os.fsync(self._file.fileno())
        self._file.close()

    def close(self) -> None:
        self._stop_flushing()
        self._file.close()


def _check_output(files, output_path) -> str:
    if not isinstance(output_path, (str, os.PathLike)):
        raise TypeError(f"output_path must be a str or os.PathLike, got {type(output_path).__name__}")
    output_path = os.fspath(output_path)
    for file in files:
        if "://" not in file.path and os.path.exists(output_path) and (
                os.path.abspath(output_path) == os.path.abspath(file.path)
                or os.path.samefile(file.path, output_path)):
            raise ValueError(f"output path {output_path!r} is an input file; it would be overwritten")
    return output_path


def separator_id(tokenizer: Tokenizer, separator) -> int | None:
    """The id that follows each document of JSONL, Parquet or iterator sources: for "auto",
    the tokenizer's `<|endoftext|>` if it has it as a special token, else none."""
    if separator is None:
        return None
    if separator == "auto":
        separator = DOCUMENT_SEPARATOR
        if separator not in tokenizer.special_tokens:
            return None
    if not isinstance(separator, str) or separator not in tokenizer.special_tokens:
        raise ValueError(f"separator {separator!r} is not one of the tokenizer's special tokens "
                         f"{tokenizer.special_tokens}; give one of them, or None for no separator")
    return tokenizer._special_ids[separator]


def encode_file(
    tokenizer: Tokenizer,
    source,
    output_path: str | os.PathLike,
    *,
    num_workers: int | None = None,
    client=None,
    dtype=None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    errors: str = "strict",
    separator: str | None = "auto",
    shard_bytes: int | None = None,
    text_field: str = "text",
    text_column: str = "text",
    progress: bool | None = None,
) -> TokenFile:
    """Encode a corpus into a flat token file at `output_path` (or a directory of shards).

    `source` is a text file, or any source `nbbpe.sources` reads (a directory, a glob, a list,
    JSONL with `text_field`, Parquet with `text_column`, compressed files). The file holds
    `tokenizer.encode(<whole text>)` of each text file, end to end, as `dtype` (default: uint16
    if the vocab has at most 65,536 ids, else uint32), with no header; each document of a
    JSONL, Parquet or iterator source is followed by the id of `separator` (default "auto": the
    tokenizer's `<|endoftext|>` if it has that special token, else nothing; None: nothing).
    Read it with `open_token_file(output_path)`. A sidecar `<output_path>.json` records the
    dtype, the number of tokens, the tokenizer's hash and the sources.

    With `shard_bytes`, `output_path` is a directory: each shard holds the ids of about
    `shard_bytes` of input (units in order), and `index.json` lists the shards.

    Options: `num_workers` threads encode units of about `chunk_bytes` (default: one per CPU);
    `client`, a `distributed.Client`, encodes on a Dask cluster instead (the ids come back here
    in order); the ids depend on neither. `errors` is the policy for invalid UTF-8 ("strict"
    raises naming the place, "replace" reads it as U+FFFD); `progress` shows a progress bar
    (default: when stderr is a terminal).

    A first run on a small local source (at most 2 MB stored uncompressed, the encode kernel not
    yet in Numba's cache, the tokenizer not asked for `pretokenizer="compiled"`) encodes it in
    Python (`encode_python`): the same ids, without waiting seconds for the kernels to compile.

    The output appears only when complete; missing parent directories are created. Text files
    are cut at special tokens, or for the built-in patterns also between a letter or digit and a
    space or newline; with a custom pattern a text file without special tokens is one unit.
    """
    # here, not at `import nbbpe`, and before any thread starts (see pretokenize.count_items)
    from tqdm import tqdm

    from .encode_python import PythonEncoder, python_encoding_for
    from .sources import plan_units, resolve_source
    from .train import _executor

    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be an nbbpe Tokenizer, got {type(tokenizer).__name__}")
    check_errors_policy(errors)
    dtype = tokenizer.id_dtype(dtype)
    sep = separator_id(tokenizer, separator)
    if shard_bytes is not None and (isinstance(shard_bytes, bool)
                                    or not isinstance(shard_bytes, int) or shard_bytes < 1):
        raise ValueError(f"shard_bytes must be a positive int, got {shard_bytes!r}")
    executor = _executor(num_workers, client)
    files = resolve_source(source, text_field=text_field, text_column=text_column)
    output_path = _check_output(files, output_path)
    if progress is None:
        progress = _stderr_is_terminal()

    start_time = time.perf_counter()
    units = plan_units(files, chunk_bytes=chunk_bytes, special_tokens=tokenizer.special_tokens,
                       pattern=tokenizer.pattern)
    size = sum(file.size for file in files)
    # a small first job encodes in Python rather than wait for the kernels to compile
    python = PythonEncoder(tokenizer) if python_encoding_for(tokenizer, files, executor) else None
    encoder = UnitEncoder(tokenizer, dtype, errors, sep, chunk_bytes, python)
    if python is None and not getattr(executor, "remote", False) and executor.num_workers > 1:
        tokenizer.encode("warm up")  # build the tables (and load the kernels) once, not per thread
    results = executor.map(encoder, units)
    with tqdm(total=size, unit="B", unit_scale=True, desc="encode", disable=not progress) as bar:
        def progressed(ids_and_unit):
            bar.update(ids_and_unit[1].size_bytes)
            return ids_and_unit[0]

        ids_in_order = map(progressed, zip(results, units))
        if shard_bytes is None:
            num_tokens, shards = _write_file(ids_in_order, output_path, dtype), ()
        else:
            groups = _shard_of_units(units, shard_bytes)
            shards = _write_shards(ids_in_order, groups, output_path, dtype)
            num_tokens = sum(n for _, n in shards)

    sources = [file.path for file in files]
    result = TokenFile(
        path=output_path,
        sidecar_path=os.path.join(output_path, INDEX_FILE) if shards else sidecar_path(output_path),
        dtype=dtype.name,
        num_tokens=num_tokens,
        source=sources[0] if len(sources) == 1 else sources,
        source_bytes=size,
        tokenizer_sha256=tokenizer_sha256(tokenizer),
        seconds=time.perf_counter() - start_time,
        separator=sep,
        shards=tuple(shards),
    )
    if not shards:
        # An old sidecar must never describe the new file: remove it before the file appears.
        _remove(result.sidecar_path)
        os.replace(output_path + PARTIAL_SUFFIX, output_path)
    write_text_atomically(result.sidecar_path,
                          json.dumps(result.sidecar(), ensure_ascii=False, indent=1) + "\n")
    return result


def _write_file(ids_in_order, output_path: str, dtype: np.dtype) -> int:
    """Write the ids to `<output_path>.partial`; return how many (the caller renames it)."""
    if os.path.isdir(output_path):
        raise IsADirectoryError(f"output path is a directory, not a file: {output_path!r} "
                                "(pass shard_bytes to write shards into a directory)")
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    partial = output_path + PARTIAL_SUFFIX
    writer = _TokenWriter(partial, dtype)
    trim_heap = _HeapTrimmer()
    try:
        for ids in ids_in_order:
            writer.append(ids)
            trim_heap()
        writer.finish()
    except BaseException:
        writer.close()
        _remove(partial)
        raise
    return writer.num_tokens


def _shard_of_units(units, shard_bytes: int) -> list[int]:
    """The shard of each unit: consecutive units, a new shard once one holds `shard_bytes` of
    input. It depends on the plan only, so every executor writes the same shards."""
    shard_of = []
    shard = filled = 0
    for unit in units:
        if filled >= shard_bytes:
            shard += 1
            filled = 0
        shard_of.append(shard)
        filled += unit.size_bytes
    return shard_of


def _write_shards(ids_in_order, shard_of: list[int], directory: str, dtype: np.dtype):
    """Write the ids of each group of units to its shard file; return (name, tokens) of each."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(f"with shard_bytes the output path is a directory, but "
                                 f"{directory!r} is a file")
    os.makedirs(directory, exist_ok=True)
    _remove(os.path.join(directory, INDEX_FILE))  # the old index must never describe new shards
    shards: list[tuple[str, int]] = []
    writer = None
    trim_heap = _HeapTrimmer()
    try:
        for ids, shard in zip(ids_in_order, shard_of):
            if writer is None or shard != len(shards) - 1:
                if writer is not None:
                    _finish_shard(writer, shards)
                shards.append((f"shard_{shard:05d}.bin", 0))
                writer = _TokenWriter(os.path.join(directory, shards[-1][0]) + PARTIAL_SUFFIX,
                                      dtype)
            writer.append(ids)
            trim_heap()
        if writer is not None:
            _finish_shard(writer, shards)
    except BaseException:
        if writer is not None:
            writer.close()
            _remove(writer.path)
        raise
    return shards


def _finish_shard(writer: _TokenWriter, shards: list) -> None:
    writer.finish()
    os.replace(writer.path, writer.path[: -len(PARTIAL_SUFFIX)])
    shards[-1] = (shards[-1][0], writer.num_tokens)


class TokenShards:
    """The ids of a shard directory as one sequence: `len`, integer and slice indexing across
    shards (a slice gives a NumPy array), and `shards`, each shard's read-only `np.memmap`."""

    def __init__(self, shards: list[np.ndarray], dtype: np.dtype):
        self.shards = shards
        self.dtype = dtype
        self._ends = np.cumsum([len(s) for s in shards], dtype=np.int64)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def __getitem__(self, key):
        n = len(self)
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step != 1:
                return self[start:stop][::step]
            parts = []
            k = int(np.searchsorted(self._ends, start, side="right"))
            while start < stop:
                base = int(self._ends[k - 1]) if k else 0
                end = min(stop, int(self._ends[k]))
                parts.append(self.shards[k][start - base : end - base])
                start = end
                k += 1
            return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)
        index = int(key)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"token index {key} out of range for {n} tokens")
        k = int(np.searchsorted(self._ends, index, side="right"))
        return self.shards[k][index - (int(self._ends[k - 1]) if k else 0)]

    def __repr__(self) -> str:
        return f"TokenShards({len(self):,} {self.dtype} ids in {len(self.shards)} shards)"


def open_token_file(path: str | os.PathLike):
    """The ids `encode_file` wrote at `path`: a read-only `np.memmap` for a token file (dtype
    from its sidecar, size checked against its token count), or `TokenShards` for a shard
    directory (or its index.json)."""
    path = os.fspath(path)
    if os.path.isdir(path) or os.path.basename(path) == INDEX_FILE:
        return _open_shards(path if os.path.isdir(path) else os.path.dirname(path))
    if not os.path.exists(path):
        raise FileNotFoundError(f"token file not found: {path!r}"
                                + (" (an unfinished run left a .partial file)"
                                   if os.path.exists(path + PARTIAL_SUFFIX) else ""))
    meta = read_sidecar(path)
    return _open_checked(path, np.dtype(meta["dtype"]), meta["num_tokens"], sidecar_path(path))


def _open_checked(path: str, dtype: np.dtype, num_tokens: int, described_by: str) -> np.ndarray:
    expected = num_tokens * dtype.itemsize
    actual = os.path.getsize(path)
    if actual != expected:
        raise ValueError(f"{path}: {actual:,} bytes, but {described_by} records {num_tokens:,} "
                         f"{dtype} ids ({expected:,} bytes); the file is incomplete or was changed")
    if expected == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def _open_shards(directory: str) -> TokenShards:
    index_path = os.path.join(directory, INDEX_FILE)
    if not os.path.exists(index_path):
        raise FileNotFoundError(f"no {INDEX_FILE} in {directory!r}: not a shard directory, or "
                                "its encode_file run did not finish")
    meta = _read_json(index_path, SHARDS_FORMAT)
    dtype = np.dtype(meta["dtype"])
    shards = [_open_checked(os.path.join(directory, s["file"]), dtype, s["num_tokens"], index_path)
              for s in meta["shards"]]
    return TokenShards(shards, dtype)


def read_sidecar(path: str | os.PathLike) -> dict:
    """The sidecar of the token file at `path` (what `TokenFile.sidecar()` returns)."""
    meta_path = sidecar_path(path)
    if not os.path.exists(meta_path):
        raise FileNotFoundError(f"no sidecar {meta_path!r} beside the token file; it records the dtype")
    return _read_json(meta_path, FORMAT)


def _read_json(path: str, kind: str) -> dict:
    with open(path, encoding="utf-8") as f:
        try:
            meta = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != kind:
        raise ValueError(f"{path}: not an {kind} sidecar")
    return meta


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _stderr_is_terminal() -> bool:
    import sys

    return sys.stderr is not None and sys.stderr.isatty()
