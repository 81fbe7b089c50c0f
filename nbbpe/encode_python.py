"""Encoding with no compiled code: `regex` pre-tokens, merged in Python.

The encode stage's kernels (`encode.py`) take ~5 s to compile the first time; a small job need
not wait for that. `encode_file` encodes a small local source this way while the tokenizer's
encode kernel is not in Numba's cache (`python_encoding_for`, `sources.SMALL_SOURCE`), as
training counts such a source with `regex` and learns its merges in Python (`merge_python`):
the shipped 1 MB sample encodes in 0.25 s once Python is up. Once the kernel is cached (a larger
source compiled it), small sources take the compiled path too. Both give the same ids: the
tests compare them.

The two merge orders, as the kernels define them (see `encode.py`):

- MERGES (a trained merge list): each round takes the pair of lowest rank anywhere in the
  pre-token and merges all its occurrences left to right, non-overlapping (`a a a` -> `aa a`);
- RANKS (rank files, ids are ranks): a pre-token that is a token is that token; otherwise merge
  the leftmost adjacent pair whose concatenation has the lowest rank, one pair at a time.
"""

from __future__ import annotations

from .merge_python import merge_pair

_NO_RANK = 1 << 62  # above every rank (ids and merge ranks are below 2**31)


# Merging here takes up to the square of a pre-token's length (the kernels merge long ones on a
# heap): a longer one is left to them, and so is a job once its merging has stepped over this
# many tokens (a small source of many long new pre-tokens, such as random letters, could
# otherwise take minutes; a step is ~0.5 us). multi_1M.txt (1.2 MB) with o200k's ranks:
# 3.7 million steps (1.8 s); the shipped sample with its 10K tokenizer: 0.15 million (0.3 s).
LONGEST_PRETOKEN = 256
MOST_WORK = 8_000_000


class TooMuchWork(Exception):
    """A pre-token longer than `LONGEST_PRETOKEN` bytes, or more than `MOST_WORK` merging done:
    encode the text with the kernels."""


class PythonEncoder:
    """`Tokenizer`'s ids for its pattern and special tokens, computed in Python, with a cache of
    the pre-tokens met (their ids do not depend on where they are)."""

    def __init__(self, tokenizer):
        t = tokenizer
        self._findall = t._findall
        self._special_split = t._special_split
        self._special_ids = t._special_ids
        self._byte_ids = t._byte_ids.tolist()
        self._merges_order = t.merge_order == "merges"
        if self._merges_order:
            left, right, merged = (a.tolist() for a in t._merge_ids)
            self._pair_ranks = dict(zip(zip(left, right), range(len(left))))
            self._pairs = list(zip(left, right))
            self._merged = merged
        else:  # tokens that are not special, by their bytes: the lowest id if two share them
            special = set(t._special_ids.values())
            regular = [(data, i) for i, data in t.vocab.items() if i not in special]
            self._ranks = dict(sorted(regular, key=lambda item: -item[1]))
        self._cache: dict[str, list[int]] = {}
        self._work = 0  # tokens stepped over while merging

    def encode(self, text: str) -> list[int]:
        """The ids of `text` (valid Unicode: no lone surrogates); raises `TooMuchWork`."""
        ids: list[int] = []
        if self._special_split is None:
            self._encode_pretokens(text, ids)
            return ids
        parts = self._special_split(text)  # text, special, text, ..., special, text
        self._encode_pretokens(parts[0], ids)
        for k in range(1, len(parts), 2):
            ids.append(self._special_ids[parts[k]])
            self._encode_pretokens(parts[k + 1], ids)
        return ids

    def _encode_pretokens(self, text: str, ids: list[int]) -> None:
        cache = self._cache
        merge = self._merge_in_order if self._merges_order else self._merge_by_ranks
        for pretoken in self._findall(text):
            found = cache.get(pretoken)
            if found is None:
                data = pretoken.encode("utf-8")
                if len(data) > LONGEST_PRETOKEN:
                    raise TooMuchWork(f"a pre-token of {len(data)} bytes")
                found = cache[pretoken] = merge(data)
                if self._work > MOST_WORK:
                    raise TooMuchWork(f"{self._work} tokens stepped over")
            ids.extend(found)

    def _merge_in_order(self, data: bytes) -> list[int]:
        """MERGES order: the lowest-ranked pair merged everywhere, round after round."""
        byte_ids = self._byte_ids
        ids = [byte_ids[b] for b in data]
        ranks = self._pair_ranks
        while len(ids) > 1:
            self._work += len(ids)
            best = min(ranks.get(pair, _NO_RANK) for pair in zip(ids, ids[1:]))
            if best == _NO_RANK:
                break
            ids = merge_pair(ids, *self._pairs[best], self._merged[best])
        return ids

    def _merge_by_ranks(self, data: bytes) -> list[int]:
        """RANKS order (tiktoken's byte-pair merge): the leftmost pair of lowest rank, one at a
        time."""
        ranks = self._ranks
        whole = ranks.get(data)
        if whole is not None:
            return [whole]
        parts = [data[i : i + 1] for i in range(len(data))]
        while len(parts) > 1:
            self._work += len(parts)
            joined = [ranks.get(a + b, _NO_RANK) for a, b in zip(parts, parts[1:])]
            best = min(joined)
            if best == _NO_RANK:
                break
            at = joined.index(best)  # the leftmost of the lowest
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        return [ranks[part] for part in parts]


def python_encoding_for(tokenizer, files, executor) -> bool:
    """Whether `encode_file` should encode `files` (from `sources.resolve_source`) with
    `PythonEncoder`: a small local source (`sources.small_local_source`), for a tokenizer not
    asked for the compiled pre-tokenizer, whose encode kernel is not compiled yet and whose
    tables were not built in this process. Else the kernels encode it."""
    from .sources import small_local_source

    if (getattr(tokenizer, "_pretokenizer", "auto") == "compiled"
            or tokenizer._engine is not None or not small_local_source(files, executor)):
        return False
    return not encode_kernel_compiled(tokenizer)


def encode_kernel(tokenizer):
    """The kernel that encodes for `tokenizer`: its family's, or the `regex` path's."""
    from . import encode

    mode = encode.MERGES if tokenizer.merge_order == "merges" else encode.RANKS
    family = tokenizer._family
    return encode.PIECE_ENCODERS[mode] if family is None else encode.ENCODERS[family][mode]


def encode_kernel_compiled(tokenizer) -> bool:
    """Whether Numba's cache holds `encode_kernel(tokenizer)`."""
    from .kernel_cache import cached

    return cached(encode_kernel(tokenizer))
