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


def intern_words(counts: dict[bytes, int]) -> Words:
    """Lay out the pre-tokens with two or more bytes (a single byte holds no pair) as byte ids.

    Builds the arrays from the unique words only: nothing here is per occurrence.
    """
    words = [word for word in counts if len(word) > 1]
    n = len(words)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, words), dtype=np.int64, count=n), out=offsets[1:])
    tokens = np.frombuffer(b"".join(words), dtype=np.uint8).astype(np.int32)
    word_counts = np.fromiter(map(counts.__getitem__, words), dtype=np.int64, count=n)
    return Words(tokens, offsets, word_counts)
