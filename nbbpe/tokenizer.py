"""The Tokenizer: text <-> token ids with a trained (vocab, merges), or a tiktoken rank file.

Building a Tokenizer is plain Python and NumPy (the ids of every merge, the token bytes by id);
no compiled code runs until the first encode, which builds the kernels' tables once (`_Engine`).

Encoding, for the patterns a compiled scanner implements (GPT-2's, cl100k's, o200k's), is one
kernel call over the UTF-8 bytes of the text (`encode.encode_documents`): pre-tokens, special
tokens and ids in one pass. For any other pattern, `regex` finds the pre-tokens (`_pretokenize`)
and a kernel encodes them (`encode.encode_pieces`), a block at a time. Lone surrogates become
U+FFFD in the whole text before anything else (a special token may hold U+FFFD). Long texts and
streams are cut only where the ids cannot depend on what follows (`_safe_cut`): after a special
token, or, for the built-in patterns only (`corpus.last_text_cut_rule`, proven with hypothesis
in tests/test_exactness.py), between a pre-token and following whitespace. A custom pattern is
never cut inside a stretch between special tokens: a long text is pre-tokenized stretch by
stretch with `finditer` and encoded a block of pre-tokens at a time, and a stream is held until
a special token (see `encode_iterable`).

Threads: the kernels release the GIL. The tables are shared read-only, and the cache of encoded
pre-tokens is shared too (`encode_tables.SharedCache`: threads add to it without a lock), so
one Tokenizer may be used from many threads at once, a pre-token is merged once whichever thread
meets it, and `encode_batch` spreads a batch over threads.
"""

from __future__ import annotations

import functools
import io
import mmap
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain, count, islice
from typing import NamedTuple

import numpy as np
import regex

from .corpus import compile_utf8_check, last_text_cut_rule, safe_text_cut
from .patterns import (
    GPT2_PATTERN,
    compile_pattern,
    scanner_family,
    special_token_regex,
    validate_special_tokens,
)
from .vocab_files import (
    Merges,
    Vocab,
    check_merges,
    check_vocab,
    load_hf_tokenizer_json,
    load_tiktoken_file,
    load_tokenizer_config,
    load_vocab_and_merges,
    merges_from_ranks,
    save_gpt2_files,
    save_hf_tokenizer_json,
    save_pickle_files,
    save_tiktoken_ranks,
    save_tokenizer_config,
    tiktoken_ranks,
)

BLOCK_CHARS = 1 << 20  # characters per regex-path kernel call and per stream block
MERGE_ORDERS = ("merges", "ranks")
PRETOKENIZERS = ("auto", "compiled", "regex")
_MAX_ID = (1 << 31) - 1  # ids are int32 in the kernels
_NO_SLOTS = np.zeros(0, dtype=np.int64)
_NO_IDS = np.zeros(0, dtype=np.int32)
# Encoded pre-tokens a tokenizer's cache learns at most, then it starts again (`SharedCache`): its
# table, made when the tokenizer first encodes, has 1M slots, 32 MB. The first 200 MB of the 1 GB
# scale corpus (many unique words: ~730,000 pre-tokens learned), one call per document on one
# thread, 5 alternated processes each, median MB/s: 2**20 (the table grown to 2M slots, 64 MB,
# never started again) 151.3, 2**19 183.6, 2**18 178.8, 2**17 173.9 (each cache growing from
# 146k pre-tokens then). The shared corpora learn far fewer (web_5M 39k).
CACHE_SIZE = 1 << 19
# Characters below which a batch is not worth a second thread: 2 threads against 1, TinyStories'
# and web_5M's first documents, medians of 9 alternated rounds in one process: 0.63 and 0.76x
# at 128 KB, 0.80 and 0.78x at 256 KB, 1.28 and 1.43x at 384 KB, 1.60 and 1.40x at 1 MB.
_SMALL_BATCH_CHARS = 3 << 17
# Groups a batch is cut into, per thread: the last group leaves the other threads idle, so not
# few (4 made 2-thread multi_1M 8% slower than 16); but each group takes the GIL twice (to turn
# its texts into UTF-8, to hand its ids over), and a thread kept waiting for it may wait ~0.2 ms
# more to be woken: 8 against 16, 2 threads, medians of 30-50 alternated batches: TinyStories
# 13.7 against 15.0 ms, multi_1M 12.3 against 13.0, web_5M 29.3 against 30.0 (with cl100k's
# pattern 31.9 against 33.9), multi_1M with o200k's 15.5 both.
_GROUPS_PER_THREAD = 8
# ... but of at least this many characters: in a 2-thread batch each group cost ~0.1 ms of
# hand-offs between the threads, and a batch of 128 KB cut into 16 took 1.97 ms against 0.48
# on one thread (TinyStories; 0.76 ms cut into 2).
_MIN_GROUP_CHARS = 1 << 17
# Groups of at most this many pieces (a piece or two of a long text, a few long texts) are read
# in place (`Tokenizer._encode_in_place`) if their pieces are long enough.
_IN_PLACE_PIECES = 8
# Characters of a group at most: a group is held as one str and its UTF-8 while it is encoded,
# and fresh memory costs page faults; smaller groups reuse the same memory.
_GROUP_CHARS = 1 << 20
# Characters from which a text, or each piece of a group on average, has its UTF-8 read where the
# str holds it or made by a compiled loop without the GIL (`text_bytes`), not by `str.encode`:
# starting that costs ~2-3 us, about what copying 64 KB does.
_READ_IN_PLACE_FROM = 1 << 16
# Texts from which a batch's are checked and measured by a compiled loop (`text_bytes.lengths_of`),
# not by `isinstance` and `len` of each in Python (~60 ns a text, more when their objects are
# no longer in the CPU's caches); fewer do not repay its call.
_COUNTED_FROM = 256
# `encode` cuts longer texts into groups (`_encode_long`); at least _READ_IN_PLACE_FROM, which it
# tests first (a short text's one test)
_LONG_TEXT_CHARS = 2 * _GROUP_CHARS

_MATCH_GROUP = type(regex.compile("").match("")).group


class Tokenizer:
    """Byte-level BPE: `encode`, `encode_batch`, `encode_iterable`, `decode` and file formats.

    `vocab` maps id -> token bytes and must hold all 256 single bytes; `merges` lists the
    (left, right) byte pairs in order of priority, applied inside each pre-token lowest rank
    first as GPT-2 does. (`from_tiktoken_file` builds one that merges by the rank of the joined
    token instead, as tiktoken does.) Special tokens are appended to the vocab (next free ids,
    in the order given) unless their bytes are already in it; in text they are matched longest
    first and always become their one id.

    Text with lone surrogates (not encodable as UTF-8) is encoded as tiktoken does: they become
    U+FFFD first (in the whole text, so a special token holding U+FFFD matches as it would in
    the replaced text). The ids never depend on `block_chars` or on how a stream is chunked; a
    custom pattern (not GPT-2's, cl100k's or o200k's) is applied to each whole stretch between
    special tokens, so `encode_iterable` holds such a stretch in memory.

    Options: `pattern`, the pre-tokenization regex (GPT-2's by default); `pretokenizer`,
    "auto" (a compiled scanner for GPT-2's, cl100k's and o200k's patterns, `regex` for any
    other), "compiled" (require one) or "regex" (the reference path, for any pattern);
    `cache_size`, how many encoded pre-tokens it remembers, for all threads (0: none; else at
    least 65,536, as starting again costs a copy of the vocab's table);
    `block_chars`, how much text the `regex` path encodes per kernel call (it bounds temporary
    memory; the ids do not depend on it).

    After its first texts, the instance's `encode` and `encode_to_numpy` are compiled calls
    (builtins) that encode one text from the thread that first used them with no Python in
    between, and hand every other call to the methods (see `_make_own_calls`): look them up
    as `tok.encode(text)` does, or after a first text, to get them.
    """

    def __init__(
        self,
        vocab: Vocab,
        merges: Merges,
        special_tokens: Iterable[str] | None = None,
        *,
        pattern: str = GPT2_PATTERN,
        pretokenizer: str = "auto",
        cache_size: int = CACHE_SIZE,
        block_chars: int = BLOCK_CHARS,
    ):
        vocab = check_vocab(vocab)
        merges = check_merges(merges)
        self._setup(vocab, merges, validate_special_tokens(special_tokens), None, pattern,
                    pretokenizer, cache_size, block_chars)

    def _setup(self, vocab: Vocab, merges: Merges | None, specials: list[str],
               special_ids: dict[str, int] | None, pattern, pretokenizer, cache_size, block_chars):
        """Check everything and lay out the model as arrays; `merges` None means RANKS order
        (ids are ranks); `special_ids`, if given, fixes the special tokens' ids."""
        compiled = compile_pattern(pattern)
        if pretokenizer not in PRETOKENIZERS:
            raise ValueError(f"pretokenizer must be one of {PRETOKENIZERS}, got {pretokenizer!r}")
        family = scanner_family(pattern)
        if pretokenizer == "compiled" and family is None:
            raise ValueError("no compiled pre-tokenizer implements this pattern; it implements "
                             "GPT-2's, cl100k's and o200k's (nbbpe.GPT2_PATTERN, CL100K_PATTERN, "
                             "O200K_PATTERN); use pretokenizer='regex' or 'auto'")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be a non-negative int, got {cache_size!r}")
        if isinstance(block_chars, bool) or not isinstance(block_chars, int) or block_chars < 1:
            raise ValueError(f"block_chars must be a positive int, got {block_chars!r}")
        if vocab and max(vocab) > _MAX_ID:
            raise ValueError(f"vocab id {max(vocab)} is too large (ids must be below 2**31)")

        # bytes -> id; the same bytes twice: the first id encodes them (the last one written,
        # going backwards: a dict built in C, not a Python loop over 50K tokens)
        ids: dict[bytes, int] = dict(zip(reversed(vocab.values()), reversed(vocab)))
        next_id = max(vocab, default=-1) + 1
        self._special_ids: dict[str, int] = {}
        for token in specials:
            try:
                data = token.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"special token {token!r} cannot be encoded as UTF-8") from None
            if special_ids is not None:
                i = special_ids[token]
                if i in vocab and vocab[i] != data:
                    raise ValueError(f"special token {token!r} has id {i}, which the vocab gives "
                                     f"to {vocab[i]!r}")
                vocab[i] = data
                next_id = max(next_id, i + 1)
            elif data not in ids:
                vocab[next_id] = data
                ids[data] = next_id
                next_id += 1
            self._special_ids[token] = special_ids[token] if special_ids is not None else ids[data]
        missing = [b for b in range(256) if bytes([b]) not in ids]
        if missing:
            raise ValueError(
                f"the vocab lacks {len(missing)} of the 256 single bytes (first: "
                f"{bytes([missing[0]])!r}); byte-level BPE needs them all to encode any text"
            )
        if merges is not None:
            self._merge_ids = _merge_ids(merges, ids)

        self.vocab: Vocab = vocab if merges is None else dict(sorted(vocab.items()))
        self._merges = merges
        self.merge_order = "merges" if merges is not None else "ranks"
        self.special_tokens: list[str] = specials
        self.pattern = pattern
        self.n_vocab = next_id
        self._max_id = next_id - 1
        self._default_dtype = _UINT16 if self._max_id <= 0xFFFF else _UINT32
        self._byte_ids = np.array([ids[bytes([b])] for b in range(256)], dtype=np.int32)
        self._family = None if pretokenizer == "regex" else family
        self._pretokenizer = pretokenizer
        self._cache_size = cache_size
        self._block_chars = block_chars
        self._findall = compiled.findall
        self._finditer = compiled.finditer
        self._cut = last_text_cut_rule(pattern)
        if specials:
            self._special_split = regex.compile(f"({special_token_regex(specials).pattern})").split
            self._special_finditer = special_token_regex(specials).finditer
            self._longest_special = max(map(len, specials))
        else:
            self._special_split = None
            self._longest_special = 0
        # Token bytes by id in one arena (decoding, the vocab table); ids never given: length -1.
        lengths = np.full(next_id, -1, dtype=np.int64)
        lengths[np.fromiter(self.vocab, dtype=np.int64, count=len(self.vocab))] = np.fromiter(
            map(len, self.vocab.values()), dtype=np.int64, count=len(self.vocab))
        self._known = lengths >= 0
        self._token_offsets = np.zeros(next_id + 1, dtype=np.int64)
        np.cumsum(np.maximum(lengths, 0), out=self._token_offsets[1:])
        self._token_bytes = np.frombuffer(b"".join(self.vocab[i] for i in sorted(self.vocab)),
                                          dtype=np.uint8)
        self._engine = None
        self._engine_lock = threading.Lock()
        self._threads = threading.local()
        self._pool_states = 0  # pool threads that have their state for this tokenizer
        self._own_calls = None  # see `_make_own_calls`
        self._decode_call = None  # see `_decode_compiled`

    # --- files ----------------------------------------------------------------------------

    @classmethod
    def from_files(cls, vocab_path, merges_path, special_tokens: Iterable[str] | None = None,
                   **options) -> Tokenizer:
        """Load GPT-2 style `vocab.json` + `merges.txt`, or the pickled vocab and merges."""
        vocab, merges = load_vocab_and_merges(vocab_path, merges_path)  # checked as read
        tokenizer = cls.__new__(cls)
        tokenizer._setup(vocab, merges, validate_special_tokens(special_tokens), None,
                         **_options(options))
        return tokenizer

    @classmethod
    def from_tiktoken_file(cls, path, pattern: str,
                           special_tokens: Sequence[str] | dict[str, int] | None = None,
                           **options) -> Tokenizer:
        """Load a tiktoken `.tiktoken` rank file (one "base64(token) rank" line per token).

        Ids are the ranks, and pre-tokens are encoded as tiktoken does: one that is a token is
        that token; otherwise the leftmost adjacent pair whose joined bytes have the lowest rank
        merges first, one pair at a time. `special_tokens` is a list (ids follow the largest
        rank) or a {token: id} dict, as tiktoken's encodings define them, e.g. for cl100k_base
        `{"<|endoftext|>": 100257}`.
        """
        ranks = load_tiktoken_file(path)
        vocab = {rank: token for token, rank in ranks.items()}
        if len(vocab) != len(ranks):
            raise ValueError(f"{os.fspath(path)}: two tokens have the same rank")
        if isinstance(special_tokens, dict):
            special_ids = dict(special_tokens)
            for token, i in special_ids.items():
                if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= _MAX_ID:
                    raise ValueError(f"special token {token!r}: id {i!r} is not an id")
            specials = validate_special_tokens(list(special_ids))
        else:
            specials = validate_special_tokens(special_tokens)
            base = max(vocab) + 1
            special_ids = {token: base + k for k, token in enumerate(specials)}
        tokenizer = cls.__new__(cls)
        options.setdefault("pattern", pattern)
        tokenizer._setup(vocab, None, specials, special_ids, **_options(options))
        return tokenizer

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
        options.setdefault("pattern", config.get("pattern", GPT2_PATTERN))
        if config.get("merge_order", "merges") == "ranks":
            return cls.from_tiktoken_file(os.path.join(directory, "ranks.tiktoken"),
                                          special_tokens=config.get("special_token_ids", {}),
                                          **options)
        vocab, merges = load_vocab_and_merges(
            os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt")
        )
        return cls(vocab, merges, config.get("special_tokens", []), **options)

    def save(self, directory) -> list[str]:
        """Write the tokenizer into `directory`, for `Tokenizer.load`: `vocab.json` and
        `merges.txt` (GPT-2 format), or for one that merges by rank its `ranks.tiktoken`; and
        `nbbpe.json` (special tokens, pattern, merge order)."""
        if self.merge_order == "ranks":
            os.makedirs(directory, exist_ok=True)
            paths = [save_tiktoken_ranks(self.vocab, self.special_tokens,
                                         os.path.join(directory, "ranks.tiktoken"))]
        else:
            paths = list(save_gpt2_files(self.vocab, self.merges, directory))
        return paths + [save_tokenizer_config(directory, self.special_tokens, self.pattern,
                                              self.merge_order, self._special_ids)]

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

    @property
    def merges(self) -> Merges:
        """The merges in order of priority; for a rank file, the merges its ranks imply (the
        split of each token tiktoken's merging arrives at, worked out on first use)."""
        if self._merges is None:
            self._merges = merges_from_ranks(self.tiktoken_ranks())
        return self._merges

    # --- encoding -------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The token ids of `text` (a text of millions of characters is encoded about a
        million characters at a time, so that memory beyond the ids stays bounded)."""
        if type(text) is not str:
            text = _check_text(text, "encode")
        if self._family is None or len(text) >= _READ_IN_PLACE_FROM:  # (one test for short texts)
            if self._family is None or len(text) > _LONG_TEXT_CHARS:
                from .id_lists import id_list

                return id_list(self._encode_long(text, np.int32), self.n_vocab)
            if len(text) >= self._thread_state().text_room:  # the long way: its UTF-8 in place
                return self._encode_in_place_text(text, None)
        # `DocumentEncoder.encode_text`'s short path written out, as in encode_to_numpy (a frame
        # costs 50-70 ns of a 0.8 us call on a short text); a list straight from the kernel's ids.
        # An ASCII str is read where it lies (isascii: O(1)); any other becomes UTF-8 first.
        if text.isascii():
            data = text
        else:
            try:
                data = text.encode()
            except UnicodeEncodeError:
                data = _utf8(text)
        try:
            state = self._threads.state
        except AttributeError:  # this thread's first encode
            state = self._thread_state()
        call = state.text_call
        if call is not None and len(data) < state.text_room:
            if self._own_calls is None:  # the first text of the short path
                self._make_own_calls(state)
            ids = call(data, _AS_LIST)
            if ids is not None:
                return ids
            return self._engine.documents.encode_text_long(data, state, None)
        return (self._engine or self._get_engine()).documents.encode_text(data, state, None)

    def encode_to_numpy(self, text: str, dtype=None) -> np.ndarray:
        """The token ids of `text` as an array of `dtype` (default: uint16 if every id fits,
        else uint32); a long text is encoded in groups, as by `encode`."""
        dtype = self._default_dtype if dtype is None else self.id_dtype(dtype)
        if type(text) is not str:
            text = _check_text(text, "encode_to_numpy")
        if self._family is None or len(text) >= _READ_IN_PLACE_FROM:  # (one test for short texts)
            if self._family is None or len(text) > _LONG_TEXT_CHARS:
                return self._encode_long(text, dtype)
            if len(text) >= self._thread_state().text_room:  # the long way: its UTF-8 in place
                return self._encode_in_place_text(text, dtype)
        # The short path written out, as in encode, for the default dtypes: uint16 ids (up to
        # 65,536 tokens) and uint32, whose array the compiled call makes (a copy of a view of
        # its ids took ~0.2 us more). Other dtypes take `DocumentEncoder.encode_text`.
        if text.isascii():  # read where it lies
            data = text
        else:
            try:
                data = text.encode()
            except UnicodeEncodeError:
                data = _utf8(text)
        try:
            state = self._threads.state
        except AttributeError:  # this thread's first encode
            state = self._thread_state()
        call = state.text_call
        if call is not None and len(data) < state.text_room and (dtype is _UINT16
                                                                 or dtype is _UINT32):
            if self._own_calls is None:  # the first text of the short path
                self._make_own_calls(state)
            ids = call(data, _AS_UINT16 if dtype is _UINT16 else _AS_UINT32)
            if ids is not None:
                return ids
            return self._engine.documents.encode_text_long(data, state, dtype)
        return (self._engine or self._get_engine()).documents.encode_text(data, state, dtype)

    def _make_own_calls(self, state) -> None:
        """Make this tokenizer's `encode` and `encode_to_numpy` compiled calls of the short path
        for this thread (`encode.DocumentEncoder.own_call`), set on the instance in place of
        the methods: one text from this thread then costs no Python at all (~0.25 us of a
        ~0.45 us call on "Hi!"); any other call (another thread, a dtype, a long text) is the
        method's, as before. Not for a subclass that overrides either method."""
        self._own_calls = ()
        if type(self).encode is not _ENCODE or type(self).encode_to_numpy is not _ENCODE_TO_NUMPY:
            return
        documents = self._engine.documents
        kind = _AS_UINT16 if self._default_dtype is _UINT16 else _AS_UINT32
        self._own_calls = (
            documents.own_call(state, _AS_LIST, _ENCODE.__get__(self), "encode",
                               "encode($self, text)\n--\n\n" + _ENCODE.__doc__),
            documents.own_call(state, kind, _ENCODE_TO_NUMPY.__get__(self), "encode_to_numpy",
                               "encode_to_numpy($self, text, dtype=None)\n--\n\n"
                               + _ENCODE_TO_NUMPY.__doc__))
        self.encode, self.encode_to_numpy = self._own_calls

    def _encode_in_place_text(self, text: str, dtype):
        """The ids of a text of `_READ_IN_PLACE_FROM` to `_LONG_TEXT_CHARS` characters and more
        bytes than the short path takes, as `dtype` (a list if None): encoded the long way,
        its UTF-8 read where the str holds it (ASCII) or made by `text_bytes.gather`, not
        copied by `str.encode`. (A shorter text takes the short path's one call, which wants
        `bytes`: faster than the long way, 386 against 528 us for 70k characters.)"""
        from . import text_bytes  # (it imports Numba: not with nbbpe)

        if text.isascii():
            data = text_bytes.ascii_bytes(text)
        else:
            made = text_bytes.gather([text], self._thread_state())
            data = _utf8(text) if made is None else made[0]  # a lone surrogate: replaced
        return self._get_engine().documents.encode_text_long(data, self._thread_state(), dtype)

    def _encode_long(self, text: str, dtype) -> np.ndarray:
        """The ids of `text` as `dtype`, for the regex path, or a text of more than
        `_LONG_TEXT_CHARS` characters: cut into groups as a batch is on one thread, so that the
        whole text is never held as UTF-8 too (encode_to_numpy of 64 MiB of web text: 129 MB
        at the peak beyond the text, against 202 MB)."""
        if self._family is None:
            return self._encode_text(text).astype(dtype, copy=False)
        return self.encode_batch_to_numpy([text], num_threads=1, dtype=dtype)[0]

    def encode_batch(self, texts: Sequence[str], *, num_threads: int | None = None) -> list[list[int]]:
        """The ids of each text, encoded on `num_threads` threads (default: one per CPU)."""
        from .id_lists import id_lists

        ids, offsets = self.encode_batch_to_numpy(texts, num_threads=num_threads, dtype=np.int32)
        return id_lists(ids, offsets, self.n_vocab)  # of the process's ints, see `id_lists`

    def encode_batch_to_numpy(self, texts: Sequence[str], *, num_threads: int | None = None,
                              dtype=None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, offsets): the ids of all texts end to end in `dtype` (default: uint16 if every
        id fits, else uint32), and int64 offsets of length len(texts) + 1 (text k's ids are
        ids[offsets[k]:offsets[k + 1]]). Encoded on `num_threads` threads (default: one per
        CPU); the ids do not depend on it."""
        dtype = self.id_dtype(dtype)
        if isinstance(texts, str):
            raise TypeError("encode_batch expects a sequence of str, not a single str "
                            "(use encode, or wrap it in a list)")
        texts = list(texts)
        counted = most_bytes = None
        if len(texts) >= _COUNTED_FROM:
            from . import text_bytes  # (it imports Numba: not with nbbpe)

            counted = text_bytes.lengths_of(texts)
        if counted is not None:
            lengths, total, most_bytes = counted
        else:
            if not all(map(str.__instancecheck__, texts)):  # then name the first that is not
                for k, text in enumerate(texts):
                    _check_text(text, f"encode_batch: text {k}")
            # Read once: each pass over the texts in Python costs ~0.1 us a text.
            lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
            total = int(lengths.sum())
        asked = _threads_asked(num_threads)
        threads = _thread_count(asked, len(texts), total, self._family is not None)
        if threads < asked:  # the pool starts with the first batch that asks for its threads,
            # used or not: starting a thread took 0.4-5 ms here, which then delays no batch
            # worth the threads (as a pool that starts on first use does); and each of its
            # threads makes this tokenizer's state
            self._ready_pool_states(asked - 1)
        if self._family is not None and (threads > 1 or total > _GROUP_CHARS):
            return self._encode_pieces_on_threads(texts, lengths, threads, dtype, most_bytes)
        if threads == 1:
            parts = [self._encode_group(texts, dtype)]
        else:
            # A few groups per thread, taken in turn: a thread that drew easy text takes more.
            groups = _split_evenly(texts, min(len(texts), _GROUPS_PER_THREAD * threads), lengths)
            parts = _run_groups(threads, self._encode_group, groups, dtype)
        return _join_parts(parts, len(texts))

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """The ids of the concatenated strings of `iterable` (e.g. a text file handle), lazily.

        Memory stays bounded whatever the total size: text is held only up to the next place
        where a cut cannot change the ids (so a pre-token or special token may span chunks),
        about `block_chars` characters, or more only if one pre-token is longer than that.
        That holds for the built-in patterns; a custom pattern is cut only after special tokens
        (nothing else is safe for an arbitrary regex), so its text is held from one special
        token to the next: all of it if it has none. A single str is taken as one chunk.
        """
        from .id_lists import id_list

        for ids in self.encode_iterable_to_numpy(iterable, dtype=np.int64):
            yield from id_list(ids, self.n_vocab)  # the process's ints

    def encode_iterable_to_numpy(self, iterable: Iterable[str], dtype=None) -> Iterator[np.ndarray]:
        """Like `encode_iterable`, yielding the ids as arrays of `dtype`, one per block."""
        dtype = self.id_dtype(dtype)
        if isinstance(iterable, str):
            iterable = (iterable,)
        elif isinstance(iterable, io.TextIOBase):  # a text file: read a block at a time, not a
            # line (the Python per line cost 3x the encoding: web_5M's 162k lines, 154 against
            # 52 ms for one call on its text)
            iterable = iter(functools.partial(iterable.read, self._block_chars), "")
        pending: list[str] = []
        add = pending.append
        pending_chars = 0
        carry = ""
        # wait for as much new text as is carried over, so a long carry is not re-scanned often
        wait_for = self._block_chars
        for number, chunk in enumerate(iterable):
            if not isinstance(chunk, str):
                raise TypeError(f"encode_iterable: item {number} is a {type(chunk).__name__}, not a str")
            add(chunk)
            pending_chars += len(chunk)
            if pending_chars < wait_for:
                continue
            text = carry + "".join(pending)
            pending.clear()
            pending_chars = 0
            # Lone surrogates become U+FFFD before any cut is chosen (a special token may hold
            # U+FFFD); a high surrogate at the end waits for a low one that may follow.
            held = text[-1] if "\ud800" <= text[-1:] <= "\udbff" else ""
            text = _replace_lone_surrogates(text[: len(text) - len(held)])
            cut = self._safe_cut(text)
            if cut:
                yield self._encode_text(text[:cut]).astype(dtype)
            carry = text[cut:] + held
            wait_for = max(self._block_chars, len(carry))
        text = carry + "".join(pending)
        if text:
            yield self._encode_text(text).astype(dtype)

    def id_dtype(self, dtype=None) -> np.dtype:
        """uint16 when every id fits (at most 65,536 ids), else uint32; or `dtype`, checked."""
        largest = self._max_id
        if dtype is None:
            return self._default_dtype
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

    def encode_utf8(self, data, doc_ends=None, *, separator: int | None = None,
                    dtype=np.int32) -> tuple[np.ndarray, np.ndarray]:
        """(ids as `dtype`, where each document's ids end) of UTF-8 bytes `data` (valid UTF-8:
        the caller checks), whose documents end at `doc_ends` (default: one document); each is a
        text of its own, followed by `separator`'s id if given. For the compiled patterns."""
        if isinstance(data, np.ndarray):
            buf = np.require(data, np.uint8, "CA")
        else:
            buf = np.frombuffer(data, dtype=np.uint8)
        if doc_ends is None:
            doc_ends = np.array([len(buf)], dtype=np.int64)
        else:
            doc_ends = np.require(doc_ends, np.int64, "CA")
        return self._encode_documents(buf, doc_ends, -1 if separator is None else separator, dtype)

    def _encode_documents(self, buf, doc_ends, separator: int, dtype,
                          doc_addresses=None) -> tuple[np.ndarray, np.ndarray]:
        """`encode_utf8` of arrays as the kernels take them (`DocumentEncoder.encode`)."""
        doc_out_ends = np.empty(len(doc_ends), dtype=np.int64)
        ids = self._get_engine().documents.encode(buf, doc_ends, separator, self._thread_state(),
                                                  doc_out_ends, dtype, doc_addresses)
        return ids, doc_out_ends

    def _encode_pieces_on_threads(self, texts: list[str], lengths: np.ndarray, threads: int,
                                  dtype, most_bytes: int | None = None
                                  ) -> tuple[np.ndarray, np.ndarray]:
        """`encode_batch_to_numpy` on `threads` threads, for the compiled patterns: the texts
        cut into groups (`_group_bounds`), a text that a group ends in cut where a cut cannot
        change its ids (so one long text does not leave the other threads idle), each group of
        at most about `_GROUP_CHARS` characters (so memory beyond the ids stays a few groups'
        worth, reused). The threads turn the pieces into UTF-8, each while the other encodes.
        `lengths`: the texts' lengths; `most_bytes`: the most UTF-8 bytes they can take
        (`text_bytes.lengths_of`), if known."""
        total = int(lengths.sum())
        safe_cut = _safe_cuts_maker(self.special_tokens, self.pattern)
        bounds = _group_bounds(total, threads)
        pieces, last_piece, groups = _split_into_groups(texts, lengths, bounds, safe_cut)
        encode = self._encode_pieces if pieces is texts else self._encode_cut_pieces
        joined = None
        if len(groups) > 1:  # (one group's ids are the result as they are)
            if most_bytes is None:  # 4 bytes a character at most, 1 for an ASCII text
                ascii = np.fromiter(map(str.isascii, texts), dtype=bool, count=len(texts))
                most_bytes = 4 * total - 3 * int(lengths[ascii].sum())
            try:  # at most one id per UTF-8 byte
                joined = _JoinedIds(len(groups), most_bytes, dtype)
            except MemoryError:  # more address space than the system gives: join at the end
                pass
        if joined is None:
            parts = _run_groups(threads, encode, groups, dtype)
            ids, piece_offsets = _join_parts(parts, len(pieces))
        else:
            # dtype None: each group's ids as the thread's output buffer holds them, copied
            # once, into the result (`_JoinedIds.add`), not first into an array of their own
            _run_groups(threads, encode, groups, None, joined.add)
            ids, piece_offsets = joined.result(len(pieces))
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        offsets[1:] = piece_offsets[last_piece + 1]
        return ids, offsets

    def _encode_pieces(self, pieces: list[str], dtype) -> tuple[np.ndarray, np.ndarray]:
        """(ids as `dtype`, where each piece's ids end) of `pieces` (texts, or pieces of texts),
        in this thread (dtype None: int32, maybe a view of the thread's output buffer, valid
        until the thread encodes again). What holds the GIL here keeps the other threads
        waiting: a group of ASCII texts becomes bytes in one join and one copy; a group of a few
        long texts is read in place (`_encode_in_place`)."""
        encoded = self._encode_in_place(pieces, dtype)
        return encoded if encoded is not None else self._encode_joined(pieces, dtype)

    def _encode_joined(self, pieces: list[str], dtype) -> tuple[np.ndarray, np.ndarray]:
        """`_encode_pieces` of texts as UTF-8: by a compiled loop that reads each str where it
        lies, without the GIL (`text_bytes.gather`: TinyStories' 4.5 MB in 0.33 ms where
        `str.encode` and joins took 1.4 ms, holding the GIL), the ASCII ones not even copied
        (the kernel reads them in the str); else by those, into one buffer."""
        from . import text_bytes  # (it imports Numba: not with nbbpe)

        made = text_bytes.gather(pieces, self._thread_state(), in_place=True)
        if made is not None:
            return self._encode_located(*made, dtype)
        if all(map(str.isascii, pieces)):  # isascii: O(1); map: no Python frame per piece
            data = "".join(pieces).encode("ascii")  # as many bytes as characters
        else:
            try:  # each piece alone: an ASCII one is copied, not encoded
                pieces = list(map(str.encode, pieces))
            except UnicodeEncodeError:  # a lone surrogate somewhere
                pieces = [_utf8(piece) for piece in pieces]
            data = b"".join(pieces)
        ends = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces)).cumsum()
        return self.encode_utf8(data, ends, dtype=dtype)

    def _encode_cut_pieces(self, pieces: list, dtype) -> tuple[np.ndarray, np.ndarray]:
        """`_encode_pieces` of pieces from `_split_into_groups`: the pieces of a text are cut
        out of it here, in the thread that encodes them, while the others encode (slicing
        multi_1M's longest text, held in 4 bytes a character, took 1.3 ms before any thread
        could start)."""
        encoded = self._encode_in_place(pieces, dtype)  # nearly always: a piece of a long text
        return (encoded if encoded is not None
                else self._encode_joined([_piece_text(piece) for piece in pieces], dtype))

    def _encode_in_place(self, pieces: list, dtype) -> tuple[np.ndarray, np.ndarray] | None:
        """`_encode_pieces` of a group of at most `_IN_PLACE_PIECES` pieces (str, or (text,
        start, end) from `_split_into_groups`) of `_READ_IN_PLACE_FROM` characters on average, their
        UTF-8 from `_utf8_in_place`; None for another group, or if one holds a lone surrogate
        (then `_encode_joined` replaces them, as `_utf8` does)."""
        if len(pieces) > _IN_PLACE_PIECES:
            return None
        spans = [_piece_span(piece) for piece in pieces]
        if sum(end - start for _, start, end in spans) < _READ_IN_PLACE_FROM * len(spans):
            return None
        made = self._utf8_in_place(spans)
        return None if made is None else self._encode_located(*made, dtype)

    def _utf8_in_place(self, spans: list) -> tuple | None:
        """(UTF-8, where each span ends, where each span's UTF-8 starts) of text[start:end] for
        each (text, start, end) of `spans`, without slicing the texts or holding the GIL to make
        it (`text_bytes`): the ASCII ones where the str holds them (one alone: its bytes, ends
        and starts None), the others made in this thread's buffer. None if one holds a lone
        surrogate. The spans' texts must live as long as the addresses are used."""
        from . import text_bytes  # (it imports Numba: not with nbbpe)

        if len(spans) == 1 and spans[0][0].isascii():
            text, start, end = spans[0]
            return text_bytes.ascii_bytes(text)[start:end], None, None
        bounds = np.array([at for _, start, end in spans for at in (start, end)], dtype=np.int64)
        return text_bytes.gather([text for text, _, _ in spans], self._thread_state(), bounds,
                                 in_place=True)

    def _encode_located(self, buf, doc_ends, doc_addresses, dtype) -> tuple[np.ndarray, np.ndarray]:
        """`encode_utf8` of documents each at its address (`text_bytes.gather`'s `in_place`):
        `buf` holds those that are not ASCII, the others are read in their str. (No addresses:
        `encode_utf8` of `buf`.)"""
        if doc_addresses is None:
            return self.encode_utf8(buf, doc_ends, dtype=dtype)
        return self._encode_documents(buf, doc_ends, -1, dtype, doc_addresses)

    def _encode_group(self, texts: list[str], dtype) -> tuple[np.ndarray, np.ndarray]:
        """(ids as `dtype`, where each text's ids end) of `texts`, in this thread."""
        if self._family is None:
            parts = [self._encode_text(text) for text in texts]
            ends = np.cumsum([len(p) for p in parts], dtype=np.int64)
            ids = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
            return ids, ends
        return self._encode_pieces(texts, dtype)

    def _encode_text(self, text: str) -> np.ndarray:
        """int32 ids of `text`."""
        if self._family is not None:
            return self.encode_to_numpy(text, np.int32)
        if not text.isascii():  # before any cut: a special token may hold U+FFFD
            text = _replace_lone_surrogates(text)
        block = self._block_chars
        if len(text) <= block:
            return self._encode_block(text)
        if self._cut is None:
            return self._encode_by_stretches(text)
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
        """int32 ids of `text` (lone surrogates already replaced) with the `regex` pre-tokenizer."""
        return self._get_engine().run_pieces(*self._pretokenize(text), self._thread_state())

    def _encode_by_stretches(self, text: str) -> np.ndarray:
        """int32 ids of `text` (lone surrogates already replaced) with the `regex` pre-tokenizer,
        for a pattern without a proven cut: the pattern runs over each whole stretch between
        special tokens (as in `_pretokenize`, so the pre-tokens are those of the whole text),
        and the kernel encodes about `block_chars` characters of pre-tokens per call."""
        engine = self._get_engine()
        state = self._thread_state()
        block = self._block_chars
        parts: list[np.ndarray] = []
        pieces: list[str] = []
        slots: list[int] = []
        ids: list[int] = []
        chars = 0

        def flush():
            nonlocal pieces, slots, ids, chars
            if pieces:
                parts.append(engine.run_pieces(*_piece_arrays(pieces, slots, ids), state))
            pieces, slots, ids, chars = [], [], [], 0

        specials = self._special_finditer(text) if self._special_split is not None else ()
        start = 0
        for special in chain(specials, [None]):
            stretch = text[start : len(text) if special is None else special.start()]
            if len(stretch) <= block:  # findall is faster, and its list is small
                found = [self._findall(stretch)]
            else:  # pre-tokens a batch at a time: the list of all of them could be huge
                matches = self._finditer(stretch)
                found = iter(lambda: list(map(_MATCH_GROUP, islice(matches, 4096))), [])
            for batch in found:
                pieces.extend(batch)
                chars += sum(map(len, batch))
                if chars >= block:
                    flush()
            if special is None:
                break
            slots.append(len(pieces))
            ids.append(self._special_ids[special.group()])
            pieces.append(special.group())
            chars += len(special.group())
            start = special.end()
        flush()
        return np.concatenate(parts) if parts else _NO_IDS

    def _pretokenize(self, text: str):
        """text -> (UTF-8 bytes, int64 offsets of the pieces, indices of the pieces that are
        special tokens, their ids)."""
        findall = self._findall
        if self._special_split is None:
            return _piece_arrays(findall(text), (), ())
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
        return _piece_arrays(pieces, slots, ids)

    def _safe_cut(self, text: str) -> int:
        """A position p, as late as the rules below find, such that `text[:p]` encodes to a
        prefix of the ids of `text + rest` whatever `rest` is (0 if there is none). `text` has
        its lone surrogates replaced already (a special token may hold U+FFFD).

        A special-token match starting at s is certain once all longer alternatives could be
        checked (s + longest <= len(text)); a cut right after a certain one is safe. Beyond it,
        for the built-in patterns, a pattern cut (`corpus.last_text_cut_rule`) is safe where no
        special token can start before it; a custom pattern has no such cut.
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
        if self._cut is not None and limit > after_special:
            match = self._cut.search(text, after_special, limit + 1)
            if match is not None:
                return match.start("cut")
        return after_special

    # --- the compiled side ----------------------------------------------------------------

    def _get_engine(self) -> _Engine:
        engine = self._engine
        if engine is None:
            with self._engine_lock:
                if self._engine is None:
                    self._engine = _Engine.build(self)
                engine = self._engine
        return engine

    def _ready_pool_states(self, threads: int) -> None:
        """Start the pool of `threads` threads (`_thread_pool`) if it is not, and have its
        threads make this tokenizer's state (`_thread_state`: scratch space, buffers;
        `_ready_pool_state`), once, in the background: made in a batch instead, it cost that
        batch's other threads ~0.25 ms each and the faults of their fresh memory (2 threads, a
        fresh process each, after a small batch: TinyStories 0.90-0.91x the time, web_5M
        0.94-1.00x, multi_1M 0.88x; medians of 10-12 alternated pairs, 240-670 fewer page
        faults). Not waited for (a pool thread busy with another batch would hold
        this one up), so a thread may take two of the tasks and another none: that one makes
        its state in its first batch, as before."""
        pool = _thread_pool(threads)
        if self._pool_states >= threads:
            return
        self._pool_states = threads
        for _ in range(threads):
            pool.submit(self._ready_pool_state)

    def _ready_pool_state(self) -> None:
        """This thread's state, with its buffers as large as a batch's groups need, their first
        pages written (`ThreadState.ready_for_groups`): a first 2-thread batch faulted ~1 MB
        of them in, in the worker's first group (a fresh process each, after a small batch,
        alternated: multi_1M 0.96x the time, 15 of 20 pairs faster, 220 fewer page faults;
        TinyStories 0.97-0.99x, 135 fewer; web_5M 0.99-1.01x, 320 fewer)."""
        self._thread_state().ready_for_groups()

    def _thread_state(self):
        state = getattr(self._threads, "state", None)
        if state is None:
            from .encode import ThreadState

            state = self._threads.state = ThreadState(self._get_engine().cache)
        return state

    def __getstate__(self):  # for other processes (e.g. Dask workers): no locks, no caches
        state = self.__dict__.copy()
        for name in ("_engine", "_engine_lock", "_threads", "_findall", "_finditer", "_cut",
                     "_special_split", "_special_finditer", "_own_calls", "encode",
                     "encode_to_numpy", "_decode_call"):
            state.pop(name, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._engine = None
        self._engine_lock = threading.Lock()
        self._threads = threading.local()
        self._pool_states = 0
        self._own_calls = None
        self._decode_call = None
        compiled = regex.compile(self.pattern)
        self._findall = compiled.findall
        self._finditer = compiled.finditer
        self._cut = last_text_cut_rule(self.pattern)
        if self.special_tokens:
            self._special_split = regex.compile(
                f"({special_token_regex(self.special_tokens).pattern})").split
            self._special_finditer = special_token_regex(self.special_tokens).finditer
        else:
            self._special_split = None

    # --- decoding -------------------------------------------------------------------------

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        """`decode` of each sequence of ids."""
        batch = list(batch)
        if (self._decode_call is None and sum(len(ids) for ids in batch if hasattr(ids, "__len__"))
                >= _DECODE_COMPILED_FROM):
            self._decode_compiled([])  # loaded now, so each sequence past the lookups takes it
        return [self.decode(ids) for ids in batch]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of `ids` laid end to end."""
        if (type(ids) is list or type(ids) is tuple) and len(ids) <= _DECODE_BY_LOOKUP_UP_TO:
            if set(map(type, ids)) <= _INTS:  # (not a bool, nor a float equal to an id)
                try:  # each token's bytes from the vocab, joined: 1.2 us for 2 ids, against
                    return b"".join(map(self.vocab.__getitem__, ids))  # 17 with arrays
                except KeyError:
                    pass  # not an id of the vocab: named below
        if (type(ids) is list or (isinstance(ids, np.ndarray) and ids.ndim == 1)) and (
                len(ids) >= _DECODE_COMPILED_FROM or self._decode_call):  # (once loaded, any)
            made = self._decode_compiled(ids)
            if made is not None:
                return made
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
        starts = self._token_offsets[array]
        lengths = self._token_offsets[array + 1] - starts
        # Every byte of the output comes from one token: index the arena by a ramp per token.
        positions = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
        positions += np.arange(len(positions), dtype=np.int64)
        return self._token_bytes[positions].tobytes()

    def _decode_compiled(self, ids) -> bytes | None:
        """`decode_bytes` of a long list or array by a compiled call (`nbbpe/decoding.py`: 10x
        NumPy's gather from a list); None where it cannot say (an item that is not an int, an
        id not in the vocab: the gather names it), or if there is no such call here."""
        call = self._decode_call
        if call is None:
            from .decoding import decoder

            call = self._decode_call = decoder(self._token_bytes, self._token_offsets,
                                               self._known) or False
        if call is False:
            return None
        if type(ids) is list:
            return call(ids, len(ids))
        if ids.dtype.kind not in "iu" or ids.dtype == np.uint64:
            return None  # (uint64 ids past int64's range are named by the gather)
        return call(np.ascontiguousarray(ids, dtype=np.int64), len(ids))

    def __repr__(self) -> str:
        return (f"Tokenizer(n_vocab={self.n_vocab}, merge_order={self.merge_order!r}, "
                f"special_tokens={self.special_tokens!r})")


class _Engine(NamedTuple):
    """The kernels' tables for one tokenizer, built on its first encode, shared by threads."""

    ranks: object  # encode.Ranks
    vocab_table: object  # encode.Table
    specials: object  # encode.Specials
    documents: object  # encode.DocumentEncoder of the family's kernel, or None for the regex path
    cache: object  # encode_tables.SharedCache: pre-tokens encoded so far, by any thread

    @classmethod
    def build(cls, tokenizer: Tokenizer) -> _Engine:
        from . import encode
        from .kernel_cache import cached, compile_elsewhere
        from .scanners.specials import make_specials

        t = tokenizer
        order = np.flatnonzero(t._known)
        token_ids = order.astype(np.int32)
        specials = make_specials(t._special_ids.items())
        special_id_set = set(t._special_ids.values())
        regular = np.array([i not in special_id_set for i in order.tolist()], dtype=bool)
        mode = encode.MERGES if t.merge_order == "merges" else encode.RANKS
        kernel = None if t._family is None else encode.ENCODERS[t._family][mode]
        # On a first run the encode kernel compiles in another process while this one builds
        # (and compiles the kernels of) the tables.
        first_run = kernel is not None and not cached(kernel)
        with compile_elsewhere(f"from nbbpe.encode import warm_up; warm_up({t._family!r}, {mode})",
                               needed=first_run) as elsewhere:
            if first_run:
                encode.compile_shared_first(mode)
            if mode == encode.MERGES:
                left, right, merged = t._merge_ids
                ranks = encode.build_ranks(left, right, np.arange(len(left)), merged, t._byte_ids,
                                           mode, *encode.cut_tables(t._token_bytes,
                                                                    t._token_offsets, token_ids))
            else:
                ranks = encode.build_split_ranks(t._token_bytes, t._token_offsets,
                                                 token_ids[regular], t._byte_ids, t.n_vocab)
            vocab_table = encode.build_vocab_table(t._token_bytes, t._token_offsets,
                                                   token_ids[regular], ranks)
            # (its first table is rehashed from the vocab table: on a first run, `_rehash`
            # compiles here, 0.4-0.6 s, while the encode kernel compiles elsewhere)
            cache = encode.SharedCache(vocab_table, t._cache_size)
            if elsewhere.running():  # this process would only wait (~1 s on the README's job):
                # what files are read through, and what runs around each kernel call (each
                # compiled after the wait otherwise: 0.3 s and 0.2 s more)
                compile_utf8_check()
                encode.compile_table_entry(cache.table)
        documents = None
        if kernel is not None:
            class_table = encode.encoder_for(t._family, mode)[0]
            documents = encode.DocumentEncoder(kernel, class_table, specials, ranks, vocab_table,
                                               t.n_vocab)
        encode.load_rare_kernels(ranks, vocab_table)
        return cls(ranks, vocab_table, specials, documents, cache)

    def run_pieces(self, data, offsets, special_slots, special_ids, state):
        from .encode import run_piece_encoder

        return run_piece_encoder(self.ranks.mode, data, offsets, special_slots, special_ids,
                                 self.ranks, self.vocab_table, state)


def _piece_arrays(pieces: list[str], slots, ids):
    """(UTF-8 bytes, int64 offsets, int64 slots, int32 ids) of pieces, for `encode_pieces`:
    `slots` are the indices of the pieces that are special tokens, `ids` their ids."""
    data = "".join(pieces).encode("utf-8")
    # Byte length of each piece: characters plus the extra bytes of the non-ASCII ones.
    if len(data) == sum(map(len, pieces)):
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    else:
        lengths = np.fromiter((len(p.encode("utf-8")) for p in pieces), dtype=np.int64,
                              count=len(pieces))
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    special_slots = np.array(slots, dtype=np.int64) if len(slots) else _NO_SLOTS
    special_ids = np.array(ids, dtype=np.int32) if len(ids) else _NO_IDS
    return np.frombuffer(data, dtype=np.uint8), offsets, special_slots, special_ids


def _merge_ids(merges: Merges, ids: dict[bytes, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(left, right, merged) int32 ids of every merge, checked: its tokens are in the vocab and
    no merge is listed twice."""
    lefts, rights = zip(*merges) if merges else ((), ())
    get = ids.__getitem__  # map() of C functions: no Python frame per merge
    try:
        left = np.fromiter(map(get, lefts), dtype=np.int32, count=len(merges))
        right = np.fromiter(map(get, rights), dtype=np.int32, count=len(merges))
        merged = np.fromiter(map(get, map(bytes.__add__, lefts, rights)), dtype=np.int32,
                             count=len(merges))
    except KeyError:
        for r, (a, b) in enumerate(merges):
            for side in (a, b):
                if side not in ids:
                    raise ValueError(f"merge {r} {(a, b)!r}: {side!r} is not in the vocab") from None
            if a + b not in ids:
                raise ValueError(f"merge {r} {(a, b)!r}: the merged token {a + b!r} is not in "
                                 "the vocab") from None
        raise
    pairs = np.sort((left.astype(np.int64) << 32) | right)  # (np.unique would import numpy.ma:
    if (pairs[1:] == pairs[:-1]).any():                      # 30 ms of a 0.3 s load)
        seen: dict[tuple[bytes, bytes], int] = {}
        for r, pair in enumerate(merges):
            if pair in seen:
                raise ValueError(f"merge {pair!r} is listed twice (ranks {seen[pair]} and {r})")
            seen[pair] = r
    return left, right, merged


def _options(options: dict) -> dict:
    """Keyword options of the constructor, as `_setup` takes them."""
    known = {"pattern": GPT2_PATTERN, "pretokenizer": "auto", "cache_size": CACHE_SIZE,
             "block_chars": BLOCK_CHARS}
    unknown = set(options) - set(known)
    if unknown:
        raise TypeError(f"unexpected option(s): {', '.join(sorted(unknown))}")
    return {**known, **options}


_UINT16, _UINT32 = np.dtype(np.uint16), np.dtype(np.uint32)
# The short path's kinds of result (`encode.TEXT_UINT16`, `TEXT_UINT32`, `TEXT_LIST`: written
# out, since importing `encode` loads Numba)
_AS_UINT16, _AS_UINT32, _AS_LIST = 1, 2, 3
# `decode` of a list or tuple of at most this many ids looks each up in the vocab (about 0.2 us
# an id); a longer one takes NumPy's gather, whose ~10 calls cost ~15 us whatever the length.
_DECODE_BY_LOOKUP_UP_TO = 128
_DECODE_COMPILED_FROM = 1 << 12  # ids; fewer take NumPy's gather (see `_decode_compiled`)
_INTS = {int}
_ENCODE, _ENCODE_TO_NUMPY = Tokenizer.encode, Tokenizer.encode_to_numpy  # see `_make_own_calls`


def _check_text(text, method: str) -> str:
    """`text` as a plain `str` (a subclass's value: NumPy's `str_` gave the ids of its UCS-4
    buffer, read as UTF-8), or a TypeError naming `method`."""
    if isinstance(text, str):
        return str.__str__(text)
    hint = " (decode bytes to str first)" if isinstance(text, (bytes, bytearray)) else ""
    raise TypeError(f"{method} expects a str, got {type(text).__name__}{hint}")


def _utf8(text: str) -> bytes:
    """`text` in UTF-8, lone surrogates replaced by U+FFFD (pairs join), as tiktoken does."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _replace_lone_surrogates(text).encode("utf-8")


def _replace_lone_surrogates(text: str) -> str:
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _threads_asked(num_threads: int | None) -> int:
    """`num_threads`, checked; by default one per CPU."""
    if num_threads is None:
        from .workers import default_num_workers

        num_threads = default_num_workers()
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
    return num_threads


def _thread_count(num_threads: int, n_texts: int, size: int, texts_cut: bool) -> int:
    """The threads worth using for a batch of `n_texts` texts of `size` characters in all:
    `num_threads`, but no more than the texts (unless long texts are cut, `texts_cut`) and one
    more per `_SMALL_BATCH_CHARS`."""
    most = num_threads if texts_cut else min(num_threads, n_texts)
    return max(1, min(most, size // _SMALL_BATCH_CHARS + 1))


def _group_bounds(total: int, threads: int) -> np.ndarray:
    """Where the groups of a batch of `total` characters end (character positions, ascending,
    the last one `total`): groups of about equal size, at most `_GROUP_CHARS`; on more than one
    thread, `_GROUPS_PER_THREAD` per thread of at least `_MIN_GROUP_CHARS`."""
    groups = max(1, -(-total // _GROUP_CHARS))
    if threads > 1:
        groups = max(groups, min(_GROUPS_PER_THREAD * threads, total // _MIN_GROUP_CHARS))
    return (total * np.arange(1, groups + 1, dtype=np.int64)) // groups


_pools: dict[int, ThreadPoolExecutor] = {}
_pool_lock = threading.Lock()


def _thread_pool(threads: int) -> ThreadPoolExecutor:
    """`threads` worker threads for batches, kept for the process: each keeps its scratch
    space and output buffer (one per tokenizer) from batch to batch."""
    with _pool_lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(threads,
                                                        thread_name_prefix="nbbpe-encode")
            # Start every thread now: started as the work is handed out, the last one began
            # 2-3 ms after the first, waiting for the GIL the first one held.
            ready = threading.Barrier(threads + 1)
            for _ in range(threads):
                pool.submit(ready.wait)
            ready.wait()
        return pool


def _run_groups(threads: int, encode, groups: list, dtype, done=None) -> list:
    """[encode(group, dtype) for group in groups], on `threads` threads: this one and
    `threads` - 1 of a pool, each taking the next group when done with one. (Not one pool task
    per group collected by this thread: each task that ended woke it, and the GIL's hand-offs
    between it and the workers left a worker waiting up to ~4 ms: PERFORMANCE.md, "From the
    code's docstrings".) With `done`, each result goes to done(k, result) in the thread that
    made it instead (the list returned is then all None)."""
    results: list = [None] * len(groups)
    taken = count()  # its __next__ is atomic under the GIL

    def work():
        for k in iter(taken.__next__, None):
            if k >= len(groups):
                return
            if done is None:
                results[k] = encode(groups[k], dtype)
            else:
                done(k, encode(groups[k], dtype))

    if threads == 1:
        work()
        return results
    pool = _thread_pool(threads - 1)
    futures = [pool.submit(work) for _ in range(threads - 1)]
    work()  # this thread is one of them
    for future in futures:
        future.result()
    return results


def _small_page_block(nbytes: int) -> np.ndarray:
    """uint8[nbytes] in a mapping of its own, which the system (Linux) is asked to back with its
    small pages, not huge ones: a NumPy array of 4 MB and more asks for huge pages, and where free
    memory is fragmented the first write into each 2 MB could wait 2-6 ms for the kernel to
    compact memory, in a quarter of 2-thread batches (measured: PERFORMANCE.md, "From the
    code's docstrings"). An `mmap` of its own, as advising a NumPy array through ctypes cost
    ~0.1 ms of a first batch. MemoryError if the system gives no such mapping."""
    # private: the default, shared, memory is the system's shmem, whose faults cost more
    private = ({"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS} if hasattr(mmap, "MAP_ANONYMOUS")
               else {})
    try:
        block = mmap.mmap(-1, max(nbytes, 1), **private)
    except OSError as error:  # (ENOMEM: more address space than the system gives)
        raise MemoryError(f"no mapping of {nbytes} bytes for a batch's ids: {error}") from error
    if hasattr(mmap, "MADV_NOHUGEPAGE") and hasattr(block, "madvise"):
        try:
            block.madvise(mmap.MADV_NOHUGEPAGE)
        except OSError:  # advice only
            pass
    return np.frombuffer(block, dtype=np.uint8)


class _JoinedIds:
    """The ids of a batch's groups end to end, each group's (ids, where each of its texts' ids
    end) copied into one array by the thread that encoded it, as soon as every group before it
    is in (`add`): the page faults of fresh memory then happen while the other threads encode,
    not all in one thread at the end. The array has room for `capacity` ids, an upper bound
    (the most UTF-8 bytes the texts can take: an id a byte at most), in memory lent to the
    result (`_ResultLease`); pages never written are never touched, and `result` is a view of
    the ids written. (Measured against `np.concatenate` and a bound of 4 bytes a character:
    PERFORMANCE.md, "From the code's docstrings".)
    """

    def __init__(self, groups: int, capacity: int, dtype):
        dtype = np.dtype(dtype)
        self._lease = _ResultLease(max(capacity, 1) * dtype.itemsize)
        self._ids = np.asarray(self._lease).view(dtype)
        self._parts: list = [None] * groups
        self._ends: list = [None] * groups  # each group's text ends, where they are in _ids
        self._next = 0  # the first group not yet placed
        self._filled = 0  # where it goes
        self._lock = threading.Lock()

    def add(self, k: int, part) -> None:
        """Group k's (ids, ends), the ids possibly a view of this thread's output buffer (int32,
        see `_encode_pieces`): placed, with every group after it that is in and waited for it,
        and copied in (outside the lock: the groups placed are this thread's to copy). A group
        that must wait for an earlier one is kept as a copy of its own, as this thread's next
        group overwrites its buffer."""
        ids, ends = part
        with self._lock:
            waits = self._next != k
        if waits:  # (if the earlier ones came in meanwhile, the copy was not needed)
            ids = ids.astype(self._ids.dtype)
        placed = []
        with self._lock:  # k is placed now unless it waits: by this thread, which owns its ids
            self._parts[k] = (ids, ends)
            while self._next < len(self._parts) and self._parts[self._next] is not None:
                ids, ends = self._parts[self._next]
                self._parts[self._next] = None
                placed.append((self._filled, ids))
                self._ends[self._next] = ends + self._filled
                self._filled += len(ids)
                self._next += 1
            # (so that a batch that fails after this is not kept holding more than it says)
            self._lease.written(self._filled * self._ids.itemsize)
        for at, ids in placed:
            self._ids[at : at + len(ids)] = ids

    def result(self, n_texts: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, offsets) once every group is in, as `_join_parts` gives them."""
        if self._next != len(self._parts):
            raise RuntimeError(f"group {self._next} of the batch's {len(self._parts)} is missing")
        ids = self._ids[: self._filled]  # the memory held by the lease (`_ResultLease`)
        self._ids = None
        offsets = np.zeros(n_texts + 1, dtype=np.int64)
        if self._ends:
            np.concatenate(self._ends, out=offsets[1:])
        return ids, offsets


# Memory a batch's result had, let go of with the result, for the next batch's (`_ResultLease`):
# at most one block, kept only if at most `_KEPT_WRITTEN` of its bytes were written (what it
# holds of the process's memory). A list: its append and pop are atomic, from any thread.
_spare_results: list = []
_KEPT_WRITTEN = 32 << 20


class _ResultLease:
    """A block of memory lent to one batch's result: the result is a view of it, and NumPy's
    views hold it as their base, so when the last of them goes the block goes to
    `_spare_results` for the next batch, rather than back to the system (the result does not
    own its memory: `ids.resize` refuses, `np.resize` copies). Batch after batch, the ids then
    go into pages already in memory rather than fresh ones, each of which faults in as it is
    written (web_5M's batches after the first: 0 page faults against 841, ~9% faster; measured:
    PERFORMANCE.md, "From the code's docstrings"). A block is taken again if it has room for the
    bound asked for; made with a quarter more room than asked, so that a slightly larger batch
    takes it too. Pages never written are never touched; at most `_KEPT_WRITTEN` bytes written
    stay with the process once every result is let go of."""

    __slots__ = ("_block", "_written", "__array_interface__")

    def __init__(self, nbytes: int):
        try:
            block, written = _spare_results.pop()
        except IndexError:
            block = None
        if block is None or len(block) < nbytes:
            block = _small_page_block(nbytes + nbytes // 4)  # (the spare is let go of)
            written = 0
        self._block = block
        self._written = written  # bytes of the block written so far, at most
        self.__array_interface__ = {"data": (block.__array_interface__["data"][0], False),
                                    "shape": (nbytes,), "typestr": "|u1", "version": 3}

    def written(self, nbytes: int) -> None:
        """The result's ids take its first `nbytes` bytes."""
        self._written = max(self._written, nbytes)

    def __del__(self):
        try:
            if self._written <= _KEPT_WRITTEN and not _spare_results:
                _spare_results.append((self._block, self._written))
        except Exception:  # at shutdown, the module's names may be gone: nothing to keep
            pass


def _join_parts(parts, n_texts: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, offsets) of `n_texts` texts encoded in groups: `parts` holds each group's (ids,
    where each of its texts' ids end), in order; text k's ids are ids[offsets[k]:offsets[k + 1]]."""
    offsets = np.zeros(n_texts + 1, dtype=np.int64)
    k = 0
    total = 0
    for ids, ends in parts:
        offsets[k + 1 : k + 1 + len(ends)] = ends + total
        k += len(ends)
        total += len(ids)
    # one part (a batch on one thread) is the result as it is: no copy of all its ids
    return (parts[0][0] if len(parts) == 1 else np.concatenate([ids for ids, _ in parts])), offsets


def _safe_cuts_maker(special_tokens, pattern: str):
    """cut(text, at, before): the first place at or after `at` (and before `before`) where
    `text`, pre-tokenized with `pattern`, can be cut without changing its ids
    (`corpus.safe_text_cut`, which cuts a custom pattern's text only at special tokens), or
    None."""
    def cut(text: str, at: int, before: int) -> int | None:
        return safe_text_cut(text, at, special_tokens, pattern=pattern, before=before)
    return cut


def _split_into_groups(texts: list[str], lengths: np.ndarray, bounds: np.ndarray, safe_cut):
    """(pieces, last, groups): `texts` cut into groups that end near `bounds` (character
    positions in the texts end to end, `lengths` each, ascending, the last one their total).
    A group ends after the text that holds its bound; or at its start, if the bound is near it
    (within a quarter of the smaller group beside the bound) and the text goes on for more than
    that; or, if the bound is far from both of its ends, inside it, at the first place
    `safe_cut(text, at, before)` allows before that quarter at its end (else after it). Ending
    at the nearer end of a short text instead made 2-thread web_5M 1.02-1.05x slower,
    in-process, for no reason found (its groups differed by a text here and there).

    `pieces`: the texts in order, a text cut into parts given as (text, start, end) (made a str
    by `_piece_text` in the thread that encodes it); `texts` itself if none is cut. `last`: the
    index of each text's last piece (int64). `groups`: lists of consecutive pieces, none empty
    unless the batch is."""
    n = len(texts)
    if n == 0:
        return texts, np.zeros(0, dtype=np.int64), [texts]
    ends = lengths.cumsum()
    starts = ends - lengths
    # The size of the group before each bound, and after it (the last: its own); not np.diff
    # with `prepend` and np.append, whose overhead was a fifth of this function's time
    # (multi_1M in 16 groups: 64 against 81 us a call, 230 against 310 us on the first call).
    sizes = bounds.copy()
    sizes[1:] -= bounds[:-1]
    after = sizes.copy()
    after[:-1] = sizes[1:]
    near = np.minimum(sizes, after) // 4
    # The text holding each bound's character, and how far the bound is into it and from its end
    holding = np.searchsorted(ends, bounds[:-1], side="right")
    kept = holding < n
    holding, bound_at, slack = holding[kept], bounds[:-1][kept], near[:-1][kept]
    into = bound_at - starts[holding]
    left = ends[holding] - bound_at
    # Groups that end between texts (t, 0): before text t, the holding text or the next one
    between = (into <= slack) | (left <= slack)
    at_text = np.where((into <= slack) & (left > slack), holding, holding + 1)
    ends_at = [(t, 0) for t in at_text[between].tolist() if 0 < t < n]
    # ... and groups that end inside text t, at its cut k (t, k), or after it if it has none
    cut_in: dict[int, list[int]] = {}  # text -> where it is cut
    searched = (-1, 0, 0, None)  # (text, from, up to, found): the last search, not made again
    # (a text with no safe place, searched to its end once per group, made cutting quadratic)
    inside = np.flatnonzero((into > slack) & (left > slack))
    for t, at, end_slack in zip(holding[inside].tolist(), into[inside].tolist(),
                                (into + left - slack)[inside].tolist()):
        last_text, since, up_to, found = searched
        if (last_text == t and since <= at
                and (at <= found if found is not None else end_slack <= up_to)):
            place = found if found is None or found < end_slack else None
        else:  # searched no further than where the group would end after the text anyway
            place = safe_cut(texts[t], at, end_slack)
            searched = (t, at, end_slack, place)
        if place is None:  # none, or only near the end: after the text
            if t + 1 < n:
                ends_at.append((t + 1, 0))
            continue
        own = cut_in.setdefault(t, [])
        if not own or own[-1] < place:
            own.append(place)
            ends_at.append((t, len(own)))
    if not cut_in:
        pieces = texts
        last = np.arange(n, dtype=np.int64)
        first_piece = last
    else:
        pieces = []
        extra = np.zeros(n, dtype=np.int64)
        done = 0
        for t in sorted(cut_in):
            pieces.extend(texts[done:t])
            text = texts[t]
            places = [0, *cut_in[t], len(text)]
            pieces.extend((text, a, b) for a, b in zip(places[:-1], places[1:]))
            extra[t] = len(places) - 2
            done = t + 1
        pieces.extend(texts[done:])
        before = np.cumsum(extra) - extra  # pieces added by the texts before each one
        first_piece = np.arange(n, dtype=np.int64) + before
        last = first_piece + extra
    piece_bounds = sorted({int(first_piece[t]) + k for t, k in ends_at} - {0, len(pieces)})
    edges = [0, *piece_bounds, len(pieces)]
    return pieces, last, [pieces[a:b] for a, b in zip(edges[:-1], edges[1:])]


def _piece_span(piece) -> tuple[str, int, int]:
    """(text, start, end) of a piece from `_split_into_groups` (a text of any str type, or a
    piece of one as (text, start, end))."""
    return piece if type(piece) is tuple else (piece, 0, len(piece))


def _piece_text(piece) -> str:
    """The str of a piece from `_split_into_groups`."""
    text, start, end = _piece_span(piece)
    return text if start == 0 and end == len(text) else text[start:end]


def _split_evenly(texts: list[str], parts: int, lengths=None) -> list[list[str]]:
    """`texts` cut into `parts` runs of consecutive texts of about equal total length (their
    `lengths`, if known)."""
    if parts <= 1:
        return [texts]
    if lengths is None:
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    ends = lengths.cumsum()
    cuts = np.searchsorted(ends, ends[-1] * np.arange(1, parts) / parts, side="right")
    bounds = [0, *sorted(set(cuts.tolist()) - {0, len(texts)}), len(texts)]
    return [texts[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
