"""Vocab files: saving and loading (vocab, merges), and exporting them for other tools.

The readable format is GPT-2's: `vocab.json` maps each token, spelled with GPT-2's printable
byte-to-unicode table (space is "Ġ"), to its id, and `merges.txt` lists one merge per line as the
two spelled tokens separated by a space, after a `#version` header line. Every byte string has
a spelling, so any vocab (including bytes that are not valid UTF-8) round-trips exactly.

Also read: the pickled `dict[int, bytes]` vocab and `list[tuple[bytes, bytes]]` merges that
CS336 solutions write (with an unpickler that builds nothing but plain data). Also written:
Hugging Face `tokenizer.json` (byte-level BPE, the pre-tokenization pattern as a Split, special
tokens as added tokens) and tiktoken's mergeable ranks (token bytes -> id; the `.tiktoken` file is
one "base64(token) id" line per token).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from .patterns import GPT2_PATTERN, scanner_family

Vocab = dict[int, bytes]
Merges = list[tuple[bytes, bytes]]


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's table: printable bytes stand for themselves, the others map to chr(256 + n)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_to_unicode().items()}


def spell(token: bytes) -> str:
    """A token's bytes in GPT-2's printable spelling."""
    table = byte_to_unicode()
    return "".join(table[b] for b in token)


class _NotSpelled(Exception):
    pass


class _UnspellTable(dict):
    """str.translate table: spelled character -> the character of its byte (then Latin-1)."""

    def __missing__(self, code):
        # not a LookupError, which str.translate takes as "leave the character as it is"
        raise _NotSpelled(chr(code))


@lru_cache(maxsize=1)
def _unspell_table() -> _UnspellTable:
    return _UnspellTable({ord(c): b for c, b in unicode_to_byte().items()})


def unspell(text: str, *, source: str = "vocab file") -> bytes:
    """The bytes a GPT-2 spelling stands for."""
    try:
        return text.translate(_unspell_table()).encode("latin-1")
    except _NotSpelled as exc:
        raise ValueError(
            f"{source}: {text!r} contains {exc.args[0]!r}, which is not in GPT-2's "
            "byte-to-unicode table"
        ) from None


def save_gpt2_files(vocab: Vocab, merges: Merges, directory: str | os.PathLike) -> tuple[str, str]:
    """Write `vocab.json` and `merges.txt` into `directory`; return their paths."""
    os.makedirs(directory, exist_ok=True)
    vocab_path = os.path.join(directory, "vocab.json")
    merges_path = os.path.join(directory, "merges.txt")
    spelled = {spell(token): i for i, token in sorted(vocab.items())}
    if len(spelled) != len(vocab):
        raise ValueError("vocab has two ids for the same bytes; it cannot be saved as vocab.json")
    write_text_atomically(vocab_path, json.dumps(spelled, ensure_ascii=False, indent=1))
    lines = ["#version: 0.2 (nbbpe)"] + [f"{spell(a)} {spell(b)}" for a, b in merges]
    write_text_atomically(merges_path, "\n".join(lines) + "\n")
    return vocab_path, merges_path


def load_gpt2_files(vocab_path: str | os.PathLike, merges_path: str | os.PathLike) -> tuple[Vocab, Merges]:
    """Read GPT-2 style `vocab.json` + `merges.txt` (GPT-2's own files included)."""
    _check_file(vocab_path, "vocab")
    _check_file(merges_path, "merges")
    with open(vocab_path, encoding="utf-8") as f:
        try:
            spelled = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{os.fspath(vocab_path)}: not a JSON vocab file ({exc})") from None
    if not isinstance(spelled, dict):
        raise ValueError(f"{os.fspath(vocab_path)}: expected a JSON object {{token: id}}, "
                         f"got a {type(spelled).__name__}")
    ids = list(spelled.values())
    if ids and (set(map(type, ids)) != {int} or min(ids) < 0):  # C loops, no Python per id
        text, i = next((t, i) for t, i in spelled.items() if type(i) is not int or i < 0)
        raise ValueError(f"{os.fspath(vocab_path)}: token {text!r} has id {i!r}, "
                         "not a non-negative integer")
    if len(set(ids)) != len(ids):
        seen: set[int] = set()
        i = next(i for i in ids if i in seen or seen.add(i))
        raise ValueError(f"{os.fspath(vocab_path)}: id {i} is given to two tokens")
    vocab: Vocab = dict(zip(ids, unspell_all(list(spelled), source=os.fspath(vocab_path))))
    with open(merges_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if lines and lines[0].startswith("#version"):
        lines[0] = ""
    sides: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"{os.fspath(merges_path)}:{number}: expected two tokens, got {line!r}")
        sides += parts
    tokens = unspell_all(sides, source=os.fspath(merges_path))
    return vocab, list(zip(tokens[0::2], tokens[1::2]))


def unspell_all(texts: list[str], *, source: str = "vocab file") -> list[bytes]:
    """`unspell` of each text, all at once: their joined characters go through a NumPy table."""
    codes = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    table = _unspell_array()
    known = codes < len(table)
    byte_of = table[np.where(known, codes, 0)]
    if not (known & (byte_of >= 0)).all():
        for text in texts:  # name the first bad one
            unspell(text, source=source)
    joined = byte_of.astype(np.uint8).tobytes()
    ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    starts = ends - np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    return [joined[a:b] for a, b in zip(starts.tolist(), ends.tolist())]


@lru_cache(maxsize=1)
def _unspell_array() -> np.ndarray:
    """The byte each spelled character stands for, by code point (-1: not a spelling)."""
    table = np.full(max(map(ord, unicode_to_byte())) + 1, -1, dtype=np.int16)
    for c, b in unicode_to_byte().items():
        table[ord(c)] = b
    return table


def write_text_atomically(path: str, text: str) -> None:
    """Write `text` to `path` through a temporary file renamed over it: a reader never sees a
    partial file, and a failed write leaves the old one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


CONFIG_FILE = "nbbpe.json"


def save_tokenizer_config(directory: str | os.PathLike, special_tokens: Sequence[str], pattern: str,
                          merge_order: str = "merges",
                          special_token_ids: dict[str, int] | None = None) -> str:
    """Write `nbbpe.json` (the special tokens and the pattern, which vocab.json and merges.txt
    do not record, and how the tokenizer merges) into `directory`; return its path."""
    path = os.path.join(directory, CONFIG_FILE)
    config = {"special_tokens": list(special_tokens), "pattern": pattern}
    if merge_order != "merges":  # a rank file: its special tokens' ids are not implied
        config["merge_order"] = merge_order
        config["special_token_ids"] = dict(special_token_ids or {})
    write_text_atomically(path, json.dumps(config, ensure_ascii=False, indent=1))
    return path


def load_tokenizer_config(directory: str | os.PathLike) -> dict:
    """Read `nbbpe.json` from `directory`: {"special_tokens": [...], "pattern": str}."""
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {CONFIG_FILE} in {os.fspath(directory)!r}: not a saved Tokenizer")
    with open(path, encoding="utf-8") as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
    if (not isinstance(config, dict) or not isinstance(config.get("special_tokens", []), list)
            or not isinstance(config.get("pattern", ""), str)):
        raise ValueError(f"{path}: expected {{\"special_tokens\": [str, ...], \"pattern\": str}}")
    return config


def _check_file(path, what: str) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} path must be a str or os.PathLike, got {type(path).__name__}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} file not found: {os.fspath(path)!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{what} path is a directory, not a file: {os.fspath(path)!r}")


# --- pickles (CS336 solutions) -------------------------------------------------------------


class _PlainDataUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, tuples, ints and bytes only: a vocab file cannot run code."""

    def find_class(self, module, name):
        if (module, name) == ("_codecs", "encode"):  # protocol 2 spells bytes this way
            import _codecs

            return _codecs.encode
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: a vocab or merges pickle holds only plain "
            "dicts, lists, tuples, ints and bytes"
        )


def _unpickle(path, what: str):
    _check_file(path, what)
    with open(path, "rb") as f:
        try:
            return _PlainDataUnpickler(f).load()
        except pickle.UnpicklingError as exc:
            raise ValueError(f"{os.fspath(path)}: cannot read {what} pickle: {exc}") from None
        except (EOFError, ValueError, TypeError, IndexError, KeyError) as exc:
            raise ValueError(f"{os.fspath(path)}: not a {what} pickle ({exc!r})") from None


def _as_bytes(value, where: str) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise TypeError(f"{where}: expected bytes, got {type(value).__name__} {value!r:.60}")


def check_vocab(vocab, source: str = "vocab") -> Vocab:
    """`vocab` as a dict[int, bytes] sorted by id, or raise naming the bad entry."""
    if not isinstance(vocab, dict):
        raise TypeError(f"{source}: expected a dict[int, bytes], got {type(vocab).__name__}")
    if all(type(i) is int and i >= 0 for i in vocab) and all(type(t) is bytes for t in vocab.values()):
        return dict(sorted(vocab.items()))  # the common case, checked in bulk
    out: Vocab = {}
    for i in sorted(vocab, key=lambda k: (not isinstance(k, int), k if isinstance(k, int) else 0)):
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"{source}: key {i!r} is a {type(i).__name__}, not an int id")
        if i < 0:
            raise ValueError(f"{source}: id {i} is negative")
        out[i] = _as_bytes(vocab[i], f"{source}[{i}]")
    return out


def check_merges(merges, source: str = "merges") -> Merges:
    """`merges` as a list of (bytes, bytes), or raise naming the bad entry."""
    if isinstance(merges, (str, bytes, dict)) or not isinstance(merges, Sequence):
        raise TypeError(f"{source}: expected a list of (bytes, bytes) pairs, got {type(merges).__name__}")
    if all(type(p) is tuple and len(p) == 2 and type(p[0]) is bytes and type(p[1]) is bytes
           for p in merges):
        return list(merges)  # the common case, checked in bulk
    out: Merges = []
    for k, pair in enumerate(merges):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"{source}[{k}]: expected a (bytes, bytes) pair, got {pair!r:.80}")
        out.append((_as_bytes(pair[0], f"{source}[{k}][0]"), _as_bytes(pair[1], f"{source}[{k}][1]")))
    return out


def load_pickle_files(vocab_path: str | os.PathLike,
                      merges_path: str | os.PathLike) -> tuple[Vocab, Merges]:
    """Read a pickled `dict[int, bytes]` vocab and `list[tuple[bytes, bytes]]` merges.

    Either file may instead hold both, as a `(vocab, merges)` tuple or a dict with keys "vocab"
    and "merges" (other common CS336 layouts); the same path may then be given twice.
    """
    vocab = _unpickle(vocab_path, "vocab")
    vocab = _pick(vocab, "vocab", 0)
    merges = _unpickle(merges_path, "merges")
    merges = _pick(merges, "merges", 1)
    return check_vocab(vocab, os.fspath(vocab_path)), check_merges(merges, os.fspath(merges_path))


def _pick(data, key: str, index: int):
    """The vocab (or merges) from a pickle holding it alone or both together."""
    if isinstance(data, dict) and set(data) == {"vocab", "merges"}:
        return data[key]
    if (isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], dict)
            and isinstance(data[1], list)):
        return data[index]
    return data


def save_pickle_files(vocab: Vocab, merges: Merges, vocab_path: str | os.PathLike,
                      merges_path: str | os.PathLike) -> tuple[str, str]:
    """Write the vocab and merges as two pickles (what CS336 solutions read)."""
    vocab = check_vocab(vocab)
    merges = check_merges(merges)
    _write_bytes_atomically(os.fspath(vocab_path), pickle.dumps(vocab, protocol=4))
    _write_bytes_atomically(os.fspath(merges_path), pickle.dumps(merges, protocol=4))
    return os.fspath(vocab_path), os.fspath(merges_path)


def load_vocab_and_merges(vocab_path: str | os.PathLike,
                          merges_path: str | os.PathLike) -> tuple[Vocab, Merges]:
    """Read (vocab, merges) from GPT-2 style text files or from pickles, whichever they are."""
    _check_file(vocab_path, "vocab")
    _check_file(merges_path, "merges")
    pickled = [_looks_pickled(vocab_path), _looks_pickled(merges_path)]
    if all(pickled):
        return load_pickle_files(vocab_path, merges_path)
    if any(pickled):
        raise ValueError(
            f"one of {os.fspath(vocab_path)!r} and {os.fspath(merges_path)!r} is a pickle and the "
            "other is not; give both as pickles or both as vocab.json + merges.txt"
        )
    return load_gpt2_files(vocab_path, merges_path)


def _looks_pickled(path) -> bool:
    with open(path, "rb") as f:
        return f.read(1) == b"\x80"  # the PROTO opcode every pickle since protocol 2 starts with


# --- Hugging Face tokenizer.json -----------------------------------------------------------


def hf_tokenizer_json(vocab: Vocab, merges: Merges, special_tokens: Sequence[str], pattern: str) -> dict:
    """The `tokenizer.json` content for Hugging Face `tokenizers` (byte-level BPE)."""
    vocab = check_vocab(vocab)
    spelled = {}
    for i, token in vocab.items():
        name = spell(token)
        if name in spelled:
            raise ValueError(f"ids {spelled[name]} and {i} have the same bytes {token!r}; "
                             "tokenizer.json needs one id per token")
        spelled[name] = i
    ids = {token: i for i, token in reversed(list(vocab.items()))}
    added = []
    for text in special_tokens:
        i = ids.get(text.encode("utf-8"))
        if i is None:
            raise ValueError(f"special token {text!r} is not in the vocab")
        added.append({"id": i, "content": text, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    if scanner_family(pattern) == "gpt2":
        # Hugging Face's own GPT-2 split (the same pre-tokens): the form other tools know best,
        # and run fastest (fastokens takes it at about 3.5x the speed of the Split form).
        pre_tokenizer = dict(byte_level, use_regex=True)
    else:
        pre_tokenizer = {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
                 "invert": False},
                byte_level,
            ],
        }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": sorted(added, key=lambda t: t["id"]),
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": dict(byte_level),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": spelled,
            # "a b" lines (spelled tokens never hold a space) load in every tokenizers version
            "merges": [f"{spell(a)} {spell(b)}" for a, b in check_merges(merges)],
        },
    }


def save_hf_tokenizer_json(vocab: Vocab, merges: Merges, special_tokens: Sequence[str], pattern: str,
                           path: str | os.PathLike) -> str:
    """Write `tokenizer.json` for Hugging Face `tokenizers`; return its path."""
    content = hf_tokenizer_json(vocab, merges, special_tokens, pattern)
    write_text_atomically(os.fspath(path), json.dumps(content, ensure_ascii=False, indent=1))
    return os.fspath(path)


def load_hf_tokenizer_json(path: str | os.PathLike) -> tuple[Vocab, Merges, list[str], str | None]:
    """Read (vocab, merges, special tokens, split pattern or None) from a byte-level BPE
    `tokenizer.json` such as `save_hf_tokenizer_json` writes."""
    _check_file(path, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        try:
            content = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{os.fspath(path)}: not JSON ({exc})") from None
    source = os.fspath(path)
    model = content.get("model") if isinstance(content, dict) else None
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE" or "vocab" not in model:
        raise ValueError(f"{source}: not a BPE tokenizer.json (no BPE model with a vocab)")
    vocab: Vocab = {}
    for text, i in model["vocab"].items():
        vocab[int(i)] = unspell(text, source=source)
    merges: Merges = []
    for k, merge in enumerate(model.get("merges", [])):
        parts = merge.split(" ") if isinstance(merge, str) else list(merge)
        if len(parts) != 2:
            raise ValueError(f"{source}: merge {k} is {merge!r}, not two tokens")
        merges.append((unspell(parts[0], source=source), unspell(parts[1], source=source)))
    specials = [t["content"] for t in content.get("added_tokens", []) if t.get("special")]
    for t in content.get("added_tokens", []):
        vocab.setdefault(int(t["id"]), t["content"].encode("utf-8"))
    pattern = None
    pre = content.get("pre_tokenizer") or {}
    for step in pre.get("pretokenizers", [pre]):
        if step.get("type") == "Split" and "Regex" in step.get("pattern", {}):
            pattern = step["pattern"]["Regex"]
        elif step.get("type") == "ByteLevel" and step.get("use_regex", True) and pattern is None:
            pattern = GPT2_PATTERN  # Hugging Face's built-in split is GPT-2's
    return dict(sorted(vocab.items())), merges, specials, pattern


# --- tiktoken ------------------------------------------------------------------------------


def tiktoken_ranks(vocab: Vocab, special_tokens: Sequence[str] = ()) -> dict[bytes, int]:
    """tiktoken's `mergeable_ranks`: every non-special token's bytes -> its id as its rank.

    tiktoken merges by the rank of the joined token, so this gives the same ids as merging by
    pair rank when ids grow with merge order (true of GPT-2's files and of `train_bpe` output).
    """
    specials = {t.encode("utf-8") for t in special_tokens}
    ranks: dict[bytes, int] = {}
    for i, token in check_vocab(vocab).items():
        if token in specials:
            continue
        if token in ranks:
            raise ValueError(f"ids {ranks[token]} and {i} have the same bytes {token!r}; "
                             "tiktoken ranks need one id per token")
        ranks[token] = i
    return ranks


def merges_from_ranks(ranks: dict[bytes, int]) -> Merges:
    """The merges a rank file implies, in rank order: for each token of two or more bytes, the
    two parts tiktoken's merging of its bytes arrives at using only lower ranks (as tiktoken's
    own converters recover GPT-2 merges). Pure Python: for exporting, not for encoding."""
    merges: Merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best = None
            for k in range(len(parts) - 1):
                r = ranks.get(parts[k] + parts[k + 1])
                if r is not None and r < rank and (best is None or r < best[0]):
                    best = (r, k)
            if best is None:
                break
            k = best[1]
            parts[k : k + 2] = [parts[k] + parts[k + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def save_tiktoken_ranks(vocab: Vocab, special_tokens: Sequence[str], path: str | os.PathLike) -> str:
    """Write the `.tiktoken` file `tiktoken.load.load_tiktoken_bpe` reads; return its path."""
    ranks = tiktoken_ranks(vocab, special_tokens)
    lines = [f"{base64.b64encode(token).decode('ascii')} {i}"
             for token, i in sorted(ranks.items(), key=lambda item: item[1])]
    write_text_atomically(os.fspath(path), "\n".join(lines) + "\n")
    return os.fspath(path)


def load_tiktoken_file(path: str | os.PathLike) -> dict[bytes, int]:
    """Read a `.tiktoken` rank file: one "base64(token) rank" line per token."""
    _check_file(path, "tiktoken ranks")
    source = os.fspath(path)
    with open(path, "rb") as f:
        lines = f.read().splitlines()
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError("expected two fields")
            token = base64.b64decode(parts[0], validate=True)
            rank = int(parts[1])
        except ValueError as exc:  # binascii.Error is a ValueError
            raise ValueError(f"{source}:{number}: not a 'base64-token rank' line ({exc}): "
                             f"{line[:80]!r}") from None
        if rank < 0:
            raise ValueError(f"{source}:{number}: negative rank {rank}")
        if token in ranks:
            raise ValueError(f"{source}:{number}: token {token!r} is listed twice")
        ranks[token] = rank
    if not ranks:
        raise ValueError(f"{source}: no tokens")
    return ranks


def _write_bytes_atomically(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
