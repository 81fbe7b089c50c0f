"""The Tokenizer: text <-> token ids with a trained (vocab, merges).

Encoding is three steps over a block of text (at most about `BLOCK_CHARS` characters at a time):

1. pre-tokenization (`Tokenizer._pretokenize`): special tokens are cut out (longest first), the
   text between them is split with the pattern, and all pieces become one flat UTF-8 buffer with
   int64 offsets. This is the only step that knows about `regex`; a compiled scanner producing
   the same offsets can replace it;
2. the `encode_pretokens` kernel (encode.py) turns all pieces of the block into ids at once;
3. blocks are cut only where the ids cannot depend on what follows (`Tokenizer._safe_cut`), so
   long texts and streams give exactly the ids of the whole text.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import numpy as np
import regex

from .encode import (
    build_rank_table,
    char_to_byte_offsets,
    encode_pretokens,
    gather_token_bytes,
    new_cache,
)
from .pretokenize import (
    GPT2_PATTERN,
    special_token_regex,
    uses_compiled_pretokenizer,
    validate_special_tokens,
)
from .pretokenize_kernels import SpecialTokenSplitter, scan_gpt2
from .vocab_files import (
    Merges,
    Vocab,
    check_merges,
    check_vocab,
    load_hf_tokenizer_json,
    load_tokenizer_config,
    load_vocab_and_merges,
    save_gpt2_files,
    save_hf_tokenizer_json,
    save_pickle_files,
    save_tiktoken_ranks,
    save_tokenizer_config,
    tiktoken_ranks,
)

BLOCK_CHARS = 1 << 20  # characters encoded per kernel call: bounds the temporary lists
_MAX_ID = (1 << 31) - 1  # ids are int32 in the kernels
_NO_SLOTS = np.zeros(0, dtype=np.int64)
_NO_IDS = np.zeros(0, dtype=np.int32)

# Where a block may end: between a pre-token and a following whitespace character. With GPT-2's
# pattern a non-space character followed by a space always ends a pre-token, and the matches
# before it never look further than that space; other patterns (cl100k's included) are cut only
# after a letter or digit, which none of them lets a match run past. `(?r)` searches backwards.
_GPT2_CUT = regex.compile(r"(?r)\S\s")
_OTHER_CUT = regex.compile(r"(?r)[\p{L}\p{N}]\s")


class Tokenizer:
    """Byte-level BPE: `encode`, `encode_iterable`, `decode` with a (vocab, merges) pair.

    `vocab` maps id -> token bytes and must hold all 256 single bytes; `merges` lists the
    (left, right) byte pairs in order of priority. Special tokens are appended to the vocab
    (next free ids, in the order given) unless their bytes are already in it; in text they are
    matched longest first and always become their one id. Merges are applied inside each
    pre-token, lowest rank first, as GPT-2 does.

    Text with lone surrogates (not encodable as UTF-8) is encoded as tiktoken does: they become
    U+FFFD first. `encode_iterable` and long texts are cut into blocks only where the cut cannot
    change the ids; for patterns other than GPT-2's and cl100k's this assumes a pre-token always
    ends between a letter or digit and a following whitespace character.

    Options: `pattern`, the pre-tokenization regex (GPT-2's by default); `pretokenizer`, "auto"
    (the compiled scanner for GPT-2's pattern, `regex` for any other) or "regex" (the reference
    path, for any pattern); `cache_size`, how many
    encoded pre-tokens to remember (0: none); `block_chars`, how much text goes to the kernel at
    once (it bounds the temporary memory; the ids do not depend on it).
    """

    def __init__(
        self,
        vocab: Vocab,
        merges: Merges,
        special_tokens: Iterable[str] | None = None,
        *,
        pattern: str = GPT2_PATTERN,
        pretokenizer: str = "auto",
        cache_size: int = 1 << 17,
        block_chars: int = BLOCK_CHARS,
    ):
        vocab = check_vocab(vocab)
        merges = check_merges(merges)
        specials = validate_special_tokens(special_tokens)
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
        compiled = regex.compile(pattern)
        if compiled.groups:
            raise ValueError(f"pattern {pattern!r} has capturing groups; use (?:...) so that "
                             "findall returns whole matches")

        ids: dict[bytes, int] = {}
        for i, token in vocab.items():
            if i > _MAX_ID:
                raise ValueError(f"vocab id {i} is too large (ids must be below 2**31)")
            ids.setdefault(token, i)  # the same bytes twice: the lower id encodes them
        next_id = max(vocab, default=-1) + 1
        self._special_ids: dict[str, int] = {}
        for token in specials:
            try:
                data = token.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"special token {token!r} cannot be encoded as UTF-8") from None
            if data not in ids:
                vocab[next_id] = data
                ids[data] = next_id
                next_id += 1
            self._special_ids[token] = ids[data]
        missing = [b for b in range(256) if bytes([b]) not in ids]
        if missing:
            raise ValueError(
                f"the vocab lacks {len(missing)} of the 256 single bytes (first: "
                f"{bytes([missing[0]])!r}); byte-level BPE needs them all to encode any text"
            )

        left = np.empty(len(merges), dtype=np.int32)
        right = np.empty(len(merges), dtype=np.int32)
        merged = np.empty(len(merges), dtype=np.int32)
        seen: dict[tuple[bytes, bytes], int] = {}
        for r, (a, b) in enumerate(merges):
            for side in (a, b):
                if side not in ids:
                    raise ValueError(f"merge {r} {(a, b)!r}: {side!r} is not in the vocab")
            if a + b not in ids:
                raise ValueError(f"merge {r} {(a, b)!r}: the merged token {a + b!r} is not in the vocab")
            if (a, b) in seen:
                raise ValueError(f"merge {(a, b)!r} is listed twice (ranks {seen[(a, b)]} and {r})")
            seen[(a, b)] = r
            left[r], right[r], merged[r] = ids[a], ids[b], ids[a + b]

        self.vocab: Vocab = vocab
        self.merges: Merges = merges
        self.special_tokens: list[str] = specials
        self.pattern = pattern
        self.n_vocab = next_id
        self._table = build_rank_table(
            left, right, merged, np.array([ids[bytes([b])] for b in range(256)], dtype=np.int32)
        )
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be a non-negative int, got {cache_size!r}")
        self._cache = new_cache(cache_size) if cache_size else None
        if isinstance(block_chars, bool) or not isinstance(block_chars, int) or block_chars < 1:
            raise ValueError(f"block_chars must be a positive int, got {block_chars!r}")
        self._block_chars = block_chars

        self._findall = compiled.findall
        self._cut = _GPT2_CUT if pattern == GPT2_PATTERN else _OTHER_CUT
        # The compiled scanner (pretokenize_kernels) does GPT-2's pattern; regex does any other.
        self._compiled = uses_compiled_pretokenizer(pattern, pretokenizer)
        if self._compiled:
            self._splitter = SpecialTokenSplitter(specials)
            self._special_id_array = np.array([self._special_ids[t] for t in specials], np.int32)
        if specials:
            self._special_split = regex.compile(f"({special_token_regex(specials).pattern})").split
            self._special_finditer = special_token_regex(specials).finditer
            self._longest_special = max(map(len, specials))
        else:
            self._special_split = None
            self._longest_special = 0

        # decoding: token bytes by id in one arena; ids never given have length -1
        self._token_offsets = np.zeros(next_id + 1, dtype=np.int64)
        lengths = np.full(next_id, -1, dtype=np.int64)
        for i, token in vocab.items():
            lengths[i] = len(token)
        self._known = lengths >= 0
        np.cumsum(np.maximum(lengths, 0), out=self._token_offsets[1:])
        self._token_bytes = np.frombuffer(b"".join(vocab[i] for i in sorted(vocab)), dtype=np.uint8)
        self._max_id = next_id - 1

    # --- files ----------------------------------------------------------------------------

    @classmethod
    def from_files(cls, vocab_path, merges_path, special_tokens: Iterable[str] | None = None,
                   **options) -> Tokenizer:
        """Load GPT-2 style `vocab.json` + `merges.txt`, or the pickled vocab and merges."""
        vocab, merges = load_vocab_and_merges(vocab_path, merges_path)
        return cls(vocab, merges, special_tokens, **options)

    @classmethod
    def from_tokenizer_json(cls, path, **options) -> Tokenizer:
        """Load a byte-level BPE Hugging Face `tokenizer.json` (as `save_tokenizer_json` writes)."""
        vocab, merges, specials, pattern = load_hf_tokenizer_json(path)
        if pattern is not None:
            options.setdefault("pattern", pattern)
        return cls(vocab, merges, specials, **options)

    @classmethod
    def load(cls, directory, **options) -> Tokenizer:
        """Load what `save(directory)` wrote."""
        config = load_tokenizer_config(directory)
        vocab, merges = load_vocab_and_merges(
            os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt")
        )
        options.setdefault("pattern", config.get("pattern", GPT2_PATTERN))
        return cls(vocab, merges, config.get("special_tokens", []), **options)

    def save(self, directory) -> list[str]:
        """Write `vocab.json`, `merges.txt` (GPT-2 format) and `nbbpe.json` (special tokens,
        pattern) into `directory`; `Tokenizer.load(directory)` reads them back."""
        paths = list(save_gpt2_files(self.vocab, self.merges, directory))
        return paths + [save_tokenizer_config(directory, self.special_tokens, self.pattern)]

    def save_pickle(self, vocab_path, merges_path) -> tuple[str, str]:
        """Write the vocab (`dict[int, bytes]`) and merges (`list[tuple[bytes, bytes]]`) pickles."""
        return save_pickle_files(self.vocab, self.merges, vocab_path, merges_path)

    def save_tokenizer_json(self, path) -> str:
        """Write a Hugging Face `tokenizer.json` that encodes the same ids."""
        return save_hf_tokenizer_json(self.vocab, self.merges, self.special_tokens, self.pattern, path)

    def tiktoken_ranks(self) -> dict[bytes, int]:
        """tiktoken's `mergeable_ranks` for this vocab (special tokens left out)."""
        return tiktoken_ranks(self.vocab, self.special_tokens)

    def save_tiktoken_ranks(self, path) -> str:
        """Write the `.tiktoken` ranks file (`tiktoken.load.load_tiktoken_bpe` reads it)."""
        return save_tiktoken_ranks(self.vocab, self.special_tokens, path)

    def to_tiktoken(self, name: str = "nbbpe"):
        """A `tiktoken.Encoding` with the same ranks, pattern and special tokens."""
        import tiktoken

        return tiktoken.Encoding(name=name, pat_str=self.pattern, mergeable_ranks=self.tiktoken_ranks(),
                                 special_tokens=dict(self._special_ids))

    # --- encoding -------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The token ids of `text`."""
        return self._encode_text(_check_text(text, "encode")).tolist()

    def encode_to_numpy(self, text: str, dtype=None) -> np.ndarray:
        """The token ids of `text` as an array of `dtype` (default: uint16 if every id fits,
        else uint32)."""
        dtype = self.id_dtype(dtype)
        return self._encode_text(_check_text(text, "encode_to_numpy")).astype(dtype)

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """The ids of the concatenated strings of `iterable` (e.g. a text file handle), lazily.

        Memory stays bounded whatever the total size: text is held only up to the next place
        where a cut cannot change the ids (so a pre-token or special token may span chunks),
        about `block_chars` characters, or more only if one pre-token is longer than that.
        A single str is taken as one chunk.
        """
        for ids in self.encode_iterable_to_numpy(iterable, dtype=np.int64):
            yield from ids.tolist()

    def encode_iterable_to_numpy(self, iterable: Iterable[str], dtype=None) -> Iterator[np.ndarray]:
        """Like `encode_iterable`, yielding the ids as arrays of `dtype`, one per block."""
        dtype = self.id_dtype(dtype)
        if isinstance(iterable, str):
            iterable = (iterable,)
        pending: list[str] = []
        pending_chars = 0
        carry = ""
        for number, chunk in enumerate(iterable):
            if not isinstance(chunk, str):
                raise TypeError(f"encode_iterable: item {number} is a {type(chunk).__name__}, not a str")
            pending.append(chunk)
            pending_chars += len(chunk)
            # wait for as much new text as is carried over, so a long carry is not re-scanned often
            if pending_chars < max(self._block_chars, len(carry)):
                continue
            text = carry + "".join(pending)
            pending.clear()
            pending_chars = 0
            cut = self._safe_cut(text)
            if cut:
                yield self._encode_text(text[:cut]).astype(dtype)
            carry = text[cut:]
        text = carry + "".join(pending)
        if text:
            yield self._encode_text(text).astype(dtype)

    def id_dtype(self, dtype=None) -> np.dtype:
        """uint16 when every id fits (at most 65,536 ids), else uint32; or `dtype`, checked."""
        largest = self._max_id
        if dtype is None:
            return np.dtype(np.uint16 if largest <= np.iinfo(np.uint16).max else np.uint32)
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"dtype {dtype!r} is not a NumPy dtype") from None
        if dtype.kind not in "iu":
            raise TypeError(f"dtype must be an integer type such as uint16 or uint32, got {dtype}")
        if np.iinfo(dtype).max < largest:
            raise ValueError(
                f"dtype {dtype} cannot hold the ids of this tokenizer: it has {self.n_vocab:,} ids "
                f"(largest {largest:,}) but {dtype} holds at most {np.iinfo(dtype).max:,}; "
                "use uint32 (or leave dtype unset to choose automatically)"
            )
        return dtype

    def _encode_text(self, text: str) -> np.ndarray:
        """int32 ids of `text`, a block at a time, cut only where the ids cannot change."""
        block = self._block_chars
        if len(text) <= block:
            return self._encode_block(text)
        parts = []
        start = 0
        size = block
        while start < len(text):
            if len(text) - start <= size:
                parts.append(self._encode_block(text[start:]))
                break
            window = text[start : start + size]
            cut = self._safe_cut(window)
            if cut == 0:  # one pre-token longer than the window: widen it
                size *= 2
                continue
            parts.append(self._encode_block(window[:cut]))
            start += cut
            size = block
        return np.concatenate(parts) if parts else _NO_IDS

    def _encode_block(self, text: str) -> np.ndarray:
        try:
            spans = self._pretokenize(text)
        except UnicodeEncodeError:
            # lone surrogates: replace them with U+FFFD (pairs join), as tiktoken does
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            spans = self._pretokenize(text)
        return encode_pretokens(*spans, self._table, self._cache)

    def _pretokenize(self, text: str):
        """Step 1: text -> (UTF-8 bytes, int64 offsets of the pieces, indices of the pieces that
        are special tokens, their ids)."""
        if self._compiled:
            return self._pretokenize_compiled(text)
        findall = self._findall
        if self._special_split is None:
            pieces = findall(text)
            special_slots, special_ids = _NO_SLOTS, _NO_IDS
        else:
            parts = self._special_split(text)  # text, special, text, ..., special, text
            pieces = findall(parts[0])
            slots = []
            ids = []
            lookup = self._special_ids
            for k in range(1, len(parts), 2):
                slots.append(len(pieces))
                ids.append(lookup[parts[k]])
                pieces.append(parts[k])
                if parts[k + 1]:
                    pieces.extend(findall(parts[k + 1]))
            special_slots = np.array(slots, dtype=np.int64)
            special_ids = np.array(ids, dtype=np.int32)
        try:  # one byte per length is the fastest way to measure a list of str
            char_lengths = np.frombuffer(bytes(map(len, pieces)), dtype=np.uint8)
        except ValueError:  # a piece of 256 characters or more
            char_lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        # Matches never overlap, so if their lengths add up to the text's they cover all of it
        # (GPT-2's pattern always does) and the text itself is the joined pieces.
        joined = text if int(char_lengths.sum()) == len(text) else "".join(pieces)
        data = np.frombuffer(joined.encode("utf-8"), dtype=np.uint8)
        if len(data) == len(joined):  # ASCII: characters are bytes
            offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
            np.cumsum(char_lengths, out=offsets[1:], dtype=np.int64)
        else:
            offsets = char_to_byte_offsets(data, char_lengths)
        return data, offsets, special_slots, special_ids

    def _pretokenize_compiled(self, text: str):
        """`_pretokenize` with the compiled GPT-2 scanner: the same pieces, found in the bytes.

        Pre-tokens tile the stretches between special tokens, so the pieces are the pre-tokens
        with each special token's occurrence inserted in its place.
        """
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        seg_starts, seg_ends, which = self._splitter.split(data)
        starts, _ = scan_gpt2(data, (seg_starts, seg_ends))
        special_starts = seg_ends[:-1]
        if len(special_starts):
            at = np.searchsorted(starts, special_starts)
            special_slots = at + np.arange(len(at), dtype=np.int64)
            starts = np.insert(starts, at, special_starts)
            special_ids = self._special_id_array[which]
        else:
            special_slots, special_ids = _NO_SLOTS, _NO_IDS
        offsets = np.empty(len(starts) + 1, dtype=np.int64)
        offsets[:-1] = starts
        offsets[-1] = len(data)
        return data, offsets, special_slots, special_ids

    def _safe_cut(self, text: str) -> int:
        """A position p, as late as the rules below find, such that `text[:p]` encodes to a
        prefix of the ids of `text + rest` whatever `rest` is (0 if there is none).

        A special-token match starting at s is certain once all longer alternatives could be
        checked (s + longest <= len(text)); a cut right after a certain one is safe. Beyond it,
        a pattern cut (see `_GPT2_CUT`) is safe where no special token can start before it.
        """
        end = len(text)
        longest = self._longest_special
        after_special = 0
        if longest:
            for match in self._special_finditer(text):
                if match.start() + longest > end:
                    break
                after_special = match.end()
        limit = end - max(longest, 1)  # text[p] must be seen, and no special may begin before p
        if limit > after_special:
            match = self._cut.search(text, after_special, limit + 1)
            if match is not None:
                return match.start() + 1
        return after_special

    # --- decoding -------------------------------------------------------------------------

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of `ids` laid end to end."""
        array = ids if isinstance(ids, np.ndarray) else np.array(list(ids))
        if array.size == 0:
            return b""
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise TypeError(f"decode expects a flat sequence of integer ids, got {array.dtype} "
                            f"with shape {array.shape}")
        bad = (array < 0) | (array > self._max_id)
        if not bad.any():
            array = array.astype(np.int64, copy=False)
            bad = ~self._known[array]
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"decode: id {int(array[k])} at position {k} is not in the vocab "
                             f"(ids run from 0 to {self._max_id})")
        return gather_token_bytes(array, self._token_offsets, self._token_bytes).tobytes()

    def __repr__(self) -> str:
        return (f"Tokenizer(n_vocab={self.n_vocab}, merges={len(self.merges)}, "
                f"special_tokens={self.special_tokens!r})")


def _check_text(text, method: str) -> str:
    if isinstance(text, str):
        return text
    hint = " (decode bytes to str first)" if isinstance(text, (bytes, bytearray)) else ""
    raise TypeError(f"{method} expects a str, got {type(text).__name__}{hint}")
