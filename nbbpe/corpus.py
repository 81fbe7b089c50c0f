"""Reading the corpus: checking the file, cutting it into chunks, decoding UTF-8.

Chunks are byte ranges of the file. Workers read their own range, so no text crosses a pipe, and
memory stays bounded by the chunk size whatever the file size. A chunk boundary is only placed
where it cannot change the result (see `safe_boundary_after`):

- at the start of a special-token occurrence that no other occurrence overlaps: special tokens
  are cut out before pre-tokenization, so nothing is ever merged across them; or, failing that,
- between an ASCII letter or digit and a following space or newline: every supported pattern ends
  a pre-token there, and none looks behind, so the text on either side splits the same way alone
  as it does joined (checked against `regex` on the joined text in the tests).

Invalid UTF-8 policy: `errors="strict"` (the default) raises `InvalidUTF8Error` naming the byte
offset in the file; `errors="replace"` decodes each invalid sequence to U+FFFD exactly as
`bytes.decode("utf-8", errors="replace")` does on the whole file (boundaries sit before ASCII bytes
or a special token's first byte, which always start a new sequence, so chunking cannot change it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

import numpy as np
import regex

DEFAULT_CHUNK_BYTES = 2 << 20
UTF8_ERROR_POLICIES = ("strict", "replace")

# A letter or digit followed by a space or newline: a pre-token always ends between the two.
_WHITESPACE_BOUNDARY = regex.compile(rb"[A-Za-z0-9](?=[ \n])")


class InvalidUTF8Error(ValueError):
    """The corpus is not valid UTF-8 and the policy is "strict".

    `offset` is the position of the first invalid byte in the file (None if unknown).
    """

    def __init__(self, message: str, offset: int | None = None):
        super().__init__(message)
        self.offset = offset

    def __reduce__(self):  # keep `offset` when a worker process sends the error back
        return type(self), (self.args[0], self.offset)


def check_corpus_path(path: str | os.PathLike) -> int:
    """Return the size of the corpus file, or raise naming what is wrong with it."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"corpus file not found: {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"corpus path is a directory, not a file: {path!r}")
    size = os.path.getsize(path)
    if size == 0:
        raise ValueError(f"corpus file is empty: {path!r}")
    return size


def check_errors_policy(errors: str) -> None:
    if errors not in UTF8_ERROR_POLICIES:
        raise ValueError(f"errors must be one of {UTF8_ERROR_POLICIES}, got {errors!r}")


def decode_utf8(data: bytes, errors: str, *, source: str = "corpus", offset: int = 0) -> str:
    """Decode `data` (found at byte `offset` of `source`) under the invalid-UTF-8 policy."""
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.end]
        raise InvalidUTF8Error(
            f"{source}: invalid UTF-8 at byte offset {offset + exc.start} "
            f"(bytes {bad!r}: {exc.reason}); pass errors='replace' to read such bytes as U+FFFD",
            offset + exc.start,
        ) from None


def check_utf8(data, errors: str, place, doc_ends=None, offset_base: int | None = None):
    """(data, doc_ends): `data` (a uint8 array of documents ending at `doc_ends`) made valid
    UTF-8 under the policy. Valid data comes back as it is. Otherwise "strict" raises
    `InvalidUTF8Error` naming `place(offset)` of the first invalid byte (and recording
    offset_base + offset as its file offset, if offset_base is given); "replace" decodes each
    document with errors="replace" and returns their re-encoded bytes."""
    from .scanners.classes import first_invalid_utf8

    bad = first_invalid_utf8(data, 0, len(data))
    if bad < 0:
        return data, doc_ends
    if errors == "strict":
        end = bad + 1
        while end < min(len(data), bad + 4) and data[end] & 0xC0 == 0x80:
            end += 1
        raise InvalidUTF8Error(
            f"{place(bad)}: invalid UTF-8 (bytes {bytes(data[bad:end])!r}); pass "
            "errors='replace' to read such bytes as U+FFFD",
            None if offset_base is None else offset_base + bad,
        )
    if doc_ends is None:
        fixed = [bytes(data).decode("utf-8", errors="replace").encode("utf-8")]
    else:
        starts = [0, *doc_ends[:-1].tolist()]
        fixed = [bytes(data[a:b]).decode("utf-8", errors="replace").encode("utf-8")
                 for a, b in zip(starts, doc_ends.tolist())]
    new_ends = np.cumsum([len(f) for f in fixed], dtype=np.int64)
    return np.frombuffer(b"".join(fixed), dtype=np.uint8), (None if doc_ends is None else new_ends)


def first_invalid_utf8_error(path, ranges, found: InvalidUTF8Error) -> InvalidUTF8Error:
    """The error for the file's first invalid byte: `found`, or one in an earlier chunk.

    Workers check chunks in parallel, and the first error to arrive need not be the first in
    the file; this rereads the chunks before it, so the error named never depends on timing.
    """
    if found.offset is None:
        return found
    for start, end in ranges:
        if start >= found.offset:
            break
        try:
            decode_utf8(read_range(path, start, end), "strict", source=os.fspath(path), offset=start)
        except InvalidUTF8Error as earlier:
            return earlier
    return found


def read_range(path: str | os.PathLike, start: int, end: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


def _covered_by_special(buf: bytes, pos: int, specials: Sequence[bytes]) -> bool:
    """Whether an occurrence of a special token starts before `pos` and ends after it."""
    for token in specials:
        lo = max(0, pos - len(token) + 1)
        found = buf.find(token, lo, pos + len(token) - 1)
        if 0 <= found < pos:
            return True
    return False


def safe_boundary_after(buf: bytes, start: int, specials: Sequence[bytes]) -> int | None:
    """The first safe chunk boundary in `buf` at or after `start`, or None if there is none.

    Prefers special-token occurrences (document boundaries) over whitespace boundaries.
    A position too close to the end of `buf` to be checked is not returned.
    """
    longest = max((len(t) for t in specials), default=1)
    limit = len(buf) - longest  # a match at or past here could run off the end of buf
    pos = start
    while specials:
        hits = [buf.find(t, pos, len(buf)) for t in specials]
        hits = [h for h in hits if 0 <= h]
        if not hits:
            break
        first = min(hits)
        if first >= limit:
            break
        if not _covered_by_special(buf, first, specials):
            return first
        pos = first + 1
    pos = start
    while True:
        match = _WHITESPACE_BOUNDARY.search(buf, pos)
        if match is None or match.end() >= limit:
            return None
        boundary = match.end()
        if not _covered_by_special(buf, boundary, specials):
            return boundary
        pos = boundary


def iter_safe_boundaries(
    read_at: Callable[[int, int], bytes],
    chunk_bytes: int,
    special_tokens: Sequence[str] = (),
) -> Iterator[int]:
    """The inner chunk boundaries of a byte sequence, ascending, chosen as `chunk_boundaries` does.

    `read_at(pos, n)` returns the bytes at [pos, pos + n), fewer only at the end of the sequence.
    Reads only move forward, except back by at most the longest special token's length before the
    last boundary yielded, so a forward-only stream kept in a sliding window can serve them; the
    boundaries depend only on the bytes, never on how the reads are served.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    specials = [t.encode("utf-8") for t in special_tokens]
    reach_back = max((len(t) for t in specials), default=1)
    window = max(chunk_bytes, 64 << 10, 4 * reach_back)
    target = chunk_bytes
    while True:
        # Look from `target` on for a safe place, widening the window until one is found.
        base = max(0, target - reach_back)
        want = target - base + window
        buf = read_at(base, want)
        if base + len(buf) <= target:  # nothing after `target`: the rest is the last chunk
            return
        at_end = len(buf) < want
        while (found := safe_boundary_after(buf, target - base, specials)) is None:
            if at_end:
                return
            more = read_at(base + len(buf), window)
            at_end = len(more) < window
            buf += more
        yield base + found
        target = base + found + chunk_bytes


def reader_at(f: BinaryIO, size: int) -> Callable[[int, int], bytes]:
    """`read_at(pos, n)` over a seekable binary file of `size` bytes."""

    def read_at(pos: int, n: int) -> bytes:
        f.seek(pos)
        return f.read(max(0, min(n, size - pos)))

    return read_at


def chunk_boundaries(
    path: str | os.PathLike,
    chunk_bytes: int,
    special_tokens: Sequence[str] = (),
    *,
    size: int | None = None,
) -> list[int]:
    """Byte offsets [0, b1, ..., size] cutting the file into chunks of about `chunk_bytes`."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    size = os.path.getsize(path) if size is None else size
    with open(path, "rb") as f:
        inner = list(iter_safe_boundaries(reader_at(f, size), chunk_bytes, special_tokens))
    return [0, *inner, size]
