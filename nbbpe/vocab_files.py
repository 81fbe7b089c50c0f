"""Vocab files: saving and loading (vocab, merges).

The readable format is GPT-2's: `vocab.json` maps each token, spelled with GPT-2's printable
byte-to-unicode table (space is "Ġ"), to its id, and `merges.txt` lists one merge per line as the
two spelled tokens separated by a space, after a `#version` header line. Every byte string has
a spelling, so any vocab (including bytes that are not valid UTF-8) round-trips exactly.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

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


def unspell(text: str, *, source: str = "vocab file") -> bytes:
    """The bytes a GPT-2 spelling stands for."""
    table = unicode_to_byte()
    try:
        return bytes(table[c] for c in text)
    except KeyError as exc:
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
    _write_atomically(vocab_path, json.dumps(spelled, ensure_ascii=False, indent=1))
    lines = ["#version: 0.2 (nbbpe)"] + [f"{spell(a)} {spell(b)}" for a, b in merges]
    _write_atomically(merges_path, "\n".join(lines) + "\n")
    return vocab_path, merges_path


def load_gpt2_files(vocab_path: str | os.PathLike, merges_path: str | os.PathLike) -> tuple[Vocab, Merges]:
    """Read GPT-2 style `vocab.json` + `merges.txt` (GPT-2's own files included)."""
    with open(vocab_path, encoding="utf-8") as f:
        spelled = json.load(f)
    vocab: Vocab = {}
    for text, i in spelled.items():
        vocab[int(i)] = unspell(text, source=os.fspath(vocab_path))
    merges: Merges = []
    with open(merges_path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line or (number == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise ValueError(f"{os.fspath(merges_path)}:{number}: expected two tokens, got {line!r}")
            merges.append(tuple(unspell(p, source=f"{os.fspath(merges_path)}:{number}") for p in parts))
    return vocab, merges


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
