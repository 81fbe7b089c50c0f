"""A slow, obviously-correct BPE trainer: the twin every fast training path is checked against.

It follows the CS336 definition literally: split on special tokens, pre-tokenize with `regex`,
then each round recount every pair from scratch, take Python's `max` over (count, (left, right)),
and rewrite every word merging left to right.
"""

from collections import Counter

import regex

from nbbpe.patterns import GPT2_PATTERN


def reference_pretoken_counts(text, special_tokens=(), pattern=GPT2_PATTERN):
    if special_tokens:
        by_length = sorted(special_tokens, key=len, reverse=True)
        segments = regex.split("|".join(regex.escape(t) for t in by_length), text)
    else:
        segments = [text]
    counts = Counter()
    for segment in segments:
        for match in regex.finditer(pattern, segment):
            counts[match.group().encode("utf-8")] += 1
    return counts


def reference_train_bpe(text, vocab_size, special_tokens=(), pattern=GPT2_PATTERN):
    vocab = {i: bytes([i]) for i in range(256)}
    for token in special_tokens:
        vocab[len(vocab)] = token.encode("utf-8")
    words = Counter()
    for word, n in reference_pretoken_counts(text, special_tokens, pattern).items():
        words[tuple(bytes([b]) for b in word)] += n
    merges = []
    while len(vocab) < vocab_size:
        pairs = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs.items(), key=lambda item: (item[1], item[0]))[0]
        merged = best[0] + best[1]
        merges.append(best)
        vocab[len(vocab)] = merged
        rewritten = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            rewritten[tuple(out)] += n
        words = rewritten
    return vocab, merges
