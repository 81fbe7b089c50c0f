"""A slow, obviously-correct encoder: the twin the fast encoding path is checked against.

It follows GPT-2's `bpe()` literally: split off special tokens (longest first), pre-tokenize each
stretch with `regex`, and inside each pre-token repeatedly take the adjacent pair of lowest
merge rank and merge all its occurrences left to right.
"""

import json

import regex

from nbbpe.patterns import GPT2_PATTERN


def gpt2_byte_decoder():
    """GPT-2's printable spelling of bytes, inverted: spelled character -> byte."""
    kept = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    spelled = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in spelled:
            spelled[b] = chr(0x100 + extra)
            extra += 1
    return {c: b for b, c in spelled.items()}


def read_gpt2_vocab(path):
    """bytes -> id from GPT-2's vocab.json, independently of nbbpe.vocab_files."""
    decoder = gpt2_byte_decoder()
    with open(path, encoding="utf-8") as f:
        return {bytes(decoder[c] for c in token): i for token, i in json.load(f).items()}


def bpe(word, ranks):
    """GPT-2's merge loop over a tuple of byte strings; `ranks` maps (left, right) -> rank."""
    word = list(word)
    while len(word) > 1:
        pairs = set(zip(word, word[1:]))
        best = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
        if best not in ranks:
            break
        out, i = [], 0
        while i < len(word):
            if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                out.append(word[i] + word[i + 1])
                i += 2
            else:
                out.append(word[i])
                i += 1
        word = out
    return word


class ReferenceEncoder:
    def __init__(self, vocab, merges, special_tokens=(), pattern=GPT2_PATTERN):
        self.ids = {}
        for i, token in sorted(vocab.items()):
            self.ids.setdefault(token, i)
        for token in special_tokens:
            data = token.encode("utf-8")
            if data not in self.ids:
                self.ids[data] = max(self.ids.values()) + 1
        self.ranks = {pair: r for r, pair in enumerate(merges)}
        self.special_tokens = list(special_tokens)
        self.pattern = pattern
        self.cache = {}

    def encode(self, text):
        if self.special_tokens:
            longest_first = sorted(self.special_tokens, key=len, reverse=True)
            parts = regex.split("(" + "|".join(map(regex.escape, longest_first)) + ")", text)
        else:
            parts = [text]
        ids = []
        for k, part in enumerate(parts):
            if k % 2:
                ids.append(self.ids[part.encode("utf-8")])
                continue
            for pretoken in regex.findall(self.pattern, part):
                data = pretoken.encode("utf-8")
                if data not in self.cache:
                    word = bpe(tuple(bytes([b]) for b in data), self.ranks)
                    self.cache[data] = [self.ids[token] for token in word]
                ids.extend(self.cache[data])
        return ids


def tiktoken_bpe(data, ranks):
    """tiktoken's byte-pair merge of one pre-token: a token is itself; otherwise repeatedly
    merge the leftmost adjacent pair whose joined bytes have the lowest rank, one at a time.
    `ranks` maps token bytes -> rank (= id)."""
    if data in ranks:
        return [ranks[data]]
    parts = [bytes([b]) for b in data]
    while len(parts) > 1:
        best = None
        for k in range(len(parts) - 1):
            rank = ranks.get(parts[k] + parts[k + 1])
            if rank is not None and (best is None or rank < best[0]):
                best = (rank, k)
        if best is None:
            break
        k = best[1]
        parts[k : k + 2] = [parts[k] + parts[k + 1]]
    return [ranks[part] for part in parts]
