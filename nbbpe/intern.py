"""Interning: counted pre-tokens become flat arrays the merge kernels work on."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Words(NamedTuple):
    """Unique pre-tokens as runs of token ids in one flat array.

    Word w is `tokens[offsets[w]:offsets[w + 1]]` and occurs `counts[w]` times in the corpus.
    """

    tokens: np.ndarray  # int32
    offsets: np.ndarray  # int64, one more than the number of words
    counts: np.ndarray  # int64


def intern_words(table) -> Words:
    """Lay out the counted pre-tokens with two or more bytes as runs of byte ids (0-255).

    `table` is a `PretokenCounts` (word_bytes uint8, word_offsets int64, counts int64). A
    one-byte pre-token holds no pair, so it is left out. All array operations: nothing here is
    per occurrence, or even per word in Python.
    """
    word_bytes, word_offsets, counts = table
    lengths = np.diff(word_offsets)
    keep = lengths > 1
    starts = word_offsets[:-1][keep]
    kept_lengths = lengths[keep]
    offsets = np.zeros(len(kept_lengths) + 1, dtype=np.int64)
    np.cumsum(kept_lengths, out=offsets[1:])
    # Byte k of the kept words comes from word_bytes[start of its word + k - offset of its word].
    shift = np.repeat(starts - offsets[:-1], kept_lengths)
    tokens = word_bytes[shift + np.arange(offsets[-1], dtype=np.int64)].astype(np.int32)
    return Words(tokens, offsets, np.ascontiguousarray(counts[keep], dtype=np.int64))
