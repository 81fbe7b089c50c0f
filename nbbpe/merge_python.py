"""The merge loop with no compiled code, for a small first run.

`merge.learn_merges` takes seconds to compile the first time; on a small corpus this loop
learns the same merges in a fraction of that (the shipped 1 MB sample's 5,384 words to 7,922
merges in 0.26 s). `train_bpe` runs it on a small local source while the kernel is not in
Numba's cache (`merges_in_python_for`, `sources.SMALL_SOURCE`), as it counts such a source with
`regex`; once the kernel is cached (a larger corpus compiled it) the kernel learns small corpora
too. The tests check both against the reference trainer.

Same input and output as `learn_merges` (interned words; merge k creates token 256 + k), and the
same rule: each round merges the most frequent pair, ties to the greatest (left bytes, right
bytes), every occurrence left to right. A heap holds the pairs by that order; a pair's count
never rises after the round that creates it, so a popped entry whose count has fallen goes back
with its count (lazily, as in the kernel).
"""

from __future__ import annotations

import heapq
from collections import defaultdict

import numpy as np

# The most tokens of words this loop rewrites (each costs ~1 us, with its pairs recounted) before
# it leaves the merges to the kernel: a small corpus of long words that share many pairs (random
# letters without spaces) could otherwise take minutes. multi_1M.txt to 10,000 ids: 3.3 million
# (2.5-3.8 s); the shipped sample: 0.2 million.
MOST_WORK = 4_000_000


class TooMuchWork(Exception):
    """More than `MOST_WORK` to do in Python: learn the merges with the kernel."""


def learn_merges_in_python(tokens, offsets, word_counts, num_merges: int):
    """(left, right) int32 arrays of up to `num_merges` merges learned over the words
    tokens[offsets[w]:offsets[w + 1]], word w occurring word_counts[w] times (as
    `merge.learn_merges`: fewer if the words run out of pairs). Raises `TooMuchWork`."""
    flat = tokens.tolist()
    bounds = offsets.tolist()
    words = [flat[a:b] for a, b in zip(bounds, bounds[1:])]
    counts = word_counts.tolist()
    # A sort key per token, reversing the order of its bytes (a heap pops its least): byte x as
    # 255 - x, then 256, above every byte, so that a prefix sorts after what it prefixes.
    keys = [(255 - x, 256) for x in range(256)]
    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    holders: dict[tuple[int, int], set[int]] = defaultdict(set)  # words that had the pair
    for w, word in enumerate(words):
        count = counts[w]
        for pair in zip(word, word[1:]):
            pair_counts[pair] += count
            holders[pair].add(w)
    heap = [(-count, keys[a], keys[b], a, b) for (a, b), count in pair_counts.items()]
    heapq.heapify(heap)
    left: list[int] = []
    right: list[int] = []
    work = 0
    while len(left) < num_merges and heap:
        negated, _, _, a, b = heapq.heappop(heap)
        count = pair_counts.get((a, b), 0)
        if count != -negated:  # fallen since it was pushed: back with its count
            if count > 0:
                heapq.heappush(heap, (-count, keys[a], keys[b], a, b))
            continue
        new = 256 + len(left)
        left.append(a)
        right.append(b)
        keys.append(keys[a][:-1] + keys[b])
        born: set[tuple[int, int]] = set()
        for w in holders.pop((a, b)):
            word = words[w]
            merged = merge_pair(word, a, b, new)
            if len(merged) == len(word):  # lost the pair in an earlier round
                continue
            work += len(word)
            count = counts[w]
            for pair in zip(word, word[1:]):
                pair_counts[pair] -= count
            for pair in zip(merged, merged[1:]):
                pair_counts[pair] += count
                if new in pair:
                    holders[pair].add(w)
                    born.add(pair)
            words[w] = merged
        if work > MOST_WORK:
            raise TooMuchWork(work)
        del pair_counts[(a, b)]
        for pair in born:
            heapq.heappush(heap, (-pair_counts[pair], keys[pair[0]], keys[pair[1]], *pair))
    return np.array(left, dtype=np.int32), np.array(right, dtype=np.int32)


def merge_pair(word: list[int], a: int, b: int, new: int) -> list[int]:
    """`word` with every (a, b) in it, left to right, made `new` (also `encode_python`'s
    MERGES round)."""
    out = []
    i = 0
    n = len(word)
    while i < n:
        if i + 1 < n and word[i] == a and word[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def merges_in_python_for(files, executor, pretokenizer: str) -> bool:
    """Whether `train_bpe` should learn the merges of `files` (from `sources.resolve_source`)
    here: a small local source (`sources.small_local_source`), not asked for the compiled path
    (`pretokenizer="compiled"`), while `learn_merges` is not compiled yet."""
    from .sources import small_local_source

    return (pretokenizer != "compiled" and small_local_source(files, executor)
            and not merge_kernel_compiled())


def merge_kernel_compiled() -> bool:
    """Whether Numba's cache holds `merge.learn_merges`."""
    from .kernel_cache import cached
    from .merge import learn_merges

    return cached(learn_merges)
