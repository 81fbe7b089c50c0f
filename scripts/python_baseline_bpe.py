"""A plain `regex` + `multiprocessing` BPE trainer: what a careful CS336 solution looks like.

Used only as a benchmark baseline (it gives the CS336 merges, like nbbpe): documents are split at
the special token, pre-tokenized and counted in a process pool, and the merge loop keeps pair
counts and a pair -> words index up to date incrementally, taking `max` over all pairs each round.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from multiprocessing import Pool

import regex

PATTERN = regex.compile(r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def _count_chunk(args):
    path, start, end, special = args
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read(end - start).decode("utf-8", errors="replace")
    counts = Counter()
    for doc in text.split(special):
        counts.update(PATTERN.findall(doc))
    return counts


def _chunk_bounds(path, special, n_chunks):
    size = os.path.getsize(path)
    token = special.encode("utf-8")
    bounds = [0]
    with open(path, "rb") as f:
        for k in range(1, n_chunks):
            f.seek(size * k // n_chunks)
            window = f.read(1 << 20)
            at = window.find(token)
            if at >= 0:
                bounds.append(size * k // n_chunks + at)
    bounds.append(size)
    return sorted(set(bounds))


def train(path, vocab_size, special_tokens, workers=2):
    special = special_tokens[0]
    bounds = _chunk_bounds(path, special, 16 * workers)
    with Pool(workers) as pool:
        parts = pool.map(_count_chunk, [(path, a, b, special) for a, b in zip(bounds, bounds[1:])])
    counts = Counter()
    for part in parts:
        counts.update(part)
    words = [[bytes([b]) for b in w.encode("utf-8")] for w in counts]
    freqs = list(counts.values())
    pair_counts = Counter()
    where = defaultdict(set)
    for i, (w, n) in enumerate(zip(words, freqs)):
        for pair in zip(w, w[1:]):
            pair_counts[pair] += n
            where[pair].add(i)
    vocab = {i: bytes([i]) for i in range(256)}
    for t in special_tokens:
        vocab[len(vocab)] = t.encode("utf-8")
    merges = []
    while len(vocab) < vocab_size and pair_counts:
        best = max(pair_counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merged = best[0] + best[1]
        merges.append(best)
        vocab[len(vocab)] = merged
        for i in list(where[best]):
            w, n = words[i], freqs[i]
            for pair in zip(w, w[1:]):
                pair_counts[pair] -= n
                if pair_counts[pair] == 0:
                    del pair_counts[pair]
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == best[0] and w[j + 1] == best[1]:
                    out.append(merged)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for pair in zip(out, out[1:]):
                pair_counts[pair] += n
                where[pair].add(i)
        del where[best]
    return vocab, merges
