"""Reading the corpus: checking the file, cutting it into chunks, decoding UTF-8.

Chunks are byte ranges of the file. Workers read their own range, so no text crosses a pipe, and
memory stays bounded by the chunk size whatever the file size. A chunk boundary is only placed
where it cannot change the result (see `safe_boundary_after`):

- at the start of a special-token occurrence that no other occurrence overlaps: special tokens
  are cut out before pre-tokenization and the pattern runs on each stretch between them on its
  own, so nothing is ever merged across them, whatever the pattern; or, failing that,
- only for the built-in patterns (`WHITESPACE_CUT_PATTERNS`: GPT-2's in both spellings, cl100k's,
  o200k's), between an ASCII letter or digit and a following space or newline: each of them ends
  a pre-token there, and none looks behind, so the text on either side splits the same way alone
  as it does joined (checked with hypothesis against `regex` at every such place, in
  tests/test_exactness.py).

A custom pattern gets no whitespace cuts: nothing about an arbitrary `regex` pattern can be
checked on a window of text (a lookahead may read to the end of the stretch, a lookbehind, `\\b`
or `\\G` looks before the cut, `^`/`$` depend on where the string ends), so only special tokens,
document boundaries and file ends cut it, where the pattern is applied to each side separately by
definition. The cost: a text file without special tokens is one unit of work, read and
pre-tokenized whole by one worker (memory grows with the file; a directory of files, or JSONL or
Parquet documents, still run in parallel).

Invalid UTF-8 policy: `errors="strict"` (the default) raises `InvalidUTF8Error` naming the byte
offset in the file; `errors="replace"` decodes each invalid sequence to U+FFFD exactly as
`bytes.decode("utf-8", errors="replace")` does on the whole file. Boundaries sit before an ASCII
byte or a special token's first byte (ASCII or a lead byte), where the decoder always starts a new
sequence, so each chunk decodes to exactly its part of the whole file's text.

Special tokens are matched after that decoding, so a special token that contains U+FFFD may match
text whose bytes in the file are an invalid sequence, not EF BF BD: such an occurrence is not
found in the raw bytes, and a cut inside it would split it. So when some special token contains
U+FFFD, no boundary lies within L bytes of an invalid sequence, L being the longest special
token's UTF-8 length (`_invalid_utf8_near`; applied whatever the policy, since under "strict"
such a file is refused anyway). Why L is enough: a special-token occurrence in the decoded text
is a run of characters, each either a valid sequence copied byte for byte or a U+FFFD (3 bytes
when encoded) standing for an invalid sequence of 1 to 3 bytes of the file, so the occurrence
covers at most L bytes of the file. If it covers no invalid sequence, its bytes in the file are
the special token's own UTF-8 bytes, and the raw search sees it; if it covers one and spans a
boundary b (starts before b, ends after b), that invalid sequence lies within L bytes of b.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

import numpy as np
import regex

from .patterns import CL100K_PATTERN, GPT2_PATTERN, O200K_PATTERN, TIKTOKEN_GPT2_PATTERN

DEFAULT_CHUNK_BYTES = 2 << 20
UTF8_ERROR_POLICIES = ("strict", "replace")

# A letter or digit followed by a space or newline: with these patterns a pre-token always ends
# between the two (proven with hypothesis in tests/test_exactness.py); with any other pattern
# nothing is assumed.
# (The boundary is where a match starts. A match starts at the space or newline, which text has
# few of: a rule that began with the letter, `[A-Za-z0-9](?=[ \n])`, tried every letter, 50 ns
# a byte on text without whitespace, such as a base64 blob, where this takes 2-3.)
_WHITESPACE_BOUNDARY = regex.compile(rb"(?<=[A-Za-z0-9])[ \n]")
# The same in a str, where the cut is the start of the group `cut` of a match (each rule's
# matches start at a whitespace character too: 2-6 ns a character on text without any).
_WHITESPACE_TEXT_BOUNDARY = regex.compile(r"(?<=[A-Za-z0-9])(?P<cut>)[ \n]")
# Where the compiled scanners' patterns allow more: GPT-2's pre-tokens never hold a non-space
# character followed by whitespace; cl100k's and o200k's never a letter or digit followed by
# whitespace (their punctuation takes the newlines after it), nor a newline followed by a letter
# or digit. So text without ASCII (Cyrillic, Greek, or CJK between newlines) can be cut too.
# Each rule's cut is the start of its group `cut`. A batch's groups search them forwards
# (`safe_text_cut`); a stream's windows backwards (`(?r)`, `last_text_cut_rule`) for the first
# alternative only: with the newline one, text without whitespace took 7 ms a million
# characters to search backwards, against 2.5. Proven with hypothesis in tests/test_exactness.py.
_NON_SPACE_BEFORE_SPACE = r"(?<=\S)(?P<cut>)\s"
_LETTER_OR_DIGIT_BEFORE_SPACE = r"(?<=[\p{L}\p{N}])(?P<cut>)\s"
_NEWLINE_BEFORE_LETTER_OR_DIGIT = r"\n(?P<cut>)(?=[\p{L}\p{N}])"
_CUT_RULES = {GPT2_PATTERN: (_NON_SPACE_BEFORE_SPACE,),
              TIKTOKEN_GPT2_PATTERN: (_NON_SPACE_BEFORE_SPACE,),
              CL100K_PATTERN: (_LETTER_OR_DIGIT_BEFORE_SPACE, _NEWLINE_BEFORE_LETTER_OR_DIGIT),
              O200K_PATTERN: (_LETTER_OR_DIGIT_BEFORE_SPACE, _NEWLINE_BEFORE_LETTER_OR_DIGIT)}
_TEXT_CUT_RULES = {pattern: regex.compile("|".join(rules)) for pattern, rules in _CUT_RULES.items()}
_LAST_TEXT_CUT_RULES = {pattern: regex.compile("(?r)" + rules[0])
                        for pattern, rules in _CUT_RULES.items()}
_SURROGATE = regex.compile("[\ud800-\udfff]")
WHITESPACE_CUT_PATTERNS = frozenset(_CUT_RULES)  # the patterns whose cut rules are proven
_REPLACEMENT = "\ufffd".encode()
_UTF8_SLACK = 3  # bytes of context beyond a window that decide whether its UTF-8 is valid


def whitespace_cuts_allowed(pattern: str | None) -> bool:
    """Whether text pre-tokenized with `pattern` may be cut between an ASCII letter or digit and
    a space or newline (only for the built-in patterns, where it is proven)."""
    return pattern in WHITESPACE_CUT_PATTERNS


def boundary_reach_back(special_tokens: Sequence[str]) -> int:
    """How far before a boundary `iter_safe_boundaries` may read again (and so how much of a
    stream must be kept before the last boundary)."""
    return max((len(t.encode("utf-8")) for t in special_tokens), default=1) + _UTF8_SLACK


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


def decoded_documents(data, doc_ends, errors: str, place,
                      offset_base: int | None = None) -> list[str]:
    """The documents of `data` (a uint8 array of UTF-8 documents ending at `doc_ends`, or one if
    None) as `str`, under the policy as `check_utf8` applies it. Python's decoder checks the
    bytes; the UTF-8 kernel runs only when it fails (to name the first bad byte, or to replace
    as the compiled paths do), so valid text compiles nothing."""
    try:
        return _decode(data, doc_ends)
    except UnicodeDecodeError:
        return _decode(*check_utf8(data, errors, place, doc_ends, offset_base))


def _decode(data, doc_ends) -> list[str]:
    raw = data.tobytes()
    bounds = [0, *([len(raw)] if doc_ends is None else doc_ends.tolist())]
    return [raw[start:end].decode("utf-8") for start, end in zip(bounds, bounds[1:])]


def compile_utf8_check() -> None:
    """Compile (or load) `check_utf8`'s kernel, for the argument types of the text it is given
    (read-only bytes)."""
    from .scanners.classes import first_invalid_utf8

    first_invalid_utf8(np.frombuffer(b"a", dtype=np.uint8), 0, 1)


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


def _invalid_utf8_near(buf: bytes, pos: int, reach: int, starts_stream: bool) -> bool:
    """Whether decoding the whole stream meets an invalid UTF-8 sequence that overlaps
    buf[pos - reach : pos + reach) (True also when `buf` holds too little to tell).

    Needs `_UTF8_SLACK` bytes of `buf` after that window, and as many before it unless `buf`
    starts the stream (`starts_stream`). The decoder starts a new sequence at every byte that
    is not a continuation byte (10xxxxxx), and after an invalid sequence at its end (as
    `exc.end`), so decoding from the first such byte of the slack before the window does what
    the whole stream's decoding does there (a fourth continuation byte in a row is invalid
    anyway); a sequence cut short by the end of the slack starts at or after pos + reach.
    """
    lo = pos - reach - _UTF8_SLACK
    if lo < 0:
        if not starts_stream:
            return True
        lo = 0
    hi = pos + reach + _UTF8_SLACK
    if hi > len(buf):
        return True
    window = bytes(buf[lo:hi])
    if window.isascii():
        return False
    first, last = pos - reach - lo, pos + reach - lo  # the window, in `window`
    at = 0
    if lo > 0:
        while at < _UTF8_SLACK and 0x80 <= window[at] < 0xC0:
            at += 1
    while True:
        try:
            window[at:].decode("utf-8")
            return False
        except UnicodeDecodeError as exc:
            bad_start, bad_end = at + exc.start, at + exc.end
            if bad_start >= last:
                return False
            if bad_end > first:
                return True
            at = bad_end


def _cut_margin(specials: Sequence[bytes]) -> tuple[int, bool]:
    """(bytes a boundary needs after it in the buffer to be checked, whether invalid UTF-8
    near a boundary must be ruled out: some special token contains U+FFFD)."""
    longest = max((len(t) for t in specials), default=1)
    guard = any(_REPLACEMENT in t for t in specials)
    return longest + (_UTF8_SLACK if guard else 0), guard


def safe_boundary_after(buf: bytes, start: int, specials: Sequence[bytes], *,
                        whitespace_cuts: bool = True, starts_stream: bool = True) -> int | None:
    """The first safe chunk boundary in `buf` at or after `start`, or None if there is none.

    Prefers special-token occurrences (document boundaries) over whitespace boundaries, which
    are only considered with `whitespace_cuts` (see `whitespace_cuts_allowed`). A position too
    close to the end of `buf` to be checked is not returned. When some special token contains
    U+FFFD, a position near invalid UTF-8 is not returned either (see the module docstring);
    `starts_stream` says whether buf[0] is the first byte of the file or stream, and `buf` must
    hold `boundary_reach_back` bytes before `start` otherwise.
    """
    longest = max((len(t) for t in specials), default=1)
    margin, guard = _cut_margin(specials)
    limit = len(buf) - margin  # a match at or past here could run off the end of buf

    def safe(pos: int) -> bool:
        return not _covered_by_special(buf, pos, specials) and not (
            guard and _invalid_utf8_near(buf, pos, longest, starts_stream))

    pos = start
    while specials:
        hits = [buf.find(t, pos, len(buf)) for t in specials]
        hits = [h for h in hits if 0 <= h]
        if not hits:
            break
        first = min(hits)
        if first >= limit:
            break
        if safe(first):
            return first
        pos = first + 1
    if not whitespace_cuts:
        return None
    pos = start
    while True:
        match = _WHITESPACE_BOUNDARY.search(buf, pos + 1)  # a letter at pos or after
        if match is None or match.start() >= limit:
            return None
        boundary = match.start()
        if safe(boundary):
            return boundary
        pos = boundary


def iter_safe_boundaries(
    read_at: Callable[[int, int], bytes],
    chunk_bytes: int,
    special_tokens: Sequence[str] = (),
    *,
    whitespace_cuts: bool = True,
) -> Iterator[int]:
    """The inner chunk boundaries of a byte sequence, ascending, chosen as `chunk_boundaries` does.

    `whitespace_cuts` allows boundaries between an ASCII letter or digit and a space or newline
    (see `whitespace_cuts_allowed`); without it only special tokens cut, and without special
    tokens there is no inner boundary at all. `read_at(pos, n)` returns the bytes at
    [pos, pos + n), fewer only at the end of the sequence. Reads only move forward, except back
    by at most `boundary_reach_back(special_tokens)` bytes before the last boundary yielded, so a
    forward-only stream kept in a sliding window can serve them; the boundaries depend only on
    the bytes, never on how the reads are served. Time is linear in the bytes read, and memory
    bounded by the search window, however long a stretch without a safe place.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    specials = [t.encode("utf-8") for t in special_tokens]
    if not specials and not whitespace_cuts:
        return
    reach_back = boundary_reach_back(special_tokens)
    margin, _ = _cut_margin(specials)
    window = max(chunk_bytes, 64 << 10, 4 * reach_back)
    target = chunk_bytes
    while True:
        # Look from `target` on for a safe place, reading on a window at a time until one is found.
        base = max(0, target - reach_back)
        want = target - base + window
        buf = read_at(base, want)
        if base + len(buf) <= target:  # nothing after `target`: the rest is the last chunk
            return
        at_end = len(buf) < want
        start = target - base
        while (found := safe_boundary_after(buf, start, specials, whitespace_cuts=whitespace_cuts,
                                            starts_stream=base == 0)) is None:
            if at_end:
                return
            # Every place before len(buf) - margin was checked (and what decides it lies in buf):
            # go on from there, keeping only the bytes a later check looks back at.
            resume = max(start, len(buf) - margin)
            keep = max(0, resume - reach_back)
            more = read_at(base + len(buf), window)
            at_end = len(more) < window
            buf = buf[keep:] + more
            base += keep
            start = resume - keep
        yield base + found
        target = base + found + chunk_bytes


def last_text_cut_rule(pattern: str | None):
    """`pattern`'s cut rule (`safe_text_cut`'s first alternative) compiled to search backwards:
    `rule.search(text, pos, endpos)` finds the last cut there, at `match.start("cut")`. None for
    a pattern without a proven rule."""
    return _LAST_TEXT_CUT_RULES.get(pattern)


def safe_text_cut(text: str, at: int, special_tokens: Sequence[str] = (), *,
                  whitespace_cuts: bool = True, pattern: str | None = None,
                  before: int | None = None) -> int | None:
    """The first safe place to cut a str at or after character `at` (0 < place < len(text),
    and place < `before` if given: the search stops there), or None: the same rules as
    `safe_boundary_after`, in characters, for a text held whole; with `pattern`, the text is
    pre-tokenized with it: one of the built-in ones has its own wider rule (`_TEXT_CUT_RULES`),
    any other none (no whitespace cut is proven for it). The text on either side of such a
    place, turned into UTF-8 on its own (lone surrogates becoming U+FFFD, as `Tokenizer.encode`
    does), is the whole text's UTF-8 on that side: the places lie just before whitespace (after
    an ASCII letter or digit, by default) or at a special token's first character, never inside
    a surrogate pair. Cutting the str, not its UTF-8, spares encoding a long text to find them
    (0.6 ms for multi_1M's longest, holding the GIL).

    When a special token contains U+FFFD, a lone surrogate of the text may become part of an
    occurrence that the str does not show: then no place is safe."""
    if any("\ufffd" in t or _has_surrogate(t) for t in special_tokens):
        return None
    specials = [t for t in special_tokens if t]
    rule = None
    if whitespace_cuts:
        rule = _WHITESPACE_TEXT_BOUNDARY if pattern is None else _TEXT_CUT_RULES.get(pattern)
    limit = len(text) if before is None else min(len(text), before)
    place = _safe_text_cut_after(text, max(at, 1), specials, rule, limit)
    return place if place is not None and place < limit else None


def _has_surrogate(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def _safe_text_cut_after(text: str, start: int, specials: list[str], rule,
                         limit: int) -> int | None:
    """The first safe place at or after `start` inside `text` (0 < place < len(text)), or None,
    searched up to `limit`; whitespace cuts where `rule` (a compiled regex, or None) says, at
    the start of its group `cut`.
    Looked for a window at a time, so that the search for each cut reads about as far as the
    cut (`str.find` over the rest of a long text for every cut made cutting quadratic)."""
    window = 1 << 12
    longest = max(map(len, specials), default=1)
    while start < limit:
        end = min(start + window, limit)
        best = None
        pos = start
        while specials:  # the first occurrence that starts in the window and none covers
            hits = [h for t in specials if (h := text.find(t, pos, end + len(t) - 1)) >= 0]
            if not hits:
                break
            first = min(hits)
            if not _covered_by_special(text, first, specials):
                best = first
                break
            pos = first + 1
        if rule is not None:
            pos = start
            stop = end if best is None else best
            while (match := rule.search(text, pos, stop + 1)) is not None:
                # (stop + 1: a match may end at `stop` + 1, or look at it, for a cut at `stop`)
                cut = match.start("cut")
                if not _covered_by_special(text, cut, specials):
                    return cut
                pos = match.end()
        if best is not None:
            return best
        start = max(start + 1, end - longest)  # an occurrence may start just before `end`
        window *= 2
    return None


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
    pattern: str | None = GPT2_PATTERN,
) -> list[int]:
    """Byte offsets [0, b1, ..., size] cutting the file into chunks of about `chunk_bytes`,
    safe for pre-tokenization with `pattern` (a custom pattern is cut at special tokens only)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    size = os.path.getsize(path) if size is None else size
    with open(path, "rb") as f:
        inner = list(iter_safe_boundaries(reader_at(f, size), chunk_bytes, special_tokens,
                                          whitespace_cuts=whitespace_cuts_allowed(pattern)))
    return [0, *inner, size]
