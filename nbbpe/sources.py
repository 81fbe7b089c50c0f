"""Sources: corpora as users hold them -> documents -> units of work -> batches of UTF-8 bytes.

A *source* is a path, a directory, a glob, a URL, or a list of these::

    files = resolve_source(["data/", "extra/*.jsonl.gz", "s3://bucket/shard-0.parquet"])
    units = plan_units(files, chunk_bytes=2 << 20, special_tokens=["<|endoftext|>"])
    for unit in units:                      # each one is read independently: a thread, a process,
        for batch in read_unit(unit):       # or a Dask task on another machine (units pickle)
            consume(batch.data, batch.doc_ends, batch.documents)

and an iterable of str (`train_bpe_from_iterator`) goes through `iter_text_batches(texts)`.

Interface
---------
- `resolve_source(source, *, text_field="text", text_column="text") -> list[SourceFile]`: the files
  of a source, in order, each with its format and compression (from its suffixes).
- `plan_units(files, *, chunk_bytes, special_tokens=(), pattern=GPT2_PATTERN) -> list[Unit]`:
  units of work in source order, cut where pre-tokenization with `pattern` cannot change; a
  `Unit` is a small frozen, picklable dataclass.
- `read_unit(unit, *, chunk_bytes=None, errors="strict") -> Iterator[Batch]`: a unit's batches,
  in order.
- `iter_text_batches(texts, *, batch_bytes, errors="strict") -> Iterator[Batch]`: an iterable of
  str, one document per item, packed into batches (single pass, bounded memory).
- `Batch(data, doc_ends, documents, where)`: `data` is a 1-D C-contiguous uint8 array, the
  documents' UTF-8 bytes end to end, read-only for every source (Parquet's is Arrow's own memory,
  and one array type spares compiled kernels a second compilation); `doc_ends` (int64) is the end
  offset of each document in `data`, non-decreasing (empty documents are kept), the last ==
  len(data). `documents` is True for JSONL lines, Parquet rows and iterator items (an encoder
  appends a separator token after each) and False for text files, whose batches are pieces of a
  file cut at safe places (`doc_ends == [len(data)]`; the end of a file always ends a batch).
  `batch.place(offset)` names the place of `data[offset]` for an
  error message: "path byte 1234" (text; "path (decompressed) byte 1234" in a compressed file),
  "path line 7, text byte 3", "path row 17, text byte 0", "item at index 4 of texts, text byte 9".
  A batch holds at least one document.
- `encode_document(text, errors, where)`: the lone-surrogate policy, in one place.
- `SourceError` (a ValueError): bad content (JSON, Parquet, corrupt archive) naming the file and
  the line or row; `corpus.InvalidUTF8Error` for invalid UTF-8 or lone surrogates under "strict".

Formats, by suffix (case-insensitive)
-------------------------------------
- `.jsonl`, `.json`, `.ndjson`: JSON Lines, one document per line, the string field `text_field`.
  Blank (JSON-whitespace-only) lines are skipped; any other line must be a JSON object with that
  field holding a string. A UTF-8 byte-order mark at the start of the file is ignored.
- `.parquet`, `.pq`: the string column `text_column` (string, large_string, string_view or a
  dictionary of strings), one document per row, read row group by row group in record batches of
  about `chunk_bytes`, the Arrow buffers taken zero-copy as `data`/`doc_ends`. Nulls are errors.
- anything else: UTF-8 text, passed through as raw bytes (the consumer validates UTF-8 and names
  the place with `batch.place`).
- a last suffix `.gz`, `.bz2`, `.xz`, `.zst`/`.zstd` (zstandard, optional) decompresses text or
  JSONL as a stream: `x.jsonl.gz` is JSONL, `x.txt.gz` and `x.gz` are text. Corrupt or truncated
  archives raise `SourceError` naming the file.

Numbering: JSONL lines and Parquet rows count from 1 (as editors and "the 17th row" do); items of
an iterable are named by their 0-based index (as `texts[i]`).

Paths: `~` is expanded; `pathlib.Path` works. A directory means every regular file below it
(recursively; symlinked files are followed, symlinked directories are not), sorted by relative
path compared component by component, skipping names that start with '.' (hidden files and
directories, e.g. `.git`, `.DS_Store`); a directory without such files is an error. A string with
`*?[` that is not an existing path is a glob (`recursive=True`, so `**` works), its matches sorted;
no match is an error. A string with `://` is a URL read through fsspec (directories and globs too).
A single file given alone must not be empty (as `corpus.check_corpus_path`); empty files inside a
directory, glob or list are skipped, unless every file is empty.

Units of work keep memory bounded and let several workers share a big file: an uncompressed text
file is cut into byte ranges of about `chunk_bytes` at safe places (`corpus.chunk_boundaries`,
which prefers special-token occurrences, and cuts text for a custom pattern only there: such a
file without special tokens is one unit); an uncompressed JSONL file into byte ranges of about
`chunk_bytes` cut after a newline; a Parquet file into one unit per row group; a compressed file
is one unit (it cannot be seeked), read as a stream in batches of about `chunk_bytes` of
decompressed data, text cut exactly where `corpus.chunk_boundaries` would cut the decompressed
file, JSONL after a newline. Small files are not grouped: each is (at least) one unit.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from .corpus import (
    DEFAULT_CHUNK_BYTES,
    InvalidUTF8Error,
    boundary_reach_back,
    check_errors_policy,
    iter_safe_boundaries,
    reader_at,
    whitespace_cuts_allowed,
)
from .patterns import GPT2_PATTERN

__all__ = [
    "Batch",
    "SourceError",
    "SourceFile",
    "Unit",
    "Where",
    "encode_document",
    "iter_text_batches",
    "plan_units",
    "read_unit",
    "resolve_source",
]

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
COMPRESSION_SUFFIXES = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}
GLOB_CHARS = "*?["
_SCAN_BYTES = 1 << 16  # how far a scan for a newline reads at a time
_COMPRESSED_READ_BYTES = 1 << 17


class SourceError(ValueError):
    """The content of a source file is not what its format requires (names the file and place)."""


# ---------------------------------------------------------------------------------------------
# What the stages hand each other


@dataclass(frozen=True)
class SourceFile:
    """One file of a source: where it is and how to read it."""

    path: str  # absolute local path, or a URL read through fsspec
    format: str  # "text", "jsonl" or "parquet"
    compression: str | None  # None, "gzip", "bz2", "xz" or "zstd"
    size: int  # bytes as stored (compressed size for compressed files)
    field: str = "text"  # the JSONL field or Parquet column that holds the text
    row_groups: tuple[int, ...] = ()  # Parquet: the number of rows of each row group


@dataclass(frozen=True)
class Unit:
    """A unit of work: a piece of one file that a worker reads on its own (small and picklable).

    Text and JSONL read `[start, end)` of the file (`end=None`: all of a compressed stream);
    Parquet reads row group `row_group`, whose first row is row `first_row` (0-based) of the file.
    `chunk_bytes`, `special_tokens` and `whitespace_cuts` (whether the pattern allows cuts at
    whitespace: `corpus.whitespace_cuts_allowed`) say how a compressed text stream is cut into
    batches.
    """

    file: SourceFile
    start: int = 0
    end: int | None = None
    row_group: int | None = None
    first_row: int = 0
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    special_tokens: tuple[str, ...] = ()
    whitespace_cuts: bool = True

    @property
    def size_bytes(self) -> int:
        """The bytes of the file this unit covers, as stored (Parquet: its share by rows)."""
        if self.row_group is not None:
            rows = self.file.row_groups
            return self.file.size * rows[self.row_group] // max(1, sum(rows))
        return (self.file.size if self.end is None else self.end) - self.start


@dataclass(frozen=True, eq=False)
class Where:
    """Names the places of one batch for error messages (see `Batch.place`).

    kind "byte": `first` is the (decompressed) file offset of `data[0]`. kind "line": `first` is
    the line of the batch's first line counted from 0 at the unit's start, and `lines[d]` that of
    document d counted from `first`; the unit's own first line is counted only when a message
    needs it. kind "row": `first` is the 1-based row of the first document; kind "index": the
    0-based index of the first item.
    """

    name: str
    kind: str
    first: int = 0
    lines: np.ndarray | None = dataclasses.field(default=None, repr=False)
    file: SourceFile | None = dataclasses.field(default=None, repr=False)
    unit_start: int = 0

    def document(self, doc: int, offset_in_doc: int | None = None) -> str:
        """The name of document `doc` of the batch (and of a byte in its text)."""
        at = "" if offset_in_doc is None else f", text byte {offset_in_doc}"
        if self.kind == "line":
            line = _line_number(self.file, self.unit_start, self.first + int(self.lines[doc]))
            return f"{self.name} line {line}{at}"
        if self.kind == "row":
            return f"{self.name} row {self.first + doc}{at}"
        return f"item at index {self.first + doc} of {self.name}{at}"


class Batch(NamedTuple):
    """Documents' UTF-8 bytes end to end, with where each ends (see the module docstring)."""

    data: np.ndarray
    doc_ends: np.ndarray
    documents: bool
    where: Where

    def place(self, offset: int) -> str:
        """Name the place of `data[offset]` for an error message, e.g. "corpus.jsonl line 7"."""
        if self.where.kind == "byte":
            return f"{self.where.name} byte {self.where.first + offset}"
        doc = min(int(np.searchsorted(self.doc_ends, offset, side="right")), len(self.doc_ends) - 1)
        doc_start = int(self.doc_ends[doc - 1]) if doc else 0
        return self.where.document(doc, offset - doc_start)


def _batch(pieces: list[bytes], documents: bool, where: Where) -> Batch:
    """A batch of several documents' bytes (one piece each), or of one piece of a text file."""
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    data = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    return Batch(data, np.cumsum(lengths), documents, where)


def _text_batch(data: bytes, where: Where) -> Batch:
    return Batch(np.frombuffer(data, dtype=np.uint8), np.array([len(data)], np.int64), False, where)


# ---------------------------------------------------------------------------------------------
# Documents from Python strings: the lone-surrogate policy


def encode_document(
    text: str, errors: str = "strict", where: Callable[[], str] | str = "text"
) -> bytes:
    """`text` as UTF-8. Lone surrogates (e.g. from JSON's "\\ud800") follow the UTF-8 policy.

    "strict" raises `InvalidUTF8Error` naming `where` (a str, or a callable called only then);
    "replace" turns each lone surrogate into U+FFFD, and a surrogate pair into its character.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        if errors == "replace":
            return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace").encode()
        place = where() if callable(where) else where
        raise InvalidUTF8Error(
            f"{place}: lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start} "
            "cannot be encoded as UTF-8; pass errors='replace' to read it as U+FFFD"
        ) from None


def iter_text_batches(
    texts: Iterable[str], *, batch_bytes: int = DEFAULT_CHUNK_BYTES, errors: str = "strict"
) -> Iterator[Batch]:
    """Pack an iterable of str into batches of about `batch_bytes`, each item one document.

    Single pass with bounded memory, so generators work: a batch closes at the first document
    that brings it to `batch_bytes` (documents are never split). Each item is a hard boundary:
    iterating a text file handle would make each of its lines a document. Non-str items raise
    TypeError naming their index; lone surrogates follow `encode_document`'s policy.
    """
    if isinstance(texts, (str, bytes, bytearray)):
        raise TypeError(
            f"texts must be an iterable of str documents, not a single {type(texts).__name__}"
        )
    check_errors_policy(errors)
    if batch_bytes < 1:
        raise ValueError(f"batch_bytes must be positive, got {batch_bytes}")
    return _pack_texts(iter(texts), batch_bytes, errors)


def _pack_texts(texts: Iterator[Any], batch_bytes: int, errors: str) -> Iterator[Batch]:
    pieces: list[bytes] = []
    size = first = 0
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"item at index {index} of texts is {type(text).__name__}, not str")
        piece = encode_document(text, errors, lambda: f"item at index {index} of texts")
        pieces.append(piece)
        size += len(piece)
        if size >= batch_bytes:
            yield _batch(pieces, True, Where("texts", "index", first))
            pieces, size, first = [], 0, index + 1
    if pieces:
        yield _batch(pieces, True, Where("texts", "index", first))


# ---------------------------------------------------------------------------------------------
# Resolving a source into files


def resolve_source(
    source, *, text_field: str = "text", text_column: str = "text"
) -> list[SourceFile]:
    """The files of `source` in order: a path, directory, glob, URL, or a list/tuple of these
    (or of the `SourceFile`s this returned).

    Raises FileNotFoundError (missing path, glob without match); ValueError for an empty
    directory, an empty single file, or a source whose files are all empty; TypeError for what is
    not a source; SourceError for a Parquet file without a string `text_column`; ImportError
    naming the package to install for .zst files, Parquet or URLs.
    """
    found = _resolve(source, text_field, text_column, top=True)
    if len(found) == 1 and found[0][1]:  # one file, named as such
        file = found[0][0]
        if file.size == 0:
            raise ValueError(f"corpus file is empty: {file.path!r}")
        return [file]
    files = [file for file, _ in found if file.size > 0]
    if not files:
        names = ", ".join(repr(f.path) for f, _ in found[:3]) + (", ..." if len(found) > 3 else "")
        raise ValueError(f"every file of the source is empty ({len(found)} files: {names})")
    return files


# A first run on a source this small, stored uncompressed and read here, compiles no kernel: it is
# counted with `regex` (`pretokenize.source_pretokenizer`; compiling the counting kernel took
# 3.5-4.7 s here, `regex` counts the shipped 1 MB sample in ~0.1 s once Python is up), its merges
# are learned in Python (`merge_python`: 0.26 s for the sample, against ~5 s to compile the merge
# loop) and it is encoded in Python (`encode_python`: 0.25 s). Once a kernel is in Numba's cache
# (a larger source compiled it), it does that work on small sources too (in a fresh process, with
# the counting kernel cached, 1 MB of web text was counted in 0.8-0.9 s, with `regex` 1.0-1.1 s).
SMALL_SOURCE = 2 << 20


def small_local_source(files: list[SourceFile], executor=None) -> bool:
    """Whether `files` (from `resolve_source`) are at most `SMALL_SOURCE` bytes stored
    uncompressed (text or JSONL), worked on in this process (`executor` None or local threads,
    not a cluster)."""
    from .workers import LocalExecutor

    return ((executor is None or isinstance(executor, LocalExecutor))
            and not any(file.compression or file.format == "parquet" for file in files)
            and sum(file.size for file in files) <= SMALL_SOURCE)


def _resolve(source, field: str, column: str, top: bool = False) -> list[tuple[SourceFile, bool]]:
    """(file, named directly) pairs; a file is named directly when it is not found by listing."""
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError(
                "the source is an empty list" if top else "a source list inside the source is empty"
            )
        return [pair for element in source for pair in _resolve(element, field, column)]
    if isinstance(source, SourceFile):  # resolved already (e.g. by `resolve_source`)
        return [(source, True)]
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        raise TypeError(
            "a source is a path, directory, glob, URL or a list of these, "
            f"not {type(source).__name__}"
            + (
                " (for text in memory, use an iterable of str)"
                if isinstance(source, (bytes, bytearray))
                else ""
            )
        )
    if "://" in source:
        return _resolve_url(source, field, column)
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        return [(_source_file(p, field, column), False) for p in _directory_files(path)]
    if os.path.exists(path):
        return [(_source_file(path, field, column), True)]
    if any(c in path for c in GLOB_CHARS):
        matches = sorted(glob.glob(path, recursive=True))
        if not matches:
            raise FileNotFoundError(f"no file matches the pattern {source!r}")
        return [(file, False) for match in matches for file, _ in _resolve(match, field, column)]
    raise FileNotFoundError(f"corpus file not found: {source!r}")


def _directory_files(directory: str) -> list[str]:
    """Regular files below `directory`, sorted by relative path, hidden names skipped."""
    found = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            path = os.path.join(root, name)
            if not name.startswith(".") and os.path.isfile(path):
                found.append(os.path.relpath(path, directory).split(os.sep))
    if not found:
        raise ValueError(
            f"no files in directory {directory!r} (names starting with '.' are skipped)"
        )
    return [os.path.join(directory, *parts) for parts in sorted(found)]


def _source_file(path: str, field: str, column: str, size: int | None = None) -> SourceFile:
    """Check one file and tell its format and compression from its suffixes."""
    is_url = "://" in path
    if not is_url:
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            raise ValueError(f"corpus path is not a regular file: {path!r}")
        if not os.access(path, os.R_OK):
            raise PermissionError(f"corpus file is not readable: {path!r}")
        size = os.path.getsize(path)
    name = path.rsplit("/", 1)[-1].lower()
    stem, dot, last = name.rpartition(".")
    compression = COMPRESSION_SUFFIXES.get(dot + last) if stem else None
    inner = stem if compression else name
    if inner.endswith(PARQUET_SUFFIXES):
        if compression:
            raise ValueError(
                f"{path}: a compressed Parquet file cannot be read (Parquet compresses inside)"
            )
        row_groups = (
            _parquet_row_groups(path, column) if size else ()
        )  # an empty file is skipped later
        return SourceFile(path, "parquet", None, size, column, row_groups)
    if compression == "zstd":
        _require("zstandard", path)
    form = "jsonl" if inner.endswith(JSONL_SUFFIXES) else "text"
    return SourceFile(path, form, compression, size, field)


def _resolve_url(
    url: str, field: str, column: str, direct: bool = True
) -> list[tuple[SourceFile, bool]]:
    """The files of a URL (a file, a directory or a glob) through fsspec."""
    fsspec = _require("fsspec", url)
    fs, path = fsspec.core.url_to_fs(url)
    if fs.isdir(path):
        listed = fs.find(path, detail=True)
        relative = {p: p[len(path.rstrip("/")) + 1 :].split("/") for p in listed}
        keep = sorted(
            (parts, p) for p, parts in relative.items() if not any(s.startswith(".") for s in parts)
        )
        if not keep:
            raise ValueError(f"no files in directory {url!r} (names starting with '.' are skipped)")
        infos = [(p, listed[p]["size"], False) for _, p in keep]
    elif fs.isfile(path):
        infos = [(path, fs.size(path), direct)]
    elif any(c in path for c in GLOB_CHARS):
        matches = sorted(fs.glob(path))
        if not matches:
            raise FileNotFoundError(f"no file matches the pattern {url!r}")
        return [
            pair
            for match in matches
            for pair in _resolve_url(fs.unstrip_protocol(match), field, column, False)
        ]
    else:
        raise FileNotFoundError(f"corpus file not found: {url!r}")
    return [
        (_source_file(fs.unstrip_protocol(p), field, column, size), direct)
        for p, size, direct in infos
    ]


def _require(module: str, path: str):
    """Import an optional dependency, or say which package reading `path` needs."""
    try:
        return __import__(module)
    except ImportError:
        raise ImportError(
            f"reading {path!r} needs the {module} package: pip install {module}"
        ) from None


def _parquet_row_groups(path: str, column: str) -> tuple[int, ...]:
    """Rows per row group, after checking that `column` holds strings."""
    pa = _require("pyarrow", path)
    with _open_parquet(path) as parquet:
        schema = parquet.schema_arrow
        if column not in schema.names:
            raise SourceError(
                f"{path}: no column {column!r}; columns: {schema.names} "
                "(choose one with text_column=)"
            )
        kind = schema.field(column).type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if not (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_string_view(kind)
        ):
            raise SourceError(
                f"{path}: column {column!r} has type {schema.field(column).type}, not string"
            )
        meta = parquet.metadata
        return tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))


@contextmanager
def _open_parquet(path: str):
    """A `pyarrow.parquet.ParquetFile`: a local path is read by Arrow itself, a URL by fsspec."""
    import pyarrow.parquet as pq

    with _open_raw_path(path) if "://" in path else _no_context(path) as raw:
        try:
            parquet = pq.ParquetFile(raw)
        except Exception as exc:  # ArrowInvalid, OSError, ... for a file that is not Parquet
            raise SourceError(f"{path}: not a readable Parquet file: {exc}") from exc
        with parquet:
            yield parquet


@contextmanager
def _no_context(value):
    yield value


# ---------------------------------------------------------------------------------------------
# Planning units of work


def plan_units(
    files: Sequence[SourceFile],
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    special_tokens: Sequence[str] = (),
    pattern: str | None = GPT2_PATTERN,
) -> list[Unit]:
    """Units of work of about `chunk_bytes` each, in source order (see the module docstring).

    Text is cut only where pre-tokenization with `pattern` cannot change: for a pattern other
    than the built-in ones (`corpus.WHITESPACE_CUT_PATTERNS`), only at special tokens, so a text
    file without any is one unit, however large.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    specials = tuple(special_tokens)
    whitespace = whitespace_cuts_allowed(pattern)
    units = []
    for file in files:
        if file.format == "parquet":
            first_rows = np.concatenate([[0], np.cumsum(file.row_groups, dtype=np.int64)])
            units += [
                Unit(file, row_group=i, first_row=int(first_rows[i]), chunk_bytes=chunk_bytes)
                for i, rows in enumerate(file.row_groups)
                if rows
            ]
        elif file.compression:
            units.append(Unit(file, chunk_bytes=chunk_bytes, special_tokens=specials,
                              whitespace_cuts=whitespace))
        else:
            with _open_raw(file) as raw:
                read_at = reader_at(raw, file.size)
                if file.format == "text":
                    inner = list(iter_safe_boundaries(read_at, chunk_bytes, specials,
                                                      whitespace_cuts=whitespace))
                else:
                    inner = _line_end_cuts(read_at, file.size, chunk_bytes)
            bounds = [0, *inner, file.size]
            units += [
                Unit(file, start, end, chunk_bytes=chunk_bytes, special_tokens=specials,
                     whitespace_cuts=whitespace)
                for start, end in zip(bounds[:-1], bounds[1:])
            ]
    return units


def _line_end_cuts(read_at: Callable[[int, int], bytes], size: int, chunk_bytes: int) -> list[int]:
    """Offsets just after a newline, the first at or after each `chunk_bytes` step."""
    cuts = []
    target = chunk_bytes
    while target < size:
        pos = target - 1  # a newline at target - 1 puts the cut exactly at target
        while (buf := read_at(pos, _SCAN_BYTES)) and (i := buf.find(b"\n")) < 0:
            pos += len(buf)
        if not buf or pos + i + 1 >= size:
            break
        cuts.append(pos + i + 1)
        target = cuts[-1] + chunk_bytes
    return cuts


# ---------------------------------------------------------------------------------------------
# Reading units


def read_unit(
    unit: Unit, *, chunk_bytes: int | None = None, errors: str = "strict"
) -> Iterator[Batch]:
    """The batches of one unit, in order.

    `chunk_bytes` (default: the unit's) is the batch size for streams, JSONL and Parquet;
    an uncompressed text unit is one batch. `errors` is the UTF-8 policy for JSONL (invalid UTF-8
    in a line, lone surrogates in a string); text and Parquet bytes are passed through as they
    are, for the consumer to check.
    """
    check_errors_policy(errors)
    block = unit.chunk_bytes if chunk_bytes is None else chunk_bytes
    if block < 1:
        raise ValueError(f"chunk_bytes must be positive, got {block}")
    file = unit.file
    if file.format == "parquet":
        return _read_parquet(unit, block)
    if file.format == "jsonl":
        return _read_jsonl(unit, block, errors)
    if file.compression:
        return _read_text_stream(unit, block)
    return _read_text_range(unit)


def _open_raw_path(path: str):
    if "://" in path:
        return _require("fsspec", path).open(path, "rb")
    return open(path, "rb")


def _open_raw(file: SourceFile):
    return _open_raw_path(file.path)


@contextmanager
def _open_stream(unit: Unit) -> Iterator[Any]:
    """A `read(n)` stream of the unit's bytes: decompressed, or the range [start, end)."""
    file = unit.file
    with _open_raw(file) as raw:
        if file.compression is None:
            raw.seek(unit.start)
            yield _RangeReader(raw, unit.end - unit.start)
        else:
            yield _CheckedStream(_decompressor(file.compression, raw), file)


def _decompressor(compression: str, raw: BinaryIO):
    if compression == "gzip":
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "bz2":
        import bz2

        return bz2.BZ2File(raw)
    if compression == "xz":
        import lzma

        return lzma.LZMAFile(raw)
    return _ZstdReader(raw)


class _RangeReader:
    """`read(n)` over the next `length` bytes of a file."""

    def __init__(self, raw: BinaryIO, length: int):
        self.raw, self.left = raw, length

    def read(self, n: int) -> bytes:
        data = self.raw.read(min(n, self.left))
        self.left -= len(data)
        return data


class _ZstdReader:
    """`read(n)` of zstd data, all frames; raises on a truncated frame.

    (zstandard's `stream_reader` and `read_to_iter` end a truncated stream silently.)
    """

    def __init__(self, raw: BinaryIO):
        import zstandard

        self.raw, self.zstd = raw, zstandard.ZstdDecompressor()
        self.frame, self.in_frame, self.eof = self._new_frame(), False, False
        self.out: list[bytes] = []
        self.have = 0

    def _new_frame(self):
        return self.zstd.decompressobj(write_size=1 << 20)  # larger than the default: fewer joins

    def read(self, n: int) -> bytes:
        while self.have < n and not self.eof:
            self._feed(self.raw.read(_COMPRESSED_READ_BYTES))
        data = b"".join(self.out)
        self.out, self.have = [data[n:]], max(0, len(data) - n)
        return data[:n]

    def _feed(self, compressed: bytes) -> None:
        if not compressed:
            if self.in_frame:
                raise EOFError("zstd data ends in the middle of a frame")
            self.eof = True
        while compressed:
            self.out.append(self.frame.decompress(compressed))
            self.have += len(self.out[-1])
            self.in_frame = not self.frame.eof
            compressed = b""
            if self.frame.eof:  # the next frame starts in what this one left unused
                compressed, self.frame = self.frame.unused_data, self._new_frame()


class _CheckedStream:
    """A decompressing stream whose errors name the file (not a bare EOFError/OSError)."""

    def __init__(self, stream, file: SourceFile):
        self.stream, self.file = stream, file

    def read(self, n: int) -> bytes:
        try:
            return self.stream.read(n)
        except Exception as exc:  # EOFError, OSError/BadGzipFile, zlib.error, LZMAError, ZstdError
            raise SourceError(
                f"{self.file.path}: cannot read {self.file.compression} data, the file is corrupt "
                f"or truncated ({type(exc).__name__}: {exc})"
            ) from exc


def _read_text_range(unit: Unit) -> Iterator[Batch]:
    with _open_raw(unit.file) as raw:
        raw.seek(unit.start)
        data = raw.read(unit.end - unit.start)
    if len(data) != unit.end - unit.start:
        raise SourceError(f"{unit.file.path}: the file changed since its units were planned")
    yield _text_batch(data, Where(unit.file.path, "byte", unit.start))


def _read_text_stream(unit: Unit, chunk_bytes: int) -> Iterator[Batch]:
    """A compressed text file in batches cut where `corpus.chunk_boundaries` would cut it."""
    name = f"{unit.file.path} (decompressed)"
    reach_back = boundary_reach_back(unit.special_tokens)
    with _open_stream(unit) as stream:
        window = _StreamWindow(stream)
        start = 0
        for cut in iter_safe_boundaries(window.read_at, chunk_bytes, unit.special_tokens,
                                        whitespace_cuts=unit.whitespace_cuts):
            yield _text_batch(window.read_at(start, cut - start), Where(name, "byte", start))
            window.forget_before(cut - reach_back)  # later reads start at most this far back
            start = cut
        rest = window.read_to_end(start)
        if rest:
            yield _text_batch(rest, Where(name, "byte", start))


class _StreamWindow:
    """Random reads, moving forward, over a forward-only stream: keeps what may be read again."""

    def __init__(self, stream):
        self.stream, self.start, self.buf, self.eof = stream, 0, bytearray(), False

    def read_at(self, pos: int, n: int) -> bytes:
        assert pos >= self.start, "read before the window"
        while self.start + len(self.buf) < pos + n and not self.eof:
            more = self.stream.read(max(n, _SCAN_BYTES))
            self.eof = not more
            self.buf += more
        with memoryview(self.buf) as view:  # one copy, not two
            return bytes(view[pos - self.start : pos - self.start + n])

    def read_to_end(self, pos: int) -> bytes:
        while more := self.stream.read(_COMPRESSED_READ_BYTES):
            self.buf += more
        self.eof = True
        with memoryview(self.buf) as view:
            return bytes(view[pos - self.start :])

    def forget_before(self, pos: int) -> None:
        if pos > self.start:
            del self.buf[: pos - self.start]
            self.start = pos


# JSONL ------------------------------------------------------------------------------------------


def _read_jsonl(unit: Unit, block_bytes: int, errors: str) -> Iterator[Batch]:
    if unit.end is not None and unit.end - unit.start < 2 * block_bytes:
        block_bytes = unit.end - unit.start  # a planned range: one batch, not one and a scrap
    lines_before = 0  # lines of the unit before the block
    with _open_stream(unit) as stream:
        for offset, block in _line_blocks(stream, block_bytes):
            lines = block.split(b"\n")
            batch = _jsonl_batch(lines, unit, offset, lines_before, errors)
            lines_before += len(lines) - 1
            if batch is not None:
                yield batch


def _line_blocks(stream, block_bytes: int) -> Iterator[tuple[int, bytes]]:
    """Blocks of whole lines of about `block_bytes`, each with its offset in the stream."""
    pending: list[bytes] = []  # a list, not bytes +=, so a very long line costs linear time
    offset = 0
    while chunk := stream.read(block_bytes):
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            pending.append(chunk)
            continue
        pending.append(chunk[:cut])
        block = b"".join(pending)
        yield offset, block
        offset += len(block)
        pending = [chunk[cut:]]
    if rest := b"".join(pending):
        yield offset, rest


def _jsonl_batch(
    lines: list[bytes], unit: Unit, offset: int, lines_before: int, errors: str
) -> Batch | None:
    """The documents of a block's lines, which start at byte `offset` of the (decompressed) file."""
    field = unit.file.field
    loads = json.loads
    pieces, doc_lines = [], []
    for i, line in enumerate(lines):
        try:  # the fast path; anything unusual is redone step by step below
            piece = loads(line.decode("utf-8"))[field].encode("utf-8")
        except Exception:
            if not line.strip(b" \t\r"):  # a blank line: skipped
                continue
            piece = _jsonl_line_slowly(lines, i, offset, lines_before, unit, errors)
        pieces.append(piece)
        doc_lines.append(i)
    if not pieces:
        return None
    where = Where(unit.file.path, "line", lines_before, np.array(doc_lines), unit.file, unit.start)
    return _batch(pieces, True, where)


def _jsonl_line_slowly(
    lines: list[bytes], i: int, offset: int, lines_before: int, unit: Unit, errors: str
) -> bytes:
    """`lines[i]` as a document, or the precise error: bad UTF-8, bad JSON, no field..."""
    file, line = unit.file, lines[i]

    def place() -> str:
        return f"{file.path} line {_line_number(file, unit.start, lines_before + i)}"

    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        if errors == "replace":
            text = line.decode("utf-8", "replace")
        else:
            at = unit.start + offset + sum(len(before) + 1 for before in lines[:i]) + exc.start
            raise InvalidUTF8Error(
                f"{place()}: invalid UTF-8 at byte offset {at} of the "
                f"{'decompressed data' if file.compression else 'file'} "
                f"(bytes {line[exc.start:exc.end]!r}: {exc.reason}); pass errors='replace' to read "
                "such bytes as U+FFFD",
                at,
            ) from None
    if unit.start + offset == 0 and i == 0:
        text = text.removeprefix("\ufeff")  # a byte-order mark some tools write
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = (
            " (.json files are read as JSON Lines: one object per line)"
            if file.path.lower().endswith(".json")
            else ""
        )
        raise SourceError(
            f"{place()}: not valid JSON: {exc.msg} at column {exc.colno}{hint}"
        ) from None
    except RecursionError:
        raise SourceError(f"{place()}: JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise SourceError(
            f"{place()}: expected a JSON object with a {file.field!r} field, "
            f"got {_json_type(value)}"
        )
    if file.field not in value:
        keys = ", ".join(map(repr, list(value)[:10])) or "none"
        raise SourceError(
            f"{place()}: no {file.field!r} field (fields: {keys}); choose one with text_field="
        )
    text = value[file.field]
    if not isinstance(text, str):
        raise SourceError(
            f"{place()}: the {file.field!r} field is {_json_type(text)}, not a string"
        )
    return encode_document(text, errors, place)


def _json_type(value: Any) -> str:
    names = {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
    }
    return names.get(type(value), "a number")


def _line_number(file: SourceFile, unit_start: int, line_in_unit: int) -> int:
    """1-based line of the file; counts the newlines before the unit (only for a message)."""
    before = 0
    if unit_start:
        with _open_raw(file) as raw:
            left = unit_start
            while left and (buf := raw.read(min(left, 1 << 20))):
                before += buf.count(b"\n")
                left -= len(buf)
    return before + line_in_unit + 1


# Parquet ----------------------------------------------------------------------------------------


def _read_parquet(unit: Unit, batch_bytes: int) -> Iterator[Batch]:
    file = unit.file
    with _open_parquet(file.path) as parquet:
        meta = parquet.metadata.row_group(unit.row_group)
        text_bytes = next(
            (
                meta.column(j).total_uncompressed_size
                for j in range(meta.num_columns)
                if meta.column(j).path_in_schema == file.field
            ),
            batch_bytes,
        )
        rows_per_batch = max(1, batch_bytes * meta.num_rows // max(1, text_bytes))
        row = unit.first_row
        for record_batch in parquet.iter_batches(
            batch_size=rows_per_batch,
            row_groups=[unit.row_group],
            columns=[file.field],
            use_threads=False,
        ):
            yield from _arrow_strings_batches(record_batch.column(0), file, row)
            row += record_batch.num_rows


def _arrow_strings_batches(array, file: SourceFile, first_row: int) -> Iterator[Batch]:
    """Arrow strings as batches, their offsets and data buffers taken without a copy."""
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        for chunk in array.chunks:
            yield from _arrow_strings_batches(chunk, file, first_row)
            first_row += len(chunk)
        return
    if not len(array):
        return
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_string_view(array.type):
        array = array.cast(pa.large_string())
    if array.null_count:
        row = first_row + int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0]) + 1
        raise SourceError(f"{file.path} row {row}: the {file.field!r} value is null")
    _, offsets_buffer, data_buffer = array.buffers()
    offset_type = np.int64 if pa.types.is_large_string(array.type) else np.int32
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type)[
        array.offset : array.offset + len(array) + 1
    ]
    start, end = int(offsets[0]), int(offsets[-1])
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)[start:end]
        if end > start
        else np.empty(0, np.uint8)
    )
    data.flags.writeable = False
    doc_ends = offsets[1:].astype(np.int64) - start
    yield Batch(data, doc_ends, True, Where(file.path, "row", first_row + 1))
